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

from busd.broker.namespaces import NamespaceLimit
from busd.http import atom_xml, dashboard
from busd.http.atom import AtomApi, error_response, is_atom
from busd.http.entities import CatalogEntities
from busd.http.server import Handler, Request, Response
from busd.observability.http import admin_request, route


def handler(server) -> Handler:
    # the management API of each namespace served, by name (None: the default namespace)
    apis: dict[str | None, tuple[object, AtomApi]] = {}

    async def namespace(request: Request):
        """The broker of the namespace a request is for: the one its `Host` names
        (`<name>.localhost`), else the one its token's key name names (`<name>/<key>`), else
        the default (docs/design.md §3.17). None when that namespace is not served yet and the
        token does not show that the client may make it."""
        token = request.headers.get("authorization", "")
        return await server.namespaces.for_request(token, request.host)

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

    async def handle(request: Request) -> Response:
        path = request.path
        admin = path.startswith("/admin/")
        management = is_atom(request) or (
            request.method in ("PUT", "DELETE")  # a management client that sent no api-version
            and not admin
            and path not in ("/health", "/health/detail", "/metrics")
            and not (path == "/" or path.startswith("/dashboard"))
        )
        if management or admin:
            try:
                name, broker = await namespace(request)
            except NamespaceLimit as exc:
                if admin:
                    return Response(
                        403, "application/json", json.dumps({"error": exc.reason}).encode()
                    )
                return error_response(403, exc.reason)
            if broker is None:
                refusal = "Unauthorized: no valid token for this namespace"
                if admin:
                    return Response(
                        401, "application/json", json.dumps({"error": refusal}).encode()
                    )
                return error_response(401, refusal)
            if management:
                return await atom_of(name, broker).handle(request)
            code, content_type, body, headers = await admin_request(
                broker,
                request.method,
                path,
                request.query,
                request.body,
                request.headers,
                server.namespaces.entity_keys(name),
            )
            return Response(code, content_type, body, headers)
        if path in ("/health", "/health/detail", "/metrics"):
            status, content_type, body = await route(server, request.method, path)
            return Response(int(status.split(" ", 1)[0]), content_type, body)
        if path == "/" or path.startswith("/dashboard"):
            return await dashboard.handle(server, request)
        return Response(404, body=b"not found\n")

    return handle
