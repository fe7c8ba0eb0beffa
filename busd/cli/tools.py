"""What the operator commands share: how they reach busd and how they answer.

The commands (`busd/cli/messages.py`: `queues`, `topics`, `peek`, `send`, `purge`,
`dlq resubmit`, `shards`; `busd/cli/sessions.py`: `sessions`; `busd/cli/faults.py`:
`faults`; `busd/cli/entities.py`: entities over the management API) talk to a running busd
over its admin HTTP API (`--url`, or BUSD_URL; default http://127.0.0.1:5300), so they need
nothing but the standard library and work against busd in a container. Output is a plain
aligned table, or JSON with `--json`. Errors are one line on stderr and an exit code a script
can test:

    0   done
    1   busd failed the request (see its log)
    65  the request was refused as invalid (e.g. no session id for a session queue)
    66  no such queue
    69  busd, or its store, cannot be reached
    (2  a usage error: a missing argument or an unknown option)
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import click

from busd.auth.rights import MANAGE, parse_key
from busd.auth.sas import generate_sas_token

EXIT_FAILED = 1
EXIT_INVALID = 65  # sysexits EX_DATAERR
EXIT_NOT_FOUND = 66  # sysexits EX_NOINPUT
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE
DEFAULT_URL = "http://127.0.0.1:5300"
DEFAULT_SAS_KEY = "RootManageSharedAccessKey=SAS_KEY_VALUE"
TIMEOUT_S = 60.0


class ToolError(click.ClickException):
    """One line on stderr and an exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        # per instance, though newer click declares it a class variable
        setattr(self, "exit_code", exit_code)  # noqa: B010

    def show(self, file=None) -> None:
        click.echo(f"busd: error: {self.message}", err=True)


def tool_key() -> tuple[str, str]:
    """The key the tools sign their requests with, from `BUSD_SAS_KEY` (NAME=KEY[:RIGHTS],
    several separated by spaces, as `busd serve --sas-key`; the emulator's key by default):
    the first holding Manage, which the admin and management APIs want, else the first."""
    keys = []
    for spec in os.environ.get("BUSD_SAS_KEY", DEFAULT_SAS_KEY).split():
        try:
            keys.append(parse_key(spec))
        except ValueError as exc:
            raise ToolError(f"BUSD_SAS_KEY: {exc}", EXIT_INVALID) from None
    if not keys:
        raise ToolError("BUSD_SAS_KEY holds no key", EXIT_INVALID)
    return next(((n, k) for n, k in keys if MANAGE in k.claims), keys[0])


def tls_context(url: str, cafile: str | None) -> ssl.SSLContext | None:
    """For an https:// URL: the system's trusted roots, or `cafile` (busd's certificate)."""
    return ssl.create_default_context(cafile=cafile) if url.startswith("https://") else None


def unreachable(url: str, exc: BaseException) -> ToolError:
    """busd could not be reached at `url`: why, and what to do about an untrusted certificate."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return ToolError(
            f"{url} presented a certificate this machine does not trust: give "
            "busd's with --cacert or BUSD_CACERT (its path is in busd's start "
            "banner)",
            EXIT_UNAVAILABLE,
        )
    return ToolError(f"cannot reach busd at {url}: {reason}", EXIT_UNAVAILABLE)


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
            raise ToolError(f"{url} did not answer JSON: is it busd?", EXIT_FAILED) from None

    def queue_path(self, queue: str, action: str = "") -> str:
        return f"/admin/queues/{quote(queue, safe='')}{action}"


def _http_error(exc: urllib.error.HTTPError) -> ToolError:
    try:
        message = json.loads(exc.read()).get("error") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    code = {
        400: EXIT_INVALID,
        401: EXIT_INVALID,
        404: EXIT_NOT_FOUND,
        413: EXIT_INVALID,
        503: EXIT_UNAVAILABLE,
    }.get(exc.code, EXIT_FAILED)
    return ToolError(str(message), code)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Plain columns, left-aligned text and right-aligned numbers."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [
        any(isinstance(row[i], int) for row in rows)
        and all(isinstance(row[i], int) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in cells])


def client_options(command: Callable) -> Callable:
    """--url, --cacert and --json: how every tool reaches busd and prints its answer."""
    command = click.option(
        "--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table."
    )(command)
    command = click.option(
        "--cacert",
        "--ca",
        "cacert",
        envvar="BUSD_CACERT",
        default=None,
        metavar="PATH",
        help="CA certificate to trust for an https:// URL (busd's own "
        "certificate: its path is in busd's start banner).",
    )(command)
    command = click.option(
        "--url",
        envvar="BUSD_URL",
        default=DEFAULT_URL,
        show_default=True,
        help="busd's HTTP address (its --http-port; https:// too).",
    )(command)
    return command


def emit(as_json: bool, document: Any, text: Callable[[], str]) -> None:
    click.echo(json.dumps(document, indent=2) if as_json else text())
