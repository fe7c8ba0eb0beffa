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

from busd.http import dashboard
from busd.http.atom import AtomApi, is_atom
from busd.http.server import Handler, Request, Response
from busd.observability.http import route


def handler(server, atom: AtomApi) -> Handler:
    async def handle(request: Request) -> Response:
        if is_atom(request):
            return await atom.handle(request)
        path = request.path
        if path in ("/health", "/health/detail", "/metrics") or path.startswith("/admin/"):
            status, content_type, body = await route(
                server, request.method, path, request.query, request.body,
                request.headers.get("authorization", ""))
            return Response(int(status.split(" ", 1)[0]), content_type, body)
        if path == "/" or path.startswith("/dashboard"):
            return await dashboard.handle(server, request)
        if request.method in ("PUT", "DELETE"):  # a management client that sent no api-version
            return await atom.handle(request)
        return Response(404, body=b"not found\n")

    return handle
