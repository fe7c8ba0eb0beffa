"""The sessions of the Redis/Valkey store: accept (a named or the next available session),
receive from, renew, release, their state, listing them, and dead-lettering and resubmitting
one whole (docs/design.md §3.4, §2.9)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from busd.storage.messages import Received, ReceiveMode
from busd.storage.redis.codec import (
    ScriptStatus,
    as_text,
    check_session_ids,
    check_status,
    optional_arg,
    session_arg,
    session_from_reply,
    stored_message,
    token_string,
)
from busd.storage.redis.connection import SWEEP_BUDGET, RedisConnection
from busd.storage.sessions import SessionDetail, SessionLock, SessionPage
from busd.storage.specs import QueueSpec


def _receive_request(
    session_id: str,
    holder: str,
    count: int,
    mode: ReceiveMode,
    tokens: Sequence[bytes],
    stand: bool,
    replace: bool,
    recover: bool,
) -> list[Any]:
    """One request of receiveSessionMessages (lua/receiveSessionMessages.lua)."""
    peek_lock = mode == ReceiveMode.PEEK_LOCK
    if peek_lock and len(tokens) < count:
        raise ValueError("peek-lock needs one token per message")
    return [
        holder,
        session_arg(session_id),
        (1 + 2 * (stand or replace) + 4 * recover + 8 * stand) if peek_lock else 0,
        max(count, 0),
        token_string(tokens, count) if peek_lock else b"",
    ]


def _received(reply: list[Any], stand: bool) -> Received:
    """One request's answer of receiveSessionMessages: its status, then the messages, and with
    `stand` the sequence numbers of the session's messages in flight before it."""
    check_status(reply[0])
    if not stand:
        return Received(stored_message(r) for r in reply[1:])
    received = Received(stored_message(r) for r in reply[1:-1])
    received.in_flight = reply[-1]
    return received


class SessionCalls(RedisConnection):
    async def accept_session(
        self,
        queue: QueueSpec,
        session_id: str | None,
        holder: str,
        *,
        wait: bool = False,
        count: int = 0,
        mode: ReceiveMode = ReceiveMode.PEEK_LOCK,
        tokens: Sequence[bytes] = (),
        client: str = "",
        waiting: bool = True,
        release: tuple[str, str] | None = None,
        waiter: str | None = None,
    ) -> SessionLock | None:
        check_session_ids([session_id] + ([release[0]] if release else []))
        count = max(count, 0)
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if count and peek_lock and len(tokens) < count:
            raise ValueError("peek-lock needs one token per message")
        reply = await self._run_queue(
            "acceptSession",
            queue,
            holder,
            session_arg(session_id),
            (waiter or 1) if wait else 0,
            1 if peek_lock else 0,
            count,
            token_string(tokens, count) if count and peek_lock else "",
            client,
            1 if waiting else 0,
            *((session_arg(release[0]), release[1]) if release else ()),
        )
        if reply[0] == ScriptStatus.NO_SESSION_AVAILABLE:
            return None
        check_status(reply[0])
        return SessionLock(
            session_id=session_from_reply(reply[1]) or "",
            locked_until_ms=reply[2],
            messages=[stored_message(r) for r in reply[3:]],
        )

    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        *,
        stand: bool = False,
        replace: bool = False,
        recover: bool = False,
    ) -> Received:
        request = _receive_request(session_id, holder, count, mode, tokens, stand, replace, recover)
        # with the receives of other links of the queue that come while one call of them is
        # in flight (busd/storage/redis/coalesce.py): with many sessions held, each woken for a
        # message or two, the call's own cost is most of a receive's
        (reply,) = await self._coalesced.call(
            ("receive", queue), [request], lambda requests: self._receive_sessions(queue, requests)
        )
        return _received(reply, (stand or replace) and mode == ReceiveMode.PEEK_LOCK)

    async def receive_session_part(
        self,
        queue: QueueSpec,
        parts: tuple[QueueSpec, ...],
        partition: int,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        *,
        stand: bool = False,
        replace: bool = False,
        recover: bool = False,
    ) -> Received:
        """`receive_session` on a partitioned queue, the session being in `partition` (of
        `parts`): coalesced over the queue's partitions, so that the receives of many held
        sessions, in many partitions, are one store call per server."""
        request = _receive_request(session_id, holder, count, mode, tokens, stand, replace, recover)
        (reply,) = await self._coalesced.call(
            ("receive", queue),
            [(partition, request)],
            lambda items: self._receive_session_parts(parts, items),
        )
        if isinstance(reply, BaseException):  # its partition's call failed
            raise reply
        return _received(reply, (stand or replace) and mode == ReceiveMode.PEEK_LOCK)

    async def _receive_session_parts(
        self, parts: tuple[QueueSpec, ...], items: list[tuple[int, list[Any]]]
    ) -> list[Any]:
        groups: dict[int, list[int]] = {}
        for i, (p, _) in enumerate(items):
            groups.setdefault(p, []).append(i)
        replies = await self._run_queue_many(
            [
                (
                    "receiveSessionMessages",
                    parts[p],
                    [arg for i in idx for arg in items[i][1]],
                )
                for p, idx in groups.items()
            ]
        )
        out: list[Any] = [None] * len(items)
        for idx, reply in zip(groups.values(), replies):
            for k, i in enumerate(idx):
                out[i] = reply if isinstance(reply, BaseException) else reply[k]
        return out

    async def _receive_sessions(self, queue: QueueSpec, requests: list[list[Any]]) -> list[Any]:
        args = [arg for request in requests for arg in request]
        return list(await self._run_queue("receiveSessionMessages", queue, *args))

    async def renew_session_lock(self, queue: QueueSpec, session_id: str, holder: str) -> int:
        assert self._scripts is not None
        reply = await self._run(
            "renewSessionLock", queue, [holder, session_arg(session_id), queue.lock_duration_ms]
        )
        check_status(reply)
        return reply

    async def release_session(
        self, queue: QueueSpec, session_id: str, holder: str, *, offered: bool = True
    ) -> None:
        await self._run_queue(
            "releaseSession", queue, holder, session_arg(session_id), "", 1 if offered else 0
        )

    async def release_process_locks(self, queue: QueueSpec, id_prefix: str) -> int:
        if not id_prefix:
            raise ValueError("the prefix names the gone process: it cannot be empty")
        # In steps of SWEEP_BUDGET sessions, each its own script call: a queue with many held
        # sessions never blocks the store for long.
        released, cursor = 0, b"0"
        while True:
            cursor, count = await self._run_queue(
                "releaseProcessLocks", queue, id_prefix, cursor, budget=SWEEP_BUDGET
            )
            released += int(count)
            if cursor in (b"0", "0", 0):
                return released

    async def release_process_message_locks(self, queue: QueueSpec, tag: bytes) -> int:
        if len(tag) != 4:
            raise ValueError("a worker's lock token tag is 4 bytes")
        released = 0
        for entity in ("q", "d"):  # the queue and its dead-letter sub-queue
            cursor: Any = b"0"
            while True:  # in steps of SWEEP_BUDGET locks, as release_process_locks
                cursor, count = await self._run_queue(
                    "releaseProcessMessageLocks", queue, entity, tag, cursor, budget=SWEEP_BUDGET
                )
                released += int(count)
                if cursor in (b"0", "0", 0):
                    break
        return released

    async def get_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> bytes | None:
        return (await self.read_session_state(queue, session_id, holder))[0]

    async def read_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> tuple[bytes | None, str | None]:
        reply = await self._run("getSessionState", queue, [holder, session_arg(session_id)])
        check_status(reply[0])
        state = reply[1] if len(reply) > 1 else None
        etag = reply[2] if len(reply) > 2 else None
        return state, as_text(etag)

    async def set_session_state(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        state: bytes | None,
        *,
        if_match: str | None = None,
        if_absent: bool = False,
    ) -> str | None:
        condition, etag = (
            ("absent", "")
            if if_absent
            else (("match", if_match) if if_match is not None else ("", ""))
        )
        args = [
            holder,
            session_arg(session_id),
            0 if state is None else 1,
            b"" if state is None else state,
            condition,
            etag,
        ]
        reply = await self._run("setSessionState", queue, args)
        check_status(reply[0])
        return as_text(reply[1]) if len(reply) > 1 else None

    async def dead_letter_session(
        self, queue: QueueSpec, session_id: str, reason: str, description: str | None
    ) -> int:
        return int(
            await self._run_queue(
                "deadLetterSession", queue, session_arg(session_id), reason, description or ""
            )
        )

    async def resubmit_session(self, queue: QueueSpec, session_id: str) -> tuple[int, int]:
        moved, left = await self._run_queue(
            "resubmitSession", queue, session_arg(session_id), optional_arg(queue.default_ttl_ms)
        )
        return moved, left

    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        reply = await self._run_queue(
            "listSessions", queue, max(skip, 0), top, optional_arg(updated_after_ms)
        )
        return [session_from_reply(sid) or "" for sid in reply]

    async def session_page(
        self,
        queue: QueueSpec,
        sort: str,
        after: str | None,
        top: int,
        preview: int = 32,
    ) -> SessionPage:
        reply = await self._run_queue(
            "sessionPage", queue, sort, after or "", max(top, 1), max(preview, 0), CLASSIFY_CAP
        )
        next_cursor, total = as_text(reply[0]), reply[1]
        page = [_session_detail(row) for row in reply[2:]]
        return SessionPage(page, next_cursor or None, total)

    async def drop_session_lock(self, queue: QueueSpec, session_id: str) -> bool:
        return bool(await self._run_queue("releaseSession", queue, "", session_arg(session_id)))

    async def lose_session_lock(self, queue: QueueSpec, session_id: str) -> bool:
        reply = await self._run_queue("releaseSession", queue, "", session_arg(session_id), "1")
        return bool(reply)


# How many of a session's first messages the inspector reads to tell deferred from scheduled.
CLASSIFY_CAP = 1000


def _session_detail(row: list) -> SessionDetail:
    (
        sid,
        holder,
        locked_until,
        client,
        state_size,
        preview,
        active,
        in_flight,
        deferred,
        scheduled,
        oldest,
        last_activity,
        updated,
        score,
    ) = row
    session_id = session_from_reply(sid) or ""
    stored = as_text(sid) or ""
    return SessionDetail(
        session_id=session_id,
        holder=as_text(holder) if holder else None,
        locked_until_ms=locked_until or None,
        client=(client.decode(errors="replace") if isinstance(client, bytes) else client) or None,
        state_size=state_size,
        state_preview=preview if preview else None,
        active=active,
        in_flight=in_flight,
        deferred=deferred,
        scheduled=scheduled,
        oldest_enqueued_ms=oldest or None,
        last_activity_ms=last_activity,
        state_updated_ms=updated,
        cursor=stored if score is None or score is False else f"{as_text(score)}:{stored}",
    )
