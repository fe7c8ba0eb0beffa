"""Faults on demand for a test (docs/faults.md), over busd's admin API: a lost session or
message lock, server-busy answers, a detached link, a slow accept-next-session. Each call
sets a fault on the broker now and returns its record (its `id` removes it early)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from busd.auth.sas import generate_sas_token


class FaultError(RuntimeError):
    """busd refused the fault (the message says why) or could not be reached."""


class Faults:
    def __init__(self, http_url: str, key: tuple[str, str]) -> None:
        self.url = http_url.rstrip("/")
        self.key_name, self.key = key

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        audience = self.url.replace("http", "sb", 1) + "/"
        token = generate_sas_token(audience, self.key_name, self.key, int(time.time()) + 600)
        request.add_header("Authorization", token)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error")
            except ValueError:
                reason = exc.reason
            raise FaultError(f"{method} {path}: {exc.code} {reason}") from None

    def inject(self, kind: str, entity: str, **options: Any) -> dict[str, Any]:
        """Set a fault: `kind` (server-busy, timeout, delay, message-lock-lost,
        session-lock-lost, detach, close-connection) on `entity`, with the admin API's
        options (session, operations, count, fraction, duration_ms, delay_ms, condition)."""
        body = {"kind": kind, "entity": entity}
        body.update({k: v for k, v in options.items() if v is not None})
        return self._call("POST", "/admin/faults", body)

    def list(self) -> list[dict[str, Any]]:
        return self._call("GET", "/admin/faults")

    def remove(self, fault_id: str) -> bool:
        try:
            self._call("DELETE", f"/admin/faults/{quote(fault_id, safe='')}")
        except FaultError as exc:
            if " 404 " in str(exc):
                return False
            raise
        return True

    def clear(self) -> None:
        """Remove every fault set now."""
        for fault in self.list():
            self.remove(fault["id"])
