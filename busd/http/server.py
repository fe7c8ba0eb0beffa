"""HTTP/1.1 with keep-alive, for the connections busd's ports find speaking HTTP (busd.net.ports):
health, metrics, the admin API, the management (ATOM) API and the dashboard, over HTTP or
HTTPS, on every port busd serves AMQP on (docs/management.md §1).

Requests go to `handler(request) -> Response`, once `admit(request)` has seen their head and
said how much body their route takes, and whether its key was checked (or refused them unread);
this module knows nothing of the routes.

A connection costs whoever opens it more than busd: they are capped per process and per peer
address, and a connection not inside an authenticated request (idle between requests, reading
a head, or a request of a route open without a key, such as /health) is closed to make room for
a new one at a cap, the oldest first, so slow clients cannot keep a liveness probe out. Such a
request has one deadline for its head and body together.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

import h11

from busd.net import origins

log = logging.getLogger("busd.http")

MAX_HEAD = 64 * 1024  # a request's line and headers (431)
BODY_LIMIT = 64 * 1024  # a request's body, unless its route takes more (413)
IDLE_TIMEOUT_S = 120.0  # a kept-alive connection with no request for this long is closed
BODY_TIMEOUT_S = 60.0  # an authenticated request's whole body; and writing one response
READ_SIZE = 64 * 1024
# A request refused before its body is read: what the client still sends is taken and dropped
# for this long (or this much), so that closing does not reset the connection before the
# client has read the answer.
LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024
CAP_WARNING_S = 60.0  # the cap of connections reached is logged at most this often


@dataclass(frozen=True)
class HttpLimits:
    """What the clients of one process's HTTP connections may hold (docs/management.md §1)."""

    connections: int = 256  # open at once; 0: no cap
    # from a request's first byte to the end of its head; of an unauthenticated request (a
    # route open without a key), to the end of its body
    request_timeout_s: float = 5.0
    per_address: int = 64  # open at once from one peer address; 0: no cap


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


@dataclass(frozen=True)
class Open:
    """A request admitted without a key (its route takes none: health, metrics, the
    dashboard's pages and login): it must arrive whole, body included, within the request
    timeout, and its connection stays one a cap may close for a newer one."""

    body_limit: int  # 0: the route takes no body, and one announced is refused unread


Handler = Callable[[Request], Awaitable[Response]]
# What a request may send, decided from its head alone (its route and its key, before any of
# its body is read): the most bytes of body its route takes once its key was checked, the same
# for a route open without a key (`Open`), or the answer that refuses it.
Admit = Callable[[Request], Awaitable[Response | int | Open]]


async def _any_body(request: Request) -> Response | int | Open:
    return Open(BODY_LIMIT)


class HttpService:
    """HTTP/1.1 on the connections busd's ports hand over (busd.net.ports): `protocol()` makes the
    asyncio protocol of one connection, plain or already inside TLS; `close()` ends them all.

    The bytes the port read to tell the protocol apart reach the stream reader first, so h11
    parses the request from its first byte. A request's head is read whole (within
    `limits.request_timeout_s`) and checked (its Host: busd.net.origins; its route and key:
    `admit`) before any of its body is read, and then only as much body as its route takes:
    within what is left of that same time for a route open without a key (`Open`), within
    BODY_TIMEOUT_S once its key was checked."""

    def __init__(
        self,
        handler: Handler,
        admit: Admit = _any_body,
        limits: HttpLimits = HttpLimits(),
        metrics: Any = None,  # busd.observability.metrics.Metrics, or None
    ) -> None:
        self.handler = handler
        self.admit = admit
        self.limits = limits
        self.metrics = metrics
        # open connections, oldest first, all and by peer address: a new one past a cap takes
        # the place of an unauthenticated one
        self._open: dict[_Connection, None] = {}
        self._by_address: dict[str, dict[_Connection, None]] = {}
        self._warned_at = -CAP_WARNING_S

    def protocol(self, address: str = "") -> asyncio.Protocol:
        """The protocol of a new connection from the peer `address`: served, or answered 503
        when a cap is reached and every connection it could close is inside an authenticated
        request."""
        limits = self.limits
        mine = self._by_address.get(address, {})
        if limits.per_address and len(mine) >= limits.per_address:
            if not self._evict([mine], "address"):
                return self._busy(f"{limits.per_address} HTTP connections open from {address}")
        elif limits.connections and len(self._open) >= limits.connections:
            # of the address holding the most first: one client's flood evicts its own
            crowded = sorted(self._by_address.values(), key=len, reverse=True)
            if not self._evict(crowded, "process"):
                return self._busy(f"{limits.connections} HTTP connections open")
        connection = _Connection(address)
        self._open[connection] = None
        self._by_address.setdefault(address, {})[connection] = None
        return asyncio.StreamReaderProtocol(
            asyncio.StreamReader(limit=MAX_HEAD),
            lambda reader, writer: self._connection(connection, reader, writer),
        )

    def _evict(self, groups: list[dict[_Connection, None]], limit: str) -> bool:
        """Close the oldest connection of the first group that has one not inside an
        authenticated request (idle, reading a head, or an open route's request)."""
        for group in groups:
            for connection in group:
                if connection.evictable():
                    self._forget(connection)
                    connection.close()
                    if self.metrics is not None:
                        self.metrics.http_evicted(limit)
                    return True
        return False

    def _forget(self, connection: _Connection) -> None:
        self._open.pop(connection, None)
        mine = self._by_address.get(connection.address)
        if mine is not None:
            mine.pop(connection, None)
            if not mine:
                del self._by_address[connection.address]

    def _busy(self, why: str) -> asyncio.Protocol:
        if self.metrics is not None:
            self.metrics.http_refused_busy()
        now = time.monotonic()
        if now - self._warned_at >= CAP_WARNING_S:
            self._warned_at = now
            log.warning("%s, the cap, all busy: new ones are answered 503", why)
        return _Busy()

    async def close(self) -> None:
        tasks = [c.task for c in self._open if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connection(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        connection.task = asyncio.current_task()
        connection.exchange = exchange = _Exchange(reader, writer, self.limits)
        scheme = "https" if writer.get_extra_info("sslcontext") is not None else "http"
        try:
            await self._serve(exchange, scheme)
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._forget(connection)
            writer.close()

    async def _serve(self, exchange: _Exchange, scheme: str) -> None:
        while True:
            try:
                request = await exchange.read_head(scheme)
                if request is None:
                    return
                decision = await self._admit(request)
                if isinstance(decision, Open) and exchange.body_expected(request):
                    if not decision.body_limit:  # a GET-only route: refused from the head
                        raise _BadRequest(413, "this route takes no request body")
                if isinstance(decision, Response) and exchange.body_expected(request):
                    await exchange.refuse(decision)  # its body is never read
                    return
                if isinstance(decision, int):
                    exchange.authenticated = True  # not closed for a newer connection
                    await exchange.read_body(request, decision, BODY_TIMEOUT_S)
                elif isinstance(decision, Open):
                    await exchange.read_body(request, decision.body_limit, exchange.time_left())
                else:
                    await exchange.read_body(request, 0, exchange.time_left())
            except _BadRequest as exc:
                await exchange.refuse(Response(exc.status, body=f"{exc}\n".encode()))
                return
            if isinstance(decision, Response):
                response = decision
            else:
                try:
                    response = await self.handler(request)
                except Exception:
                    log.exception("%s %s failed", request.method, request.path)
                    response = Response(500, body=b"internal error\n")
            await exchange.write(response, head_only=request.method == "HEAD")
            if not exchange.next_request():
                return

    async def _admit(self, request: Request) -> Response | int | Open:
        refusal = origins.policy().host_refusal(request.headers.get("host"))
        if refusal is not None:
            return Response(421, body=refusal.encode())
        try:
            return await self.admit(request)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return Response(500, body=b"internal error\n")


class _Connection:
    """One HTTP connection of an HttpService, for its caps."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.task: asyncio.Task | None = None
        self.exchange: _Exchange | None = None

    def evictable(self) -> bool:
        """Whether a cap may close it for a newer connection: not inside an authenticated
        request (a client whose key was checked keeps its connection to the end of it)."""
        return self.exchange is not None and not self.exchange.authenticated

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()


class _Busy(asyncio.Protocol):
    """A connection past the cap of HTTP connections, when none is idle: answered 503."""

    ANSWER = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 41\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        b"too many HTTP connections: try it again\n\n"
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.ANSWER)  # type: ignore[attr-defined]
        transport.close()


_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Exchange:
    """One connection's requests and responses, parsed and framed by h11: keep-alive (HTTP/1.1;
    an HTTP/1.0 request gets its answer and the connection closed), pipelining, chunked bodies,
    within busd's bounds: a head of 64 KiB (431) that arrives within the request timeout, a
    body no larger than its route takes (413), anything else h11 refuses (400)
    (docs/management.md §1)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: HttpLimits
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._limits = limits
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.authenticated = False  # inside a request whose key was checked
        self._deadline = 0.0  # the current request's, from its first byte (request timeout)

    async def read_head(self, scheme: str) -> Request | None:
        """The next request, its head only (body empty); None when the client closed between
        requests."""
        async with asyncio.timeout(IDLE_TIMEOUT_S):
            await self._some_bytes()
        self._deadline = time.monotonic() + self._limits.request_timeout_s
        try:
            async with asyncio.timeout(self.time_left()):
                head = await self._next_event()
        except TimeoutError:  # slow headers hold a connection: no more than this
            self._writer.write(_TIMED_OUT)
            raise
        if isinstance(head, h11.ConnectionClosed):
            return None
        assert isinstance(head, h11.Request)
        # h11 stops a head still incomplete past MAX_HEAD; one that arrived whole is measured here
        if _head_size(head) > MAX_HEAD:
            raise _BadRequest(431, "request head too large")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        method = head.method.decode("latin-1").upper()
        return Request(method, target, path, query, headers, b"", scheme)

    def time_left(self) -> float:
        """Seconds left of the current request's deadline."""
        return max(0.0, self._deadline - time.monotonic())

    def body_expected(self, request: Request) -> bool:
        """Whether the request's head announces a body (h11 checked its framing headers)."""
        length = request.headers.get("content-length")
        return "transfer-encoding" in request.headers or bool(length and int(length))

    async def read_body(self, request: Request, limit: int, timeout: float) -> None:
        """Read the request's body into it: at most `limit` bytes, else 413 (a length said up
        front is refused before any of the body is read), within `timeout` seconds."""
        if int(request.headers.get("content-length") or 0) > limit:  # h11 checked the number
            raise _BadRequest(413, f"request body too large: this route takes {limit} bytes")
        if self._h11.client_is_waiting_for_100_continue:
            proceed = h11.InformationalResponse(status_code=100, headers=[])
            self._writer.write(self._h11.send(proceed) or b"")
        parts: list[bytes] = []
        total = 0
        try:
            async with asyncio.timeout(timeout):
                while not isinstance(event := await self._next_event(), h11.EndOfMessage):
                    if isinstance(event, h11.ConnectionClosed):
                        raise ConnectionResetError("closed inside a request")
                    if isinstance(event, h11.Data):
                        total += len(event.data)
                        if total > limit:  # chunked: no length said up front
                            raise _BadRequest(
                                413, f"request body too large: this route takes {limit} bytes"
                            )
                        parts.append(bytes(event.data))
        except TimeoutError:  # a trickled body holds a connection: no more than this
            self._writer.write(_TIMED_OUT)
            raise
        request.body = b"".join(parts)

    async def refuse(self, response: Response) -> None:
        """Answer and close, without reading what is left of the request."""
        await self.write(response, close=True)
        if self._writer.can_write_eof():
            self._writer.write_eof()
        dropped = 0
        try:
            async with asyncio.timeout(LINGER_S):
                while dropped < LINGER_BYTES and (data := await self._reader.read(READ_SIZE)):
                    dropped += len(data)
        except TimeoutError:
            pass

    def close(self) -> None:
        self._writer.close()

    async def _some_bytes(self) -> None:
        """Return once some of the next request (or the end of the stream) has arrived."""
        data, closed = self._h11.trailing_data
        if not data and not closed:
            self._h11.receive_data(await self._reader.read(READ_SIZE))

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
        async with asyncio.timeout(BODY_TIMEOUT_S):  # a client that reads nothing
            await self._writer.drain()

    def next_request(self) -> bool:
        """Whether the connection goes on to another request (h11 says when it may not)."""
        self.authenticated = False
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
