"""AMQP over WebSockets [AMQP WebSocket binding 1.0]: ws and wss on one port (`--ws-port`).

Service Bus serves AMQP at `wss://<namespace>:443/$servicebus/websocket` with the subprotocol
`AMQPWSB10`; the SDKs connect there with `TransportType.AmqpOverWebsocket` (through a custom
endpoint to reach another host or port, docs/wire.md §1.1). Each accepted connection is
sniffed: a first byte 0x16 is a TLS ClientHello (wss), anything else plain HTTP (ws). The
WebSocket protocol itself is the `websockets` library's (sans-I/O); the binary messages carry
the AMQP byte stream, fed to the same `AmqpProtocol` as a TCP connection's, which writes back
through `_Frames`, a transport that wraps its bytes in binary messages.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from busd.host_certificates import prepare as prepare_tls
from busd.listener import TLS_RECORD, SniffingListener, bind
from busd.origins import websocket_refusal

log = logging.getLogger("busd.amqp")

PATH = "/$servicebus/websocket"
SUBPROTOCOL = Subprotocol("AMQPWSB10")
HANDSHAKE_TIMEOUT_S = 10.0
MAX_MESSAGE = 1024 * 1024  # one WebSocket message; the SDKs send a frame or less per message
_STREAM = (Opcode.BINARY, Opcode.CONT)


class WebSocketAmqp(asyncio.Protocol):
    """One WebSocket connection: the opening handshake, then its binary messages as the AMQP
    byte stream of an AmqpProtocol made by `amqp_factory`."""

    def __init__(self, amqp_factory: Callable[[], asyncio.Protocol]) -> None:
        self._amqp_factory = amqp_factory
        self.ws = ServerProtocol(subprotocols=[SUBPROTOCOL], max_size=MAX_MESSAGE)
        self.amqp: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif isinstance(event, Frame) and event.opcode in _STREAM and self.amqp is not None:
                self.amqp.data_received(bytes(event.data))
        self.flush()

    def _handshake(self, request: Request) -> None:
        path = request.path.split("?", 1)[0].replace("%24", "$").rstrip("/")
        if path != PATH:
            response = self.ws.reject(404, f"AMQP over WebSockets is served at {PATH}\n")
        elif refusal := websocket_refusal(request.headers.get("Origin"), self.transport):
            response = self.ws.reject(403, refusal)  # a page of another site (busd.origins)
        else:
            response = self.ws.accept(request)
            if (
                response.status_code == 101
                and response.headers.get("Sec-WebSocket-Protocol") != SUBPROTOCOL
            ):
                response = self.ws.reject(400, f"the subprotocol must be {SUBPROTOCOL}\n")
        self.ws.send_response(response)
        if self.ws.state is State.OPEN:
            self.amqp = self._amqp_factory()
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
            # the peer's close frame may never come: give it the handshake timeout
            transport = self._owner.transport
            asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, transport.close)

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
        amqp_factory: Callable[[], asyncio.Protocol],
    ) -> None:
        self.tls = tls
        self.amqp_factory = amqp_factory
        super().__init__(sock, log, "websocket")

    async def serve(self, conn: socket.socket, first: int) -> None:
        tls = self.tls if first == TLS_RECORD else None
        if first == TLS_RECORD and tls is None:
            conn.close()
            return
        if tls is not None:
            await prepare_tls(conn, tls)  # a new namespace host's certificate, off the loop
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: WebSocketAmqp(self.amqp_factory),
                conn,
                ssl=tls,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls else None,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("websocket connection dropped before its handshake: %s", exc)
            conn.close()


async def start(
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    amqp_factory: Callable[[], asyncio.Protocol],
    sock: socket.socket | None = None,
) -> WebSocketServer:
    """Listen on host:port (0: any free port), or on `sock`, already listening there, for ws
    and, given `tls`, wss."""
    return WebSocketServer(sock or bind(host, port), tls, amqp_factory)
