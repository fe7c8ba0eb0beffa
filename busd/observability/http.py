"""`GET /health` and `/health/detail`, `GET /metrics` (Prometheus text) and the admin API under
`/admin/` (busd.observability.admin) over HTTP (busd.http serves it and routes to here).
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus

from busd import __version__
from busd.auth.rights import MANAGE, Unauthorized, authorize_header

log = logging.getLogger("busd.http")


# `GET /health` answers as the Service Bus emulator's does, byte for byte (compact JSON), since
# Testcontainers, Aspire and compose files written for the emulator wait on it; busd's own
# detail is /health/detail.
HEALTHY = b'{"status":"healthy","message":"Service is healthy."}'
UNHEALTHY = b'{"status":"unhealthy","message":"Service not available. Please try after some time."}'


def _status(code: int) -> str:
    return f"{code} {HTTPStatus(code).phrase}"


def _json(code: int, document) -> tuple[str, str, bytes]:
    return _status(code), "application/json", json.dumps(document).encode()


def admin_refusal(
    broker, path: str, headers: dict[str, str], entity_keys=None
) -> tuple[int, str, bytes] | None:
    """(status, content type, body) refusing an admin request whose token does not allow it,
    from its path and headers alone (before its body is read); None: allowed. `entity_keys`:
    the keys of its entities' own rules (busd.auth.rights.EntityKeys; by default its
    catalog's)."""
    from busd.observability.admin import entity_of

    # The admin API can purge queues: it takes a SAS token covering the queue, signed with
    # a key holding the Manage right, as Service Bus's management operations (reads too).
    # Health and metrics stay open.
    try:
        authorize_header(
            headers.get("authorization", ""),
            broker.sas_keys,
            entity_of(path),
            MANAGE,
            entity_keys or broker.catalog.access_keys,
        )
    except Unauthorized as exc:
        return (
            401,
            "application/json",
            json.dumps(
                {
                    "error": "admin requests need a valid SAS token with the Manage right "
                    f"covering the queue: {exc.reason}"
                }
            ).encode(),
        )
    return None


async def admin_request(
    broker,
    method: str,
    path: str,
    query: str,
    body: bytes,
    headers: dict[str, str],
    entity_keys=None,
) -> tuple[int, str, bytes, dict[str, str]]:
    """One admin request (`headers`: the request's, names lower-cased) for the namespace of
    `broker`: (status, content type, body, response headers). `entity_keys`: as
    admin_refusal's."""
    from busd.observability.admin import Raw, route_admin

    refusal = admin_refusal(broker, path, headers, entity_keys)
    if refusal is not None:
        return (*refusal, {})
    status, answer = await route_admin(broker, method, path, query, body, headers)
    if isinstance(answer, Raw):
        return status, answer.content_type, answer.body, answer.headers
    return status, "application/json", json.dumps(answer).encode(), {}


async def route(server, method: str, path: str) -> tuple[str, str, bytes]:
    """Health and metrics: the process's (the default namespace's entities)."""
    broker = server.broker
    if method != "GET":
        return _status(405), "text/plain", b"only GET\n"
    if path in ("/health", "/health/detail"):
        try:
            store_ok = await asyncio.wait_for(broker.store.ping(), 2)
        except Exception:
            store_ok = False
        if path == "/health":  # the emulator's answer, which container tools wait on
            code, body = (200, HEALTHY) if store_ok else (503, UNHEALTHY)
            return _status(code), "application/json", body
        health = {
            "status": "ok" if store_ok else "degraded",
            "store": store_ok,
            "version": __version__,
        }
        if server.peers is not None:  # one worker of several: the answer is the host's
            health["workers"] = [
                {"pid": r["pid"], "connections": r["connections"]}
                for r in await server.peers.reports()
            ]
        return _json(200 if store_ok else 503, health)
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
