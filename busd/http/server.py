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

log = logging.getLogger("busd.http")

MAX_HEAD = 64 * 1024
MAX_BODY = 128 * 1024 * 1024  # a message sent through the admin API, as JSON
IDLE_TIMEOUT_S = 120.0  # a kept-alive connection with no request for this long is closed
BODY_TIMEOUT_S = 60.0


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
    asyncio protocol of one connection, plain or already inside TLS; `close()` ends them all."""

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
            await self._serve(reader, writer, scheme)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     scheme: str) -> None:  # fmt: skip
        while True:
            try:
                request = await _read_request(reader, writer, scheme)
            except _BadRequest as exc:
                await _write(writer, Response(exc.status, body=f"{exc}\n".encode()), False)
                return
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError,
                    OSError):  # fmt: skip
                return
            if request is None:
                return
            try:
                response = await self.handler(request)
            except Exception:
                log.exception("%s %s failed", request.method, request.path)
                response = Response(500, body=b"internal error\n")
            keep = request.headers.get("connection", "").lower() != "close"
            try:
                await _write(writer, response, keep, head_only=request.method == "HEAD")
            except (ConnectionError, OSError):
                return
            if not keep:
                return


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        scheme: str) -> Request | None:  # fmt: skip
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None  # the client closed a kept-alive connection
        raise
    except asyncio.LimitOverrunError:
        raise _BadRequest(431, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise _BadRequest(400, "malformed request line") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await asyncio.wait_for(_read_chunked(reader), BODY_TIMEOUT_S)
    else:
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            raise _BadRequest(400, "bad Content-Length") from None
        if not 0 <= length <= MAX_BODY:
            raise _BadRequest(413, "request body too large")
        body = await asyncio.wait_for(reader.readexactly(length), BODY_TIMEOUT_S) if length else b""
    if version.strip().upper() == "HTTP/1.0" and "connection" not in headers:
        headers["connection"] = "close"  # HTTP/1.0 keeps a connection only when it asks to
    path, _, query = target.partition("?")
    return Request(method.upper(), target, path, query, headers, body, scheme)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadRequest(400, "bad chunk size") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        total += size
        if total > MAX_BODY:
            raise _BadRequest(413, "request body too large")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def _write(writer: asyncio.StreamWriter, response: Response, keep: bool,
                 head_only: bool = False) -> None:  # fmt: skip
    try:
        phrase = HTTPStatus(response.status).phrase
    except ValueError:
        phrase = "Status"
    head = [f"HTTP/1.1 {response.status} {phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            f"Connection: {'keep-alive' if keep else 'close'}"]
    head += [f"{name}: {value}" for name, value in response.headers.items()]
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    writer.write(data if head_only else data + response.body)
    await writer.drain()
