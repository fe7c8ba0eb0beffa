"""HTTP/1.1 with keep-alive, for the connections busd's ports find speaking HTTP (busd.ports):
health, metrics, the admin API, the management (ATOM) API and the dashboard, over HTTP or
HTTPS, on every port busd serves AMQP on (docs/management.md §1).

Requests go to `handler(request) -> Response`; this module knows nothing of the routes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs

import h11

log = logging.getLogger("busd.http")

MAX_HEAD = 64 * 1024
MAX_BODY = 128 * 1024 * 1024  # a message sent through the admin API, as JSON
IDLE_TIMEOUT_S = 120.0  # a kept-alive connection with no request for this long is closed
BODY_TIMEOUT_S = 60.0
READ_SIZE = 64 * 1024


@dataclass
class Request:
    method: str
    target: str  # as sent: path and query
    path: str
    query: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    scheme: str  # http or https

    @property
    def params(self) -> dict[str, list[str]]:
        return parse_qs(self.query, keep_blank_values=True)

    @property
    def host(self) -> str:
        return self.headers.get("host", "localhost")

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"


@dataclass
class Response:
    status: int
    content_type: str = "text/plain; charset=utf-8"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class HttpService:
    """HTTP/1.1 on the connections busd's ports hand over (busd.ports): `protocol()` makes the
    asyncio protocol of one connection, plain or already inside TLS; `close()` ends them all.

    The bytes the port read to tell the protocol apart reach the stream reader first, so h11
    parses the request from its first byte."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._connections: set[asyncio.Task] = set()

    def protocol(self) -> asyncio.Protocol:
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=MAX_HEAD), self._connection)

    async def close(self) -> None:
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        scheme = "https" if writer.get_extra_info("sslcontext") is not None else "http"
        try:
            await self._serve(_Exchange(reader, writer), scheme)
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, exchange: _Exchange, scheme: str) -> None:
        while True:
            try:
                request = await exchange.read_request(scheme)
            except _BadRequest as exc:
                await exchange.write(Response(exc.status, body=f"{exc}\n".encode()), close=True)
                return
            if request is None:
                return
            try:
                response = await self.handler(request)
            except Exception:
                log.exception("%s %s failed", request.method, request.path)
                response = Response(500, body=b"internal error\n")
            await exchange.write(response, head_only=request.method == "HEAD")
            if not exchange.next_request():
                return


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Exchange:
    """One connection's requests and responses, parsed and framed by h11: keep-alive (HTTP/1.1;
    an HTTP/1.0 request gets its answer and the connection closed), pipelining, chunked bodies,
    within busd's bounds: a head of 64 KiB (431), a body of 128 MiB (413), anything else h11
    refuses (400) (docs/management.md §1)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)

    async def read_request(self, scheme: str) -> Request | None:
        """The next request, body and all; None when the client closed between requests."""
        async with asyncio.timeout(IDLE_TIMEOUT_S):
            head = await self._next_event()
        if isinstance(head, h11.ConnectionClosed):
            return None
        assert isinstance(head, h11.Request)
        # h11 stops a head still incomplete past MAX_HEAD; one that arrived whole is measured here
        if _head_size(head) > MAX_HEAD:
            raise _BadRequest(431, "request head too large")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
        if int(headers.get("content-length") or 0) > MAX_BODY:  # h11 checked it is a number
            raise _BadRequest(413, "request body too large")
        if self._h11.client_is_waiting_for_100_continue:
            proceed = h11.InformationalResponse(status_code=100, headers=[])
            self._writer.write(self._h11.send(proceed) or b"")
        parts: list[bytes] = []
        total = 0
        async with asyncio.timeout(BODY_TIMEOUT_S):
            while not isinstance(event := await self._next_event(), h11.EndOfMessage):
                if isinstance(event, h11.ConnectionClosed):
                    raise ConnectionResetError("closed inside a request")
                if isinstance(event, h11.Data):
                    total += len(event.data)
                    if total > MAX_BODY:  # chunked: no length said up front
                        raise _BadRequest(413, "request body too large")
                    parts.append(bytes(event.data))
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        return Request(
            head.method.decode("latin-1").upper(),
            target,
            path,
            query,
            headers,
            b"".join(parts),
            scheme,
        )

    async def _next_event(self) -> h11.Event:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise _BadRequest(exc.error_status_hint, _refusal(exc)) from None
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            self._h11.receive_data(await self._reader.read(READ_SIZE))

    async def write(
        self, response: Response, *, head_only: bool = False, close: bool = False
    ) -> None:
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = "Status"
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
        ]
        headers += list(response.headers.items())
        if close:
            headers.append(("Connection", "close"))
        send = self._h11.send
        data = (
            send(
                h11.Response(
                    status_code=response.status, headers=headers, reason=phrase.encode("latin-1")
                )
            )
            or b""
        )
        if response.body and not head_only:
            data += send(h11.Data(data=response.body)) or b""
        data += send(h11.EndOfMessage()) or b""
        self._writer.write(data)
        await self._writer.drain()

    def next_request(self) -> bool:
        """Whether the connection goes on to another request (h11 says when it may not)."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            return True
        return False


def _head_size(head: h11.Request) -> int:
    """The size of a request's head as sent, give or take optional whitespace."""
    line = len(head.method) + len(head.target) + len(head.http_version) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in head.headers) + 2


def _refusal(exc: h11.RemoteProtocolError) -> str:
    if exc.error_status_hint == 431:
        return "request head too large"
    return f"malformed request: {exc}"
