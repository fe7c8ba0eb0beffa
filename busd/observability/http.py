"""A tiny HTTP endpoint on `--http-port`: `GET /health`, `GET /metrics` (Prometheus text) and
the admin API under `/admin/` (busd.observability.admin).

Plain asyncio streams, one request per connection: a handful of routes for tools and
scrapers do not justify a web framework.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus

from busd.auth.sas import SasError, verify_sas_token

log = logging.getLogger("busd.http")

# Largest request body accepted (a message sent through the admin API, as JSON).
MAX_BODY = 128 * 1024 * 1024


class HttpServer:
    def __init__(self, server, listener: asyncio.base_events.Server) -> None:
        self.server = server
        self.listener = listener

    @property
    def port(self) -> int:
        return self.listener.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.listener.close()


async def start_http(server, host: str, port: int) -> HttpServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = request_head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            if not 0 <= length <= MAX_BODY:
                status, ctype, body = _json(413, {"error": "request body too large"})
            else:
                data = await asyncio.wait_for(reader.readexactly(length), 60) if length else b""
                path, _, query = target.partition("?")
                status, ctype, body = await route(server, method, path, query, data,
                                                  headers.get("authorization", ""))
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                ConnectionError):
            writer.close()
            return
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        try:
            await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    listener = await asyncio.start_server(handle, host, port)
    return HttpServer(server, listener)


def _status(code: int) -> str:
    return f"{code} {HTTPStatus(code).phrase}"


def _json(code: int, document) -> tuple[str, str, bytes]:
    return _status(code), "application/json", json.dumps(document).encode()


async def route(
    server, method: str, path: str, query: str = "", body: bytes = b"", authorization: str = ""
) -> tuple[str, str, bytes]:
    broker = server.broker
    if path.startswith("/admin/"):
        from busd.observability.admin import route_admin

        # The admin API can purge queues: it takes a SAS token signed with one of the
        # broker's keys, like an AMQP client's put-token. Health and metrics stay open.
        try:
            verify_sas_token(authorization, broker.sas_keys)
        except SasError as exc:
            return _json(401, {"error": f"admin requests need a valid SAS token: {exc}"})
        return _json(*await route_admin(broker, method, path, query, body))
    if method != "GET":
        return _status(405), "text/plain", b"only GET\n"
    if path == "/health":
        try:
            store_ok = await asyncio.wait_for(broker.store.ping(), 2)
        except Exception:
            store_ok = False
        return _json(200 if store_ok else 503,
                     {"status": "ok" if store_ok else "degraded", "store": store_ok})
    if path == "/metrics":
        if broker.metrics is None:
            return _status(404), "text/plain", b"metrics are off\n"
        try:
            body = await broker.metrics.render(broker)
        except Exception as exc:
            log.warning("metrics scrape failed: %s", exc)
            return _status(503), "text/plain", f"{exc}\n".encode()
        return _status(200), "text/plain; version=0.0.4; charset=utf-8", body
    return _status(404), "text/plain", b"not found\n"
