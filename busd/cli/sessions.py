"""`busd sessions QUEUE` (the session inspector) and `busd sessions dead-letter|resubmit|release`
on one session. Over the admin HTTP API, with the options, output and exit codes every tool
shares (busd/cli/output.py)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from urllib.parse import quote, unquote

import click

from busd.cli.output import client_options, emit, table
from busd.client.admin import AdminClient
from busd.storage.sessions import SESSION_SORTS


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


def _act(
    client: AdminClient,
    queue: str,
    session_id: str,
    action: str,
    as_json: bool,
    said: Callable[[dict], str],
    body: dict | None = None,
) -> None:
    """POST `action` on one session, and say what came of it."""
    done = client.call("POST", _session_path(client, queue, session_id, action), body=body)
    emit(as_json, done, lambda: f"{queue}: session {session_id!r}: {said(done)}")


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
    _act(
        AdminClient(url, cacert),
        queue,
        session_id,
        "dead-letter",
        as_json,
        lambda done: f"dead-lettered {done['dead_lettered']} message(s)",
        {"reason": reason, "description": description},
    )


def _one_session_command(action: str, doc: str, said: Callable[[dict], str]) -> None:
    """`busd sessions ACTION QUEUE SESSION`, with nothing more to say than which."""

    def command(queue: str, session_id: str, url: str, cacert: str | None, as_json: bool) -> None:
        _act(AdminClient(url, cacert), queue, session_id, action, as_json, said)

    command.__doc__ = doc
    decorators = (
        sessions.command(action),
        click.argument("queue"),
        click.argument("session_id", metavar="SESSION"),
        client_options,
    )
    for decorate in reversed(decorators):
        command = decorate(command)


_one_session_command(
    "resubmit",
    "Put SESSION's dead letters back into it, in their original order, with its state.",
    lambda done: (
        f"resubmitted {done['resubmitted']} message(s), {done['left']} left (locked in the DLQ)"
    ),
)
_one_session_command(
    "release",
    """Drop SESSION's lock, whoever holds it (a stuck receiver): its holder's next settle
    fails with session-lock-lost, its unsettled messages are available again.""",
    lambda done: "lock released" if done["released"] else "not held",
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

    emit(as_json, {"sessions": found, "next_after": after, "total": total}, text)


COMMANDS = (sessions,)
