"""Operator commands on entities' messages: `busd queues`, `topics`, `peek`, `send`, `purge`,
`dlq resubmit`, and `shards` (where each entity is kept). Over the admin HTTP API, with the
options, output and exit codes every tool shares (busd/cli/output.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from busd.cli.output import client_options, emit, table
from busd.client.admin import AdminClient

# Dead letters resubmitted per request: the progress bar moves once per chunk.
RESUBMIT_CHUNK = 500
PREVIEW_CHARS = 40


def preview(message: dict[str, Any]) -> str:
    body = message.get("body")
    if body is None:
        if message.get("body_type") == "data":
            return f"<{message.get('body_size', 0)} bytes>"
        body = json.dumps(message.get("body_value"))
    body = body.replace("\n", "\\n")
    return body if len(body) <= PREVIEW_CHARS else body[: PREVIEW_CHARS - 1] + "…"


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def progress(total: int, label: str):
    """A progress bar on stderr when a person watches it (stdout stays clean for --json)."""
    if total <= RESUBMIT_CHUNK or not sys.stderr.isatty():
        return _NoProgress()
    return click.progressbar(length=total, label=label, file=sys.stderr)


def short_time(iso: str | None) -> str | None:
    return iso.replace("T", " ")[:19] if iso else None


@click.command()
@client_options
def queues(url: str, cacert: str | None, as_json: bool) -> None:
    """List the queues and topic subscriptions with their message and session counts."""
    found = AdminClient(url, cacert).call("GET", "/admin/queues")

    def text() -> str:
        rows = []
        for q in found:
            c, p = q["counts"], q["properties"]
            rows.append(
                [
                    q["name"],
                    q.get("kind", "queue"),
                    c["active"],
                    c["scheduled"],
                    c["deferred"],
                    c["locked"],
                    c["dead_letter"],
                    c["sessions"] if p["requires_session"] else None,
                    c["locked_sessions"] if p["requires_session"] else None,
                ]
            )
        return table(
            [
                "ENTITY",
                "KIND",
                "ACTIVE",
                "SCHEDULED",
                "DEFERRED",
                "LOCKED",
                "DEAD-LETTER",
                "SESSIONS",
                "LOCKED-SESSIONS",
            ],
            rows,
        )

    emit(as_json, found, text)


@click.command()
@client_options
def topics(url: str, cacert: str | None, as_json: bool) -> None:
    """List the topics (those without subscriptions too), their subscriptions and rules."""
    found = AdminClient(url, cacert).call("GET", "/admin/topics")

    def text() -> str:
        rows: list[list[Any]] = []
        for t in found:
            if not t["subscriptions"]:
                rows.append([t["name"], None, None, None, None, None])
            for sub in t["subscriptions"]:
                sessions = "yes" if sub["requires_session"] else "no"
                if not sub["rules"]:  # takes no message
                    rows.append([t["name"], sub["name"], sessions, None, None, None])
                for rule in sub["rules"]:
                    rows.append(
                        [
                            t["name"],
                            sub["name"],
                            sessions,
                            rule["name"],
                            rule.get("filter_text", rule.get("error")),
                            rule.get("action"),
                        ]
                    )
        return table(["TOPIC", "SUBSCRIPTION", "SESSIONS", "RULE", "FILTER", "ACTION"], rows)

    emit(as_json, found, text)


@click.command()
@click.argument("queue")
@click.option("--dlq", is_flag=True, help="Peek the dead-letter sub-queue.")
@click.option("--session", "session_id", default=None, help="Only this session's messages.")
@click.option("--count", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option(
    "--from",
    "from_seq",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Start at this sequence number.",
)
@client_options
def peek(
    queue: str,
    dlq: bool,
    session_id: str | None,
    count: int,
    from_seq: int,
    url: str,
    cacert: str | None,
    as_json: bool,
) -> None:
    """Show messages of QUEUE without locking them, in sequence order."""
    client = AdminClient(url, cacert)
    found = client.call(
        "GET",
        client.queue_path(queue, "/messages"),
        {"dlq": 1 if dlq else None, "session": session_id, "count": count, "from": from_seq},
    )

    def text() -> str:
        headers = ["SEQ", "STATE", "ENQUEUED", "DELIVERIES", "SESSION", "SUBJECT"]
        headers += ["REASON"] if dlq else []
        rows = []
        for m in found:
            row = [
                m["sequence_number"],
                m["state"],
                short_time(m["enqueued_time"]),
                m["delivery_count"],
                m["session_id"],
                m.get("subject"),
            ]
            row += [m["dead_letter_reason"]] if dlq else []
            rows.append(row + [preview(m)])
        return table(headers + ["BODY"], rows)

    emit(as_json, found, text)


def _properties(values: tuple[str, ...]) -> dict[str, str] | None:
    props = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"takes KEY=VALUE, got {value!r}", param_hint="--property")
        props[key] = text
    return props or None


@click.command()
@click.argument("queue")
@click.argument("body")
@click.option("--session", "session_id", default=None, help="The message's session id.")
@click.option(
    "--property",
    "-p",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    help="An application property (string value; repeatable).",
)
@click.option("--message-id", default=None, help="Default: a new random id.")
@click.option("--content-type", default=None)
@click.option("--subject", default=None, help="The message's subject (label).")
@client_options
def send(
    queue: str,
    body: str,
    session_id: str | None,
    properties: tuple[str, ...],
    message_id: str | None,
    content_type: str | None,
    subject: str | None,
    url: str,
    cacert: str | None,
    as_json: bool,
) -> None:
    """Send one message with BODY (text; - reads it from stdin) to QUEUE."""
    if body == "-":
        body = sys.stdin.read()
    client = AdminClient(url, cacert)
    sent = client.call(
        "POST",
        client.queue_path(queue, "/messages"),
        body={
            "body": body,
            "session_id": session_id,
            "application_properties": _properties(properties),
            "message_id": message_id,
            "content_type": content_type,
            "subject": subject,
        },
    )

    def text() -> str:
        if sent["duplicate"]:
            return f"{queue}: dropped as a duplicate of message id {sent['message_id']}"
        return f"{queue}: sent, sequence number {sent['sequence_number']}"

    emit(as_json, sent, text)


@click.command()
@click.argument("queue")
@click.option("--dlq", is_flag=True, help="Purge the dead-letter sub-queue instead.")
@client_options
def purge(queue: str, dlq: bool, url: str, cacert: str | None, as_json: bool) -> None:
    """Delete every message of QUEUE (at once: one atomic step in the store).

    Session state stays; messages a receiver holds are gone when it settles them."""
    client = AdminClient(url, cacert)
    done = client.call("POST", client.queue_path(queue, "/purge"), {"dlq": 1 if dlq else None})
    entity = f"{queue}/$DeadLetterQueue" if dlq else queue
    emit(as_json, done, lambda: f"{entity}: purged {done['purged']} message(s)")


@click.group()
def dlq() -> None:
    """Dead-letter sub-queue tools."""


@dlq.command()
@click.argument("queue")
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=None,
    help="At most this many messages (default: all); on a session queue, whole sessions "
    "until this many (the last may take it past).",
)
@client_options
def resubmit(queue: str, limit: int | None, url: str, cacert: str | None, as_json: bool) -> None:
    """Send QUEUE's dead-lettered messages back to QUEUE as new messages, oldest first.

    Each gets a new sequence number, delivery count 0 and the queue's default time to live;
    it keeps its body, properties and session id. Messages a dead-letter receiver holds
    locked stay. On a session queue sessions move whole and in order, each message under its
    own sequence number, as `busd sessions resubmit` moves one (docs/tools.md)."""
    client = AdminClient(url, cacert)
    total = client.call("GET", client.queue_path(queue))["counts"]["dead_letter"]
    if limit is not None:
        total = min(total, limit)
    moved = 0
    with progress(total, f"resubmitting {queue}") as bar:
        while limit is None or moved < limit:
            chunk = RESUBMIT_CHUNK if limit is None else min(RESUBMIT_CHUNK, limit - moved)
            done = client.call("POST", client.queue_path(queue, "/dlq/resubmit"), {"limit": chunk})
            moved += done["resubmitted"]
            bar.update(done["resubmitted"])
            if done["resubmitted"] < chunk:
                break
    result = {
        "resubmitted": moved,
        "remaining": done["remaining"],
        "dead_letter": done["dead_letter"],
    }
    emit(
        as_json,
        result,
        lambda: (
            f"{queue}: resubmitted {moved} dead-lettered message(s)"
            + (" (sessions move whole)" if limit is not None and moved > limit else "")
            + f", {done['dead_letter']} left in the dead-letter queue"
        ),
    )


@click.command()
@click.argument("entity", required=False)
@client_options
def shards(entity: str | None, url: str, cacert: str | None, as_json: bool) -> None:
    """Where each queue and subscription (or ENTITY) is kept: per store server (a Cluster's
    shard), its partitions, sessions, active messages and messages sent and received,
    with each shard's share of what was sent against an even share."""
    found = AdminClient(url, cacert).call("GET", "/admin/shards", {"entity": entity})

    def text() -> str:
        rows = []
        for e in found:
            sent = sum(r["sent"] for r in e["shards"])
            even = sent / len(e["shards"]) if e["shards"] else 0
            for r in e["shards"]:
                rows.append(
                    [
                        e["name"],
                        r["shard"],
                        r["partitions"] if e["partitions"] else None,
                        r["sessions"],
                        r["active"],
                        r["sent"],
                        r["received"],
                        f"{100 * r['sent'] / even:.0f}%" if even else None,
                    ]
                )
        headers = ["ENTITY", "SHARD", "PARTITIONS", "SESSIONS", "ACTIVE", "SENT", "RECEIVED"]
        return table([*headers, "SENT/EVEN"], rows)

    emit(as_json, found, text)


COMMANDS = (queues, topics, peek, send, purge, dlq, shards)
