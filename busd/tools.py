"""Operator commands: `busd queues`, `topics`, `peek`, `sessions` (and `sessions dead-letter`,
`sessions resubmit`), `send`, `purge`, `dlq resubmit`.

They talk to a running busd over its admin HTTP API (`--url`, or BUSD_URL; default
http://127.0.0.1:5300), so they need nothing but the standard library and work against busd in
a container. Output is a plain aligned table, or JSON with `--json`. Errors are one line on
stderr and an exit code a script can test:

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
import shlex
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

import click

from busd.auth.rights import MANAGE, parse_key
from busd.auth.sas import generate_sas_token
from busd.storage.sessions import SESSION_SORTS

EXIT_FAILED = 1
EXIT_INVALID = 65  # sysexits EX_DATAERR
EXIT_NOT_FOUND = 66  # sysexits EX_NOINPUT
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE
DEFAULT_URL = "http://127.0.0.1:5300"
DEFAULT_SAS_KEY = "RootManageSharedAccessKey=SAS_KEY_VALUE"
# Dead letters resubmitted per request: the progress bar moves once per chunk.
RESUBMIT_CHUNK = 500
TIMEOUT_S = 60.0
PREVIEW_CHARS = 40


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


def _emit(as_json: bool, document: Any, text: Callable[[], str]) -> None:
    click.echo(json.dumps(document, indent=2) if as_json else text())


def _preview(message: dict[str, Any]) -> str:
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


def _progress(total: int, label: str):
    """A progress bar on stderr when a person watches it (stdout stays clean for --json)."""
    if total <= RESUBMIT_CHUNK or not sys.stderr.isatty():
        return _NoProgress()
    return click.progressbar(length=total, label=label, file=sys.stderr)


def _short_time(iso: str | None) -> str | None:
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

    _emit(as_json, found, text)


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

    _emit(as_json, found, text)


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
                _short_time(m["enqueued_time"]),
                m["delivery_count"],
                m["session_id"],
                m.get("subject"),
            ]
            row += [m["dead_letter_reason"]] if dlq else []
            rows.append(row + [_preview(m)])
        return table(headers + ["BODY"], rows)

    _emit(as_json, found, text)


class _SessionsGroup(click.Group):
    """`busd sessions QUEUE` lists; `busd sessions dead-letter|resubmit ...` act on one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_SessionsGroup)
def sessions() -> None:
    """Sessions: `busd sessions QUEUE` lists them; `dead-letter` and `resubmit` act on one."""


def _session_path(client: AdminClient, queue: str, session_id: str, action: str) -> str:
    return client.queue_path(queue, f"/sessions/{quote(session_id, safe='')}/{action}")


@sessions.command("dead-letter")
@click.argument("queue")
@click.argument("session_id", metavar="SESSION")
@click.option("--reason", required=True, help="The DeadLetterReason each message gets.")
@click.option("--description", default=None, help="Its DeadLetterErrorDescription.")
@client_options
def dead_letter_session(
    queue: str,
    session_id: str,
    reason: str,
    description: str | None,
    url: str,
    cacert: str | None,
    as_json: bool,
) -> None:
    """Move every message of SESSION (available, locked, deferred, scheduled) and its state
    to QUEUE's dead-letter sub-queue at once, in order."""
    client = AdminClient(url, cacert)
    done = client.call(
        "POST",
        _session_path(client, queue, session_id, "dead-letter"),
        body={"reason": reason, "description": description},
    )
    _emit(
        as_json,
        done,
        lambda: (
            f"{queue}: session {session_id!r}: dead-lettered {done['dead_lettered']} message(s)"
        ),
    )


@sessions.command("resubmit")
@click.argument("queue")
@click.argument("session_id", metavar="SESSION")
@client_options
def resubmit_session(
    queue: str, session_id: str, url: str, cacert: str | None, as_json: bool
) -> None:
    """Put SESSION's dead letters back into it, in their original order, with its state."""
    client = AdminClient(url, cacert)
    done = client.call("POST", _session_path(client, queue, session_id, "resubmit"))
    _emit(
        as_json,
        done,
        lambda: (
            f"{queue}: session {session_id!r}: resubmitted "
            f"{done['resubmitted']} message(s), {done['left']} left (locked in the DLQ)"
        ),
    )


@sessions.command("release")
@click.argument("queue")
@click.argument("session_id", metavar="SESSION")
@client_options
def release_session(
    queue: str, session_id: str, url: str, cacert: str | None, as_json: bool
) -> None:
    """Drop SESSION's lock, whoever holds it (a stuck receiver): its holder's next settle
    fails with session-lock-lost, its unsettled messages are available again."""
    client = AdminClient(url, cacert)
    done = client.call("POST", _session_path(client, queue, session_id, "release"))
    _emit(
        as_json,
        done,
        lambda: (
            f"{queue}: session {session_id!r}: "
            + ("lock released" if done["released"] else "not held")
        ),
    )


def _age(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds:.0f}s"


@sessions.command("list")
@click.argument("queue")
@click.option(
    "--sort",
    type=click.Choice(SESSION_SORTS),
    default="id",
    show_default=True,
    help="id: all, by id; locked: held, lock ending first; waiting: free with "
    "messages, oldest first; updated: with state, oldest update first.",
)
@click.option(
    "--page",
    "page_size",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Sessions per page.",
)
@click.option("--after", default=None, help="The cursor a previous page ended with.")
@click.option("--all", "every_page", is_flag=True, help="Every page, one after another.")
@client_options
def list_sessions(
    queue: str,
    sort: str,
    page_size: int,
    after: str | None,
    every_page: bool,
    url: str,
    cacert: str | None,
    as_json: bool,
) -> None:
    """The session inspector: QUEUE's sessions, a page at a time: holder, lock, messages by
    state, oldest message age, state size and preview, last activity; stuck ones marked."""
    client = AdminClient(url, cacert)
    found: list[dict] = []
    while True:
        page, headers = client.exchange(
            "GET",
            client.queue_path(queue, "/sessions"),
            {"sort": sort, "after": after, "top": page_size},
        )
        found += page
        after = unquote(headers["X-Next-After"]) if headers.get("X-Next-After") else None
        total = int(headers.get("X-Total-Count") or len(found))
        if not (every_page and after):
            break

    def text() -> str:
        rows = [
            [
                s["session_id"] + (" (stuck)" if s["stuck"] else ""),
                s["holder_address"] or ("yes" if s["locked"] else "no"),
                s["locked_until"],
                s["active"],
                s["in_flight"],
                s["deferred"],
                s["scheduled"],
                _age(s["oldest_message_age_s"]),
                s["state_size"],
                s["state_preview"],
                s["last_activity"],
            ]
            for s in found
        ]
        out = table(
            [
                "SESSION",
                "HOLDER",
                "LOCKED-UNTIL",
                "ACTIVE",
                "IN-FLIGHT",
                "DEFERRED",
                "SCHEDULED",
                "OLDEST",
                "STATE-BYTES",
                "STATE",
                "LAST-ACTIVITY",
            ],
            rows,
        )
        more = f"\nnext page: --after {shlex.quote(after)}" if after else ""
        return f"{out}\n{len(found)} of {total} session(s){more}"

    _emit(as_json, {"sessions": found, "next_after": after, "total": total}, text)


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

    _emit(as_json, sent, text)


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
    _emit(as_json, done, lambda: f"{entity}: purged {done['purged']} message(s)")


@click.group()
def dlq() -> None:
    """Dead-letter sub-queue tools."""


@dlq.command()
@click.argument("queue")
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=None,
    help="At most this many messages (default: all).",
)
@client_options
def resubmit(queue: str, limit: int | None, url: str, cacert: str | None, as_json: bool) -> None:
    """Send QUEUE's dead-lettered messages back to QUEUE as new messages, oldest first.

    Each gets a new sequence number, delivery count 0 and the queue's default time to live;
    it keeps its body, properties and session id. Messages a dead-letter receiver holds
    locked stay."""
    client = AdminClient(url, cacert)
    total = client.call("GET", client.queue_path(queue))["counts"]["dead_letter"]
    if limit is not None:
        total = min(total, limit)
    moved = 0
    with _progress(total, f"resubmitting {queue}") as bar:
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
    _emit(
        as_json,
        result,
        lambda: (
            f"{queue}: resubmitted {moved} dead-lettered message(s), "
            f"{done['dead_letter']} left in the dead-letter queue"
        ),
    )


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
@click.option("--session", default=None, help="Only this session of the entity.")
@click.option(
    "--operation",
    "operations",
    multiple=True,
    type=click.Choice(["send", "receive", "settle", "accept", "deliver"]),
    help="The operations it hits (repeatable; default: send, receive, settle; a delay's: "
    "accept, deliver).",
)
@click.option("--count", type=click.IntRange(1), default=None, help="Hit this many operations.")
@click.option(
    "--for",
    "duration",
    type=click.FloatRange(0.001),
    default=None,
    metavar="SECONDS",
    help="Hit every matching operation for this long (with --fraction, a share of them).",
)
@click.option(
    "--fraction",
    type=click.FloatRange(0, 1),
    default=None,
    help="With --for: the share of the matching operations hit.",
)
@click.option(
    "--delay",
    type=click.FloatRange(0),
    default=None,
    metavar="SECONDS",
    help="delay: how long each hit operation waits.",
)
@click.option(
    "--condition", default=None, help="detach, close-connection: the AMQP error condition."
)
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
    _emit(as_json, done, lambda: f"fault {done['id']}: {kind} on {done['entity']}")


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
    _emit(
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
    _emit(as_json, done, lambda: f"fault {fault_id} removed")


@click.command()
@click.argument("entity", required=False)
@client_options
def shards(entity: str | None, url: str, cacert: str | None, as_json: bool) -> None:
    """Where each queue and subscription (or ENTITY) is kept: per store server (a Cluster's
    shard), its partitions, sessions, available messages and messages sent and received,
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

    _emit(as_json, found, text)


COMMANDS = (queues, topics, peek, sessions, send, purge, dlq, shards, faults)
