"""Between api types and the Lua scripts' arguments and replies: session ids, stored-message
rows, optional arguments, lock tokens, placements, and the scripts' status codes, which end
here (callers get a Condition or a BusdError)."""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any

from busd.errors import BusdError, Condition, refusal
from busd.storage.messages import (
    LockTokens,
    MessageState,
    NewMessage,
    Placement,
    Settlement,
    StoredMessage,
)
from busd.storage.specs import QueueSpec, TopicSpec


def as_text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


# Service Bus takes "" for a session id, but the scripts read '' as "no session": the store
# keeps the empty id as NUL, which no other id contains (check_session_ids).
_EMPTY_SESSION = "\0"


def session_arg(session_id: str | None) -> str:
    """A session id as the scripts take it: '' for none, NUL for the empty id."""
    if session_id is None:
        return ""
    return session_id or _EMPTY_SESSION


def session_from_reply(value: bytes | str | None) -> str | None:
    """A session id the scripts returned, the empty id given back as ""."""
    text = as_text(value)
    return "" if text == _EMPTY_SESSION else text


_STATES = tuple(MessageState)  # by value: indexing is cheaper than an enum lookup per message


def stored_message(row: list[Any]) -> StoredMessage:
    if len(row) != 12:
        return _forwarded_message(row)
    seq, blob, dc, enq, sid, token, locked_until, expires, state, reason, desc, patch = row
    return StoredMessage(
        seq=seq,
        blob=blob,
        delivery_count=dc,
        enqueued_ms=enq,
        session_id=session_from_reply(sid),
        lock_token=token,
        locked_until_ms=locked_until,
        expires_ms=expires,
        state=_STATES[state],
        dead_letter_reason=as_text(reason),
        dead_letter_description=as_text(desc),
        properties_patch=patch,
    )


_LENGTH = struct.Struct(">I")
_FIELDS = struct.Struct(">H")


def wake_payload(data: bytes) -> tuple[str, list[StoredMessage]]:
    """A wake-up as published on a process's channel: the id of the waiter or holder woken,
    and the delivery rows of messages a send handed over to it (a holder's standing offer,
    lua/sendMessages.lua), packed by lua/includes/packRows.lua after a newline."""
    cut = data.find(b"\n")
    if cut < 0:
        return data.decode(), []
    return data[:cut].decode(), [stored_message(row) for row in _unpack_rows(data, cut + 1)]


def _unpack_rows(data: bytes, at: int) -> list[list[Any]]:
    rows = []
    end = len(data)
    while at < end:
        (fields,) = _FIELDS.unpack_from(data, at)
        at += 2
        row: list[Any] = []
        for _ in range(fields):
            tag = data[at]
            at += 1
            if tag == 0x46:  # 'F': false, a null reply
                row.append(None)
                continue
            (size,) = _LENGTH.unpack_from(data, at)
            at += 4
            value = data[at : at + size]
            at += size
            row.append(int(value) if tag == 0x4E else value)  # 'N' an integer, 'S' bytes
        rows.append(row)
    return rows


def _forwarded_message(row: list[Any]) -> StoredMessage:
    """A row with what forwarding recorded (lua/includes/deliveryRow.lua), and from a
    forwarder's take (lua/forwardTake.lua) the hop count."""
    message = stored_message(row[:12])
    message.enqueue_seq = row[12] or None
    message.dead_letter_source = as_text(row[13]) or None
    if len(row) > 14:
        message.hops = row[14]
    return message


def effective_ttl(queue: QueueSpec | TopicSpec, message: NewMessage) -> int | None:
    limits = [t for t in (message.ttl_ms, queue.default_ttl_ms) if t is not None]
    return min(limits) if limits else None


def entity_kind(entity: QueueSpec) -> str:
    return "d" if entity.dlq else "q"


def optional_arg(value: Any) -> Any:
    """Scripts take '' for an absent optional argument."""
    return "" if value is None else value


def token_string(tokens: Sequence[bytes], count: int) -> bytes:
    """The first `count` lock tokens as the scripts take them: one argument, 16 bytes per token
    (lua/includes/tokenAt.lua), instead of one argument per message."""
    if type(tokens) is LockTokens:
        return tokens.packed[: 16 * count]
    tokens = tokens[:count]
    if not all(map((16).__eq__, map(len, tokens))):
        raise ValueError("lock tokens are 16 bytes")
    return b"".join(tokens)


def check_session_ids(ids: Any) -> None:
    """Refuse a NUL in a session id: the keys separate ids from sequence numbers with NUL, so
    such an id would reach another session's messages (docs/design.md §2.2). The broker
    refuses them first; this keeps the store safe from any caller."""
    for sid in ids:
        if sid is not None and "\0" in sid:
            raise BusdError(
                Condition.ARGUMENT_OUT_OF_RANGE, "A session id must not contain a NUL character."
            )


class ScriptStatus(enum.IntEnum):
    """Status codes the Lua scripts return (negative: refused; see each script's header). They
    end here: callers get a Condition or a BusdError."""

    OK = 0
    MESSAGE_LOCK_LOST = -1
    SESSION_LOCK_LOST = -2
    SESSION_CANNOT_BE_LOCKED = -3
    MESSAGE_NOT_FOUND = -4
    NO_SESSION_AVAILABLE = -5
    UNKNOWN_ENTITY = -10
    TRANSACTION_TIMEOUT = -11
    RESOURCE_LIMIT = -12
    PRECONDITION_FAILED = -13


_CONDITIONS = {
    ScriptStatus.MESSAGE_LOCK_LOST: Condition.MESSAGE_LOCK_LOST,
    ScriptStatus.SESSION_LOCK_LOST: Condition.SESSION_LOCK_LOST,
    ScriptStatus.SESSION_CANNOT_BE_LOCKED: Condition.SESSION_CANNOT_BE_LOCKED,
    ScriptStatus.MESSAGE_NOT_FOUND: Condition.MESSAGE_NOT_FOUND,
    ScriptStatus.TRANSACTION_TIMEOUT: Condition.TRANSACTION_TIMEOUT,
    ScriptStatus.RESOURCE_LIMIT: Condition.RESOURCE_LIMIT,
    ScriptStatus.PRECONDITION_FAILED: Condition.PRECONDITION_FAILED,
}


def refused_condition(status: int) -> Condition | None:
    return None if status >= 0 else _CONDITIONS[ScriptStatus(status)]


def check_status(status: int) -> None:
    if status < 0:
        raise refusal(_CONDITIONS[ScriptStatus(status)])


def settlement_fields(s: Settlement, holder: str | None) -> list[Any]:
    """A settlement as settleMessages (and a staged one as commitTransaction) takes it."""
    return [
        s.token,
        s.outcome.value,
        session_arg(s.session_id),
        optional_arg(s.dead_letter_reason),
        optional_arg(s.dead_letter_description),
        optional_arg(s.properties_patch),
        optional_arg(holder),
    ]


def placement_fields(c: Placement) -> list[Any]:
    """A copy's fields after its subscription, as lua/includes/fanOutMessage.lua reads them."""
    flags = (
        (1 if c.blob is not None else 0)
        | (2 if c.own_session_id else 0)
        | (4 if c.own_ttl else 0)
        | (8 if c.dead_letter is not None else 0)
    )
    reason, description = c.dead_letter or ("", "")
    return [
        flags,
        optional_arg(c.blob),
        session_arg(c.session_id),
        optional_arg(c.ttl_ms),
        reason,
        description,
    ]


def placement_args(copies: list[Placement] | None) -> list[Any]:
    """A message's placements as lua/includes/fanOutMessage.lua takes them: their number (-1:
    every subscription, unchanged), then the subscription and fields of each."""
    if copies is None:
        return [-1]
    args: list[Any] = [len(copies)]
    for c in copies:
        if c.own_session_id:
            check_session_ids([c.session_id])
        args += [c.subscription + 1, *placement_fields(c)]
    return args
