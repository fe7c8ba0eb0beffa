"""busd's ports: AMQP and HTTP on each, told apart by a connection's first bytes.

The SDKs take one connection string for both clients: `ServiceBusClient` speaks AMQP to the
Endpoint's host and port, and `ServiceBusAdministrationClient` speaks HTTPS (Python,
JavaScript) or, to an emulator, plain HTTP (.NET) to the same host and port
(docs/management.md §1). So the AMQP port (`--port`, 5672), the HTTP port (`--http-port`, 5300)
and the TLS port (`--tls-port`, 5671) all serve both protocols:

    0x16            a TLS ClientHello: the handshake, then the decrypted bytes are told apart
                    the same way (the TLS port takes nothing but TLS)
    `A`             the AMQP protocol header (`AMQP` + protocol id): the AMQP front
    a token byte    an HTTP request line, which starts with a method token (GET, PUT, ...)
    anything else   neither: the AMQP front, which answers garbage with its protocol header
                    and a framing error before closing (docs/management.md §1)

Each connection is told apart once, then handed over whole: the transport talks to the
chosen protocol directly, which sees every byte from the first, so an AMQP connection's
per-message path has no step of this module in it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from busd.net.listener import TLS_RECORD, Admission, Pending, SniffingListener, bind

log = logging.getLogger("busd.amqp")

AMQP_HEADER = ord("A")  # b"AMQP" then the protocol id (0: AMQP, 3: SASL)
# the bytes an HTTP method may start with: RFC 9110's `tchar`
HTTP_METHOD_START = frozenset(
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)
# An HTTP connection's protocol, given its peer's address (busd.http.server caps them by it).
ProtocolFactory = Callable[[str], asyncio.Protocol]
# An AMQP connection's protocol, given its admission (busd.net.listener.Pending) to release once
# it authenticates or goes, and to tell when its `open` came.
AmqpFactory = Callable[[Pending | None], asyncio.Protocol]


@dataclass(frozen=True)
class Services:
    """What a port hands its connections to."""

    amqp: AmqpFactory
    http: ProtocolFactory
    tls: ssl.SSLContext | None  # None: TLS connections are refused

    def protocol_for(self, first: int, pending: Pending) -> asyncio.Protocol:
        """The protocol of a connection (inside TLS, if any) whose first byte is `first`; an
        HTTP connection leaves the unauthenticated count (its requests carry their keys)."""
        if first == AMQP_HEADER or first not in HTTP_METHOD_START:
            return self.amqp(pending)
        pending.release()
        return self.http(pending.address)


class ServicePort(SniffingListener):
    """One listening socket serving AMQP and HTTP, plain and over TLS (`plain=False`: over TLS
    only, as the TLS port)."""

    def __init__(
        self,
        sock: socket.socket,
        services: Services,
        name: str,
        plain: bool = True,
        admission: Admission | None = None,
    ) -> None:
        self.services = services
        self.plain = plain
        self._undecided: set[_FirstBytes] = set()  # TLS done, no byte yet
        super().__init__(sock, log, name, admission)

    async def serve(self, conn: socket.socket, first: int, pending: Pending) -> None:
        tls = self.services.tls if first == TLS_RECORD else None
        if (first == TLS_RECORD and tls is None) or (tls is None and not self.plain):
            conn.close()  # e.g. plain AMQP on the TLS port: nothing to answer it in
            pending.release()
            return
        await self.hand_over(conn, lambda: _FirstBytes(self, pending), tls, pending)

    def _closing(self) -> None:
        for waiting in list(self._undecided):
            waiting.close()


class _FirstBytes(asyncio.Protocol):
    """A connection until its first bytes arrive (decrypted, over TLS): then its transport is
    handed to the protocol they name, which gets those bytes and everything after them."""

    def __init__(self, port: ServicePort, pending: Pending) -> None:
        self._port = port
        self._pending = pending  # its deadline closes the transport (busd.net.listener)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._port._undecided.add(self)
        self._pending.attach(transport)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        self._decided()
        if transport is None or not data:
            return
        protocol = self._port.services.protocol_for(data[0], self._pending)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(data)

    def eof_received(self) -> bool:
        return False  # closed before saying anything

    def connection_lost(self, exc: Exception | None) -> None:
        self._decided()
        self._pending.release()

    def close(self) -> None:
        transport = self._transport
        self._decided()
        if transport is not None:
            transport.close()

    def _decided(self) -> None:
        self._transport = None
        self._port._undecided.discard(self)


def listen(
    host: str,
    port: int,
    services: Services,
    name: str,
    plain: bool = True,
    sock: socket.socket | None = None,
    admission: Admission | None = None,
) -> ServicePort:
    """Listen on host:port (0: any free port), or on `sock`, already listening there;
    `admission`: the process's unauthenticated connections, shared by all its ports."""
    return ServicePort(sock or bind(host, port), services, name, plain, admission)
