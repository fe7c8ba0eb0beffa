"""The web dashboard at `/` on the HTTP port: one HTML page with a little JavaScript, no build
step, served by busd itself (docs/management.md §5).

The page holds no data: it calls the admin API (`/admin/...`) with a SAS token, as the busd
tools do, so it is protected exactly as they are. `POST /dashboard/login` turns a key name and
key into such a token (it checks the key against the broker's, then signs a token for the
namespace, valid an hour); a user may paste a token instead.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Mapping
from importlib import resources

from busd.auth.sas import SasError, generate_sas_token
from busd.broker.namespaces import namespace_of_host
from busd.http.server import Request, Response

TOKEN_TTL_S = 3600
_PAGE: bytes | None = None


def _page() -> bytes:
    global _PAGE
    if _PAGE is None:
        _PAGE = resources.files("busd.http").joinpath("dashboard.html").read_bytes()
    return _PAGE


def _json(status: int, document) -> Response:
    return Response(status, "application/json", json.dumps(document).encode())


def login(keys_of: Callable[[str], Mapping[str, str]], request: Request) -> Response:
    """`keys_of(key name)`: the keys of the namespace the key name names (docs/design.md
    §2.16: `team-a/RootManageSharedAccessKey` signs in to namespace team-a)."""
    try:
        document = json.loads(request.body or b"{}")
        key_name, key = str(document["key_name"]), str(document["key"])
    except (ValueError, KeyError, TypeError):
        return _json(400, {"error": "send JSON with key_name and key"})
    keys = keys_of(key_name)
    known = next((v for k, v in keys.items() if k.lower() == key_name.lower()), None)
    if known is None or not hmac.compare_digest(known.encode(), key.encode()):
        return _json(401, {"error": "unknown key name or wrong key"})
    expiry = int(time.time()) + TOKEN_TTL_S
    token = generate_sas_token(f"sb://{request.host}/", key_name, key, expiry)
    return _json(200, {"token": token, "expires": expiry})


async def handle(server, request: Request) -> Response:
    if request.path == "/dashboard/login":
        if request.method != "POST":
            return _json(405, {"error": "use POST"})
        return login(lambda key_name: _keys_of(server, request, key_name), request)
    if request.method not in ("GET", "HEAD") or request.path not in (
        "/",
        "/dashboard",
        "/dashboard/",
    ):
        return Response(404, body=b"not found\n")
    return Response(
        200,
        "text/html; charset=utf-8",
        _page(),
        {"Cache-Control": "no-store", "X-Frame-Options": "DENY"},
    )


def _keys_of(server, request: Request, key_name: str) -> Mapping[str, str]:
    namespaces = server.namespaces
    try:
        return namespaces.keys(namespaces.choose(namespace_of_host(request.host), key_name))
    except SasError:
        return {}
