"""busd's admin API (docs/management.md): JSON over HTTP, each request signed with a SAS token
made from the key in BUSD_SAS_KEY."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from busd.auth.rights import MANAGE, parse_key
from busd.auth.sas import DEFAULT_SAS_KEY, DEFAULT_SAS_KEY_NAME, generate_sas_token
from busd.client.http import TIMEOUT_S, ToolError, http_error, tls_context, unreachable
from busd.errors import EXIT_FAILURE, EXIT_INVALID

DEFAULT_URL = "http://127.0.0.1:5300"
# BUSD_SAS_KEY when unset: the key busd serves by default, as `busd serve --sas-key` spells it
DEFAULT_TOOL_KEY = f"{DEFAULT_SAS_KEY_NAME}={DEFAULT_SAS_KEY}"


def tool_key() -> tuple[str, str]:
    """The key the tools sign their requests with, from `BUSD_SAS_KEY` (NAME=KEY[:RIGHTS],
    several separated by spaces, as `busd serve --sas-key`; the emulator's key by default):
    the first holding Manage, which the admin and management APIs want, else the first."""
    keys = []
    for spec in os.environ.get("BUSD_SAS_KEY", DEFAULT_TOOL_KEY).split():
        try:
            keys.append(parse_key(spec))
        except ValueError as exc:
            raise ToolError(f"BUSD_SAS_KEY: {exc}", EXIT_INVALID) from None
    if not keys:
        raise ToolError("BUSD_SAS_KEY holds no key", EXIT_INVALID)
    return next(((n, k) for n, k in keys if MANAGE in k.claims), keys[0])


class AdminClient:
    """Calls busd's admin API, signing each request with a SAS token made from the key in
    `BUSD_SAS_KEY` (tool_key)."""

    def __init__(self, url: str, cafile: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.context = tls_context(self.url, cafile)
        key_name, key = tool_key()
        host = urlsplit(self.url).netloc
        self.token = generate_sas_token(f"sb://{host}/", key_name, key, int(time.time()) + 3600)

    def call(self, method: str, path: str, query: dict | None = None, body: Any = None) -> Any:
        return self.exchange(method, path, query, body)[0]

    def exchange(
        self, method: str, path: str, query: dict | None = None, body: Any = None
    ) -> tuple[Any, Any]:
        """(the answer's JSON, its headers)."""
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.url + path + (f"?{urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", self.token)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(
                request, timeout=TIMEOUT_S, context=self.context
            ) as response:
                return json.loads(response.read() or b"null"), response.headers
        except urllib.error.HTTPError as exc:
            raise _http_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise unreachable(self.url, exc) from None
        except json.JSONDecodeError:
            raise ToolError(f"{url} did not answer JSON: is it busd?", EXIT_FAILURE) from None

    def queue_path(self, queue: str, action: str = "") -> str:
        return f"/admin/queues/{quote(queue, safe='')}{action}"


def _http_error(exc: urllib.error.HTTPError) -> ToolError:
    try:
        message = json.loads(exc.read()).get("error")
    except (ValueError, AttributeError):
        message = None
    return http_error(exc, message)
