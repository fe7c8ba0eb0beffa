"""AMQP over WebSockets [AMQP WebSocket binding 1.0]: ws and wss on one port (`--ws-port`).

Service Bus serves AMQP at `wss://<namespace>:443/$servicebus/websocket` with the subprotocol
`AMQPWSB10`, or `amqp` (the binding's registered name, which the Go SDK's dialer asks for); the
SDKs connect there with `TransportType.AmqpOverWebsocket` (through a custom
endpoint to reach another host or port, docs/wire.md §1.1). Each accepted connection is
sniffed: a first byte 0x16 is a TLS ClientHello (wss), anything else plain HTTP (ws). The
WebSocket protocol itself is the `websockets` library's (sans-I/O); the binary messages carry
the AMQP byte stream, fed to the same `AmqpProtocol` as a TCP connection's, which writes back
through `_Frames`, a transport that wraps its bytes in binary messages.

A connection's handshake deadline (busd.net.listener) runs from its accept through the TLS
handshake and the upgrade to the AMQP `open` inside; past it the socket is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from busd.net.listener import CLOSE_GRACE_S, TLS_RECORD, Admission, Pending, SniffingListener, bind
from busd.net.origins import websocket_refusal

log = logging.getLogger("busd.amqp")

PATH = "/$servicebus/websocket"
SUBPROTOCOL = Subprotocol("AMQPWSB10")
# the one the client asks for is answered; AMQPWSB10 first when it offers both
SUBPROTOCOLS = (SUBPROTOCOL, Subprotocol("amqp"))
MAX_MESSAGE = 1024 * 1024  # one WebSocket message; the SDKs send a frame or less per message
_STREAM = (Opcode.BINARY, Opcode.CONT)
# The AMQP connection inside, given its admission (busd.net.listener.Pending).
AmqpFactory = Callable[[Pending | None], asyncio.Protocol]


class WebSocketAmqp(asyncio.Protocol):
    """One WebSocket connection: the opening handshake, then its binary messages as the AMQP
    byte stream of an AmqpProtocol made by `amqp_factory`."""

    def __init__(self, amqp_factory: AmqpFactory, pending: Pending | None = None) -> None:
        self._amqp_factory = amqp_factory
        self._pending = pending  # released by the AMQP connection inside, or when this goes
        self.ws = ServerProtocol(subprotocols=list(SUBPROTOCOLS), max_size=MAX_MESSAGE)
        self.amqp: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self._pending is not None:
            self._pending.attach(transport)  # its deadline closes the socket

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif isinstance(event, Frame) and event.opcode in _STREAM and self.amqp is not None:
                self.amqp.data_received(bytes(event.data))
        self.flush()

    def _handshake(self, request: Request) -> None:
        # origin-form, or absolute-form (`GET https://host/$servicebus/websocket`, as the
        # Java SDK asks; RFC 9112 §3.2.2: a server takes both)
        path = urlsplit(request.path).path.replace("%24", "$").rstrip("/")
        if path != PATH:
            response = self.ws.reject(404, f"AMQP over WebSockets is served at {PATH}\n")
        elif refusal := websocket_refusal(request.headers.get("Origin"), self.transport):
            response = self.ws.reject(403, refusal)  # a page of another site (busd.net.origins)
        else:
            response = self.ws.accept(request)
            if (
                response.status_code == 101
                and response.headers.get("Sec-WebSocket-Protocol") not in SUBPROTOCOLS
            ):
                response = self.ws.reject(
                    400, f"the subprotocol must be {' or '.join(SUBPROTOCOLS)}\n"
                )
        self.ws.send_response(response)
        if self.ws.state is State.OPEN:
            self.amqp = self._amqp_factory(self._pending)
            self.amqp.connection_made(_Frames(self))  # type: ignore[arg-type]  # duck-typed

    def flush(self) -> None:
        if self.transport is None:
            return
        for data in self.ws.data_to_send():
            if data:
                self.transport.write(data)
            else:  # the end of the stream: the WebSocket is closed
                self.transport.close()
                return
        if self.ws.close_expected() and self.ws.state is State.CLOSED:
            self.transport.close()

    def eof_received(self) -> bool:
        self.ws.receive_eof()
        self.flush()
        if self.amqp is not None:
            self.amqp.eof_received()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        amqp, self.amqp = self.amqp, None
        if amqp is not None:
            amqp.connection_lost(exc)
        if self._pending is not None:
            self._pending.release()


class _Frames:
    """The transport an AmqpProtocol writes to: each write one binary WebSocket message."""

    def __init__(self, owner: WebSocketAmqp) -> None:
        self._owner = owner
        self._closing = False

    def write(self, data: bytes) -> None:
        if not self._closing and self._owner.ws.state is State.OPEN:
            self._owner.ws.send_binary(data)
            self._owner.flush()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._owner.ws.state is State.OPEN:
            self._owner.ws.send_close(1000)
        self._owner.flush()
        if self._owner.transport is not None:
            # the peer's close frame may never come, nor its reads: cut it off after a grace
            transport = self._owner.transport
            asyncio.get_running_loop().call_later(CLOSE_GRACE_S, transport.abort)

    def abort(self) -> None:
        self._closing = True
        if self._owner.transport is not None:
            self._owner.transport.abort()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        transport = self._owner.transport
        return transport.get_extra_info(name, default) if transport is not None else default


class WebSocketServer(SniffingListener):
    """The `--ws-port` listener: ws, and wss given a TLS context."""

    def __init__(
        self,
        sock: socket.socket,
        tls: ssl.SSLContext | None,
        amqp_factory: AmqpFactory,
        admission: Admission | None = None,
    ) -> None:
        self.tls = tls
        self.amqp_factory = amqp_factory
        super().__init__(sock, log, "websocket", admission)

    async def serve(self, conn: socket.socket, first: int, pending: Pending) -> None:
        tls = self.tls if first == TLS_RECORD else None
        if first == TLS_RECORD and tls is None:
            conn.close()
            pending.release()
            return
        await self.hand_over(conn, lambda: WebSocketAmqp(self.amqp_factory, pending), tls, pending)


async def start(
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    amqp_factory: AmqpFactory,
    sock: socket.socket | None = None,
    admission: Admission | None = None,
) -> WebSocketServer:
    """Listen on host:port (0: any free port), or on `sock`, already listening there, for ws
    and, given `tls`, wss; `admission`: the process's unauthenticated connections."""
    return WebSocketServer(sock or bind(host, port), tls, amqp_factory, admission)
