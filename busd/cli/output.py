"""How every operator command answers: a plain aligned table, or JSON with `--json`; and the
options by which each reaches busd (`--url`, `--cacert`). A failed request is one line on
stderr and an exit code a script can test (busd.errors: 0 done, 1 busd failed the request,
65 refused as invalid, 66 not found, 69 busd or its store unreachable, 73 already exists; 2 a
usage error)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from busd.client.admin import DEFAULT_TOOL_KEY, DEFAULT_URL

# --url's help, where a tool's --help says where its key comes from (busd.client.admin.tool_key)
URL_HELP = (
    "busd's HTTP address (its --http-port; https:// too). Requests are signed with the key "
    "in BUSD_SAS_KEY: NAME=KEY[:RIGHTS], several separated by spaces, as busd serve "
    f"--sas-key takes them (the first with Manage is used; default {DEFAULT_TOOL_KEY})."
)


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
    """--url (its help names BUSD_SAS_KEY, the key the requests are signed with), --cacert and
    --json: how every tool reaches busd and prints its answer."""
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
        help=URL_HELP,
    )(command)
    return command


def emit(as_json: bool, document: Any, text: Callable[[], str]) -> None:
    click.echo(json.dumps(document, indent=2) if as_json else text())
