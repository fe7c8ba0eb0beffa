"""`busd faults add|list|remove`: faults on demand for resilience tests (docs/faults.md). Over
the admin HTTP API, with the options, output and exit codes every tool shares
(busd/cli/output.py)."""

from __future__ import annotations

import time
from urllib.parse import quote

import click

from busd.cli.output import client_options, emit, table
from busd.client.admin import AdminClient


@click.group()
def faults() -> None:
    """Faults on demand for resilience tests (docs/faults.md): `add`, `list`, `remove`."""


@faults.command("add")
@click.argument(
    "kind",
    type=click.Choice(
        [
            "server-busy",
            "timeout",
            "delay",
            "message-lock-lost",
            "session-lock-lost",
            "detach",
            "close-connection",
        ]
    ),
)
@click.argument("entity")
@click.option("--session", help="Only this session of the entity.")
@click.option(
    "--operation",
    "operations",
    multiple=True,
    type=click.Choice(["send", "receive", "settle", "accept", "deliver"]),
    help="The operations it hits (repeatable; default: send, receive, settle; a delay's: "
    "accept, deliver).",
)
@click.option("--count", type=click.IntRange(1), help="Hit this many operations.")
@click.option(
    "--for",
    "duration",
    type=click.FloatRange(0.001),
    metavar="SECONDS",
    help="Hit every matching operation for this long (with --fraction, a share of them).",
)
@click.option(
    "--fraction",
    type=click.FloatRange(0, 1),
    help="With --for: the share of the matching operations hit.",
)
@click.option(
    "--delay",
    type=click.FloatRange(0),
    metavar="SECONDS",
    help="delay: how long each hit operation waits.",
)
@click.option("--condition", help="detach, close-connection: the AMQP error condition.")
@client_options
def add_fault(
    kind: str,
    entity: str,
    session: str | None,
    operations: tuple[str, ...],
    count: int | None,
    duration: float | None,
    fraction: float | None,
    delay: float | None,
    condition: str | None,
    url: str,
    cacert: str | None,
    as_json: bool,
) -> None:
    """Set a fault of KIND on ENTITY (a queue, topic or subscription) now."""
    document = {
        "kind": kind,
        "entity": entity,
        "session": session,
        "operations": list(operations) or None,
        "count": count,
        "duration_ms": None if duration is None else round(duration * 1000),
        "fraction": fraction,
        "delay_ms": None if delay is None else round(delay * 1000),
        "condition": condition,
    }
    done = AdminClient(url, cacert).call(
        "POST", "/admin/faults", body={k: v for k, v in document.items() if v is not None}
    )
    emit(as_json, done, lambda: f"fault {done['id']}: {kind} on {done['entity']}")


def _utc(ms: int | None) -> str | None:
    return None if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


@faults.command("list")
@client_options
def list_faults(url: str, cacert: str | None, as_json: bool) -> None:
    """The faults set now."""
    found = AdminClient(url, cacert).call("GET", "/admin/faults")
    rows = [
        [
            f["id"],
            f["kind"],
            f["entity"],
            f["session"],
            ",".join(f["operations"]) or None,
            f["count"],
            _utc(f["until_ms"]),
        ]
        for f in found
    ]
    emit(
        as_json,
        found,
        lambda: table(["ID", "KIND", "ENTITY", "SESSION", "OPERATIONS", "COUNT", "UNTIL"], rows),
    )


@faults.command("remove")
@click.argument("fault_id", metavar="ID")
@client_options
def remove_fault(fault_id: str, url: str, cacert: str | None, as_json: bool) -> None:
    """End the fault ID now."""
    done = AdminClient(url, cacert).call("DELETE", f"/admin/faults/{quote(fault_id, safe='')}")
    emit(as_json, done, lambda: f"fault {fault_id} removed")


COMMANDS = (faults,)
