"""The web dashboard at `/` on the HTTP port: one HTML page with a little JavaScript, no build
step, served by busd itself (docs/management.md §5).

The page holds no data: it calls the admin API (`/admin/...`) with a SAS token, as the busd
tools do, so it is protected exactly as they are. `POST /dashboard/login` turns a key name and
key into such a token (it checks the key against the broker's, then signs a token for the
namespace, valid an hour); a user may paste a token instead. `POST /dashboard/renew` trades a
valid token for one like it (same key name, same audience) valid another hour: the page renews
its token before it ends, so a tab left open stays signed in. `GET /dashboard/sign-in` tells
the sign-in form which key name to suggest and whether the broker still uses the well-known
default key (docs/management.md §5).
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Mapping
from importlib import resources

from busd.auth.sas import (
    DEFAULT_SAS_KEY,
    DEFAULT_SAS_KEY_NAME,
    SasError,
    generate_sas_token,
    parse_sas_token,
    verify_sas_token,
)
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


def renew(keys_of: Callable[[str], Mapping[str, str]], request: Request) -> Response:
    """A token like the request's (its `Authorization`), valid TOKEN_TTL_S from now. Only a
    token the namespace's own keys signed is renewed: its audience and key name stay, so a
    renewed token grants nothing the first did not."""
    authorization = request.headers.get("authorization", "")
    try:
        parsed = verify_sas_token(authorization, keys_of(_key_name_of(authorization)))
    except SasError as exc:
        return _json(401, {"error": f"cannot renew this token: {exc.reason}"})
    key = keys_of(parsed.key_name)[parsed.key_name]
    expiry = int(time.time()) + TOKEN_TTL_S
    token = generate_sas_token(parsed.audience, parsed.key_name, key, expiry)
    return _json(200, {"token": token, "expires": expiry})


def _key_name_of(authorization: str) -> str:
    """The key name a token says it was signed with ("" when it is no token: refused later)."""
    try:
        return parse_sas_token(authorization).key_name
    except SasError:
        return ""


def sign_in_hint(keys: Mapping[str, str]) -> dict[str, object]:
    """What the sign-in form suggests: the default key name when the namespace has it, and
    whether that key is still the well-known default (anyone may sign in with it)."""
    default = next((v for k, v in keys.items() if k.lower() == DEFAULT_SAS_KEY_NAME.lower()), None)
    return {
        "key_name": DEFAULT_SAS_KEY_NAME if default is not None or not keys else next(iter(keys)),
        "default_key": default == DEFAULT_SAS_KEY,
    }


async def handle(server, request: Request) -> Response:
    def keys_of(key_name: str) -> Mapping[str, str]:
        return _keys_of(server, request, key_name)

    if request.path in ("/dashboard/login", "/dashboard/renew"):
        if request.method != "POST":
            return _json(405, {"error": "use POST"})
        return (login if request.path == "/dashboard/login" else renew)(keys_of, request)
    if request.path == "/dashboard/sign-in":
        if request.method not in ("GET", "HEAD"):
            return _json(405, {"error": "use GET"})
        return _json(200, sign_in_hint(keys_of(DEFAULT_SAS_KEY_NAME)))
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
