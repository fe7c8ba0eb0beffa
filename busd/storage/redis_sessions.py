"""The sessions of the Redis/Valkey store: accept (a named or the next available session),
receive from, renew, release, their state, listing them, and dead-lettering and resubmitting
one whole (docs/design.md §3.4, §2.9)."""

from __future__ import annotations

from collections.abc import Sequence

from busd.storage.api import (
    QueueSpec,
    ReceiveMode,
    SessionInfo,
    SessionLock,
    StoredMessage,
)
from busd.storage.redis_codec import (
    ScriptStatus,
    _check,
    _check_session_ids,
    _message,
    _opt,
    _sid,
    _sid_text,
    _text,
    _token_string,
)
from busd.storage.redis_connection import RedisConnection


class SessionCalls(RedisConnection):
    async def accept_session(
        self, queue: QueueSpec, session_id: str | None, holder: str, *, wait: bool = False,
        count: int = 0, mode: ReceiveMode = ReceiveMode.PEEK_LOCK, tokens: Sequence[bytes] = (),
    ) -> SessionLock | None:
        _check_session_ids([session_id])
        count = max(count, 0)
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if count and peek_lock and len(tokens) < count:
            raise ValueError("peek-lock needs one token per message")
        reply = await self._run_queue(
            "acceptSession", queue, holder, _sid(session_id), 1 if wait else 0,
            1 if peek_lock else 0, count,
            _token_string(tokens, count) if count and peek_lock else "",
        )
        if reply[0] == ScriptStatus.NO_SESSION_AVAILABLE:
            return None
        _check(reply[0])
        return SessionLock(session_id=_sid_text(reply[1]) or "", locked_until_ms=reply[2],
                           messages=[_message(r) for r in reply[3:]])

    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
    ) -> list[StoredMessage]:
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if peek_lock and len(tokens) < count:
            raise ValueError("peek-lock needs one token per message")
        reply = await self._run_queue(
            "receiveSessionMessages",
            queue,
            holder,
            _sid(session_id),
            1 if peek_lock else 0,
            max(count, 0),
            *((_token_string(tokens, count),) if peek_lock else ()),
        )
        _check(reply[0])
        return [_message(r) for r in reply[1:]]

    async def renew_session_lock(self, queue: QueueSpec, session_id: str, holder: str) -> int:
        assert self._scripts is not None
        reply = await self._run(
            "renewSessionLock", queue, [holder, _sid(session_id), queue.lock_duration_ms]
        )
        _check(reply)
        return reply

    async def release_session(self, queue: QueueSpec, session_id: str, holder: str) -> None:
        await self._run_queue("releaseSession", queue, holder, _sid(session_id))

    async def get_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> bytes | None:
        return (await self.read_session_state(queue, session_id, holder))[0]

    async def read_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> tuple[bytes | None, str | None]:
        reply = await self._run("getSessionState", queue, [holder, _sid(session_id)])
        _check(reply[0])
        state = reply[1] if len(reply) > 1 else None
        etag = reply[2] if len(reply) > 2 else None
        return state, _text(etag)

    async def set_session_state(
        self, queue: QueueSpec, session_id: str, holder: str, state: bytes | None, *,
        if_match: str | None = None, if_absent: bool = False,
    ) -> str | None:
        condition, etag = ("absent", "") if if_absent else (
            ("match", if_match) if if_match is not None else ("", ""))
        args = [holder, _sid(session_id), 0 if state is None else 1,
                b"" if state is None else state, condition, etag]
        reply = await self._run("setSessionState", queue, args)
        _check(reply[0])
        return _text(reply[1]) if len(reply) > 1 else None

    async def dead_letter_session(
        self, queue: QueueSpec, session_id: str, reason: str, description: str | None
    ) -> int:
        return int(await self._run_queue(
            "deadLetterSession", queue, _sid(session_id), reason, description or ""))

    async def resubmit_session(self, queue: QueueSpec, session_id: str) -> tuple[int, int]:
        moved, left = await self._run_queue(
            "resubmitSession", queue, _sid(session_id), _opt(queue.default_ttl_ms))
        return moved, left

    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        reply = await self._run_queue(
            "listSessions", queue, max(skip, 0), top, _opt(updated_after_ms)
        )
        return [_sid_text(sid) or "" for sid in reply]

    async def session_infos(self, queue: QueueSpec) -> list[SessionInfo]:
        return [
            SessionInfo(
                session_id=_sid_text(sid) or "",
                message_count=count,
                locked_until_ms=locked_until,
                state_size=state_size,
                updated_ms=updated,
            )
            for sid, count, locked_until, state_size, updated in await self._run(
                "sessionInfos", queue, []
            )
        ]
