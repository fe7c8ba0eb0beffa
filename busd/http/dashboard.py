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
from importlib import resources

from busd.auth.sas import generate_sas_token
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


def login(keys: dict[str, str], request: Request) -> Response:
    try:
        document = json.loads(request.body or b"{}")
        key_name, key = str(document["key_name"]), str(document["key"])
    except (ValueError, KeyError, TypeError):
        return _json(400, {"error": "send JSON with key_name and key"})
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
        return login(server.settings.sas_keys, request)
    if request.method not in ("GET", "HEAD") or request.path not in ("/", "/dashboard",
                                                                         "/dashboard/"):
        return Response(404, body=b"not found\n")
    return Response(200, "text/html; charset=utf-8", _page(),
                    {"Cache-Control": "no-store", "X-Frame-Options": "DENY"})
