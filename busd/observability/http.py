"""A tiny HTTP endpoint on `--http-port`: `GET /health` and `GET /metrics` (Prometheus text).

Plain asyncio streams: two read-only routes do not justify a web framework.
"""

from __future__ import annotations

import asyncio
import json
import logging

log = logging.getLogger("busd.http")


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
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path, _ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, ctype, body = await route(server, method, path.split("?", 1)[0])
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                ValueError, ConnectionError):
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


async def route(server, method: str, path: str) -> tuple[str, str, bytes]:
    if method != "GET":
        return "405 Method Not Allowed", "text/plain", b"only GET\n"
    broker = server.broker
    if path == "/health":
        try:
            store_ok = await asyncio.wait_for(broker.store.ping(), 2)
        except Exception:
            store_ok = False
        body = json.dumps({"status": "ok" if store_ok else "degraded", "store": store_ok}).encode()
        return ("200 OK" if store_ok else "503 Service Unavailable"), "application/json", body
    if path == "/metrics":
        if broker.metrics is None:
            return "404 Not Found", "text/plain", b"metrics are off\n"
        try:
            body = await broker.metrics.render(broker)
        except Exception as exc:
            log.warning("metrics scrape failed: %s", exc)
            return "503 Service Unavailable", "text/plain", f"{exc}\n".encode()
        return "200 OK", "text/plain; version=0.0.4; charset=utf-8", body
    return "404 Not Found", "text/plain", b"not found\n"
