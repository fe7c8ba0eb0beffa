"""Which part of busd answers a request on the HTTP port.

    /health, /health/detail,          busd.observability.http (JSON, for tools and scrapers)
      /metrics, /admin/...
    anything with ?api-version=...,   the management (ATOM) API, busd.http.atom
      /$namespaceinfo, /$Resources/...
    / and /dashboard/...              the web dashboard, busd.http.dashboard

The SDKs put `api-version` on every management request, so a queue may be called `health`
without being mistaken for the health check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from busd.broker.namespaces import NamespaceLimit
from busd.http import atom_xml, dashboard
from busd.http.atom import AtomApi, error_response, is_atom
from busd.http.entities import CatalogEntities
from busd.http.server import BODY_LIMIT, Admit, Handler, Open, Request, Response
from busd.observability.admin import admin_body_limit
from busd.observability.http import admin_refusal, admin_request, route

HEALTH_PATHS = ("/health", "/health/detail", "/metrics")
# An entity's description (PUT): its properties, rules and filters, never near this.
ATOM_BODY_LIMIT = 256 * 1024


def handler(server) -> Front:
    # the management API of each namespace served, by name (None: the default namespace)
    apis: dict[str | None, tuple[object, AtomApi]] = {}

    async def namespace(request: Request):
        """The broker of the namespace a request is for: the one its `Host` names
        (`<name>.localhost`), else the one its token's key name names (`<name>/<key>`), else
        the default (docs/design.md §3.17). None when that namespace is not served yet and the
        token does not show that the client may make it."""
        token = request.headers.get("authorization", "")
        return await server.namespaces.for_request(token, request.host)

    async def served_namespace(request: Request, kind: str):
        """The (name, broker) of a management or admin request's namespace, or the refusal:
        401 when its token may not reach it, 403 when the process serves as many as it may."""
        try:
            name, broker = await namespace(request)
        except NamespaceLimit as exc:
            return _namespace_limit(exc, kind == "admin")
        if broker is None:
            return _no_namespace(kind == "admin")
        return name, broker

    def atom_of(name: str | None, broker) -> AtomApi:
        known = apis.get(name)
        if known is None or known[0] is not broker:
            serving = server.namespaces.serving()  # forget those let go since (idle)
            for stale in [n for n in apis if n is not None and n not in serving]:
                del apis[stale]
            known = apis[name] = (
                broker,
                AtomApi(
                    CatalogEntities(broker),
                    broker.sas_keys,
                    name or atom_xml.NAMESPACE_NAME,
                    server.namespaces.entity_keys(name),
                ),
            )
        return known[1]

    async def admit(request: Request) -> Response | int | Open:
        """A request's head, before any of its body is read: refused when its route or its
        key fails, else the most body its route takes (docs/management.md §1). Health,
        metrics and the dashboard take no key: only the dashboard's login and renewal (POST)
        take a body, the rest none."""
        kind = _route(request)
        if kind is None:
            return Response(404, body=b"not found\n")
        if kind == "dashboard" and request.method == "POST":
            return Open(BODY_LIMIT)
        if kind in ("health", "dashboard"):
            return Open(0)
        served = await served_namespace(request, kind)
        if isinstance(served, Response):
            return served
        name, broker = served
        if kind == "management":
            try:
                atom_of(name, broker).authorize(request)
            except atom_xml.AtomError as exc:
                return error_response(exc.status, exc.detail)
            return ATOM_BODY_LIMIT if request.method in ("PUT", "POST") else BODY_LIMIT
        refusal = admin_refusal(broker, request.path, request.headers, entity_keys(name))
        if refusal is not None:
            code, content_type, body = refusal
            return Response(code, content_type, body)
        return admin_body_limit(broker, request.method, request.path)

    async def handle(request: Request) -> Response:
        kind = _route(request)
        path = request.path
        if kind in ("management", "admin"):
            served = await served_namespace(request, kind)
            if isinstance(served, Response):
                return served
            name, broker = served
            if kind == "management":
                return await atom_of(name, broker).handle(request)
            code, content_type, body, headers = await admin_request(
                broker,
                request.method,
                path,
                request.query,
                request.body,
                request.headers,
                entity_keys(name),
            )
            return Response(code, content_type, body, headers)
        if kind == "health":
            status, content_type, body = await route(server, request.method, path)
            return Response(int(status.split(" ", 1)[0]), content_type, body)
        if kind == "dashboard":
            return await dashboard.handle(server, request)
        return Response(404, body=b"not found\n")

    def entity_keys(name: str | None):
        return server.namespaces.entity_keys(name)

    return Front(handle, admit)


@dataclass(frozen=True)
class Front:
    """The HTTP server's two calls (busd.http.server.HttpService): `admit` a request's head,
    then `handle` it whole."""

    handle: Handler
    admit: Admit


def _route(request: Request) -> str | None:
    """Which part of busd answers a request (the table above); None: no part."""
    path = request.path
    admin = path.startswith("/admin/")
    if is_atom(request) or (
        request.method in ("PUT", "DELETE")  # a management client that sent no api-version
        and not admin
        and path not in HEALTH_PATHS
        and not (path == "/" or path.startswith("/dashboard"))
    ):
        return "management"
    if admin:
        return "admin"
    if path in HEALTH_PATHS:
        return "health"
    if path == "/" or path.startswith("/dashboard"):
        return "dashboard"
    return None


def _no_namespace(admin: bool) -> Response:
    refusal = "Unauthorized: no valid token for this namespace"
    if admin:
        return Response(401, "application/json", json.dumps({"error": refusal}).encode())
    return error_response(401, refusal)


def _namespace_limit(exc: NamespaceLimit, admin: bool) -> Response:
    """The process serves as many namespaces as it may, all in use (docs/design.md §3.17)."""
    if admin:
        return Response(403, "application/json", json.dumps({"error": exc.reason}).encode())
    return error_response(403, exc.reason)
