"""Admission and delivery: the one place that decides whether a message may enter an entity,
and the one place that builds what a client receives from what the store holds.

Every path that stores a message calls `admit` (a sender link's transfers, `$management`
schedule-message, the operator's send), and every path that hands one out calls
`delivery_payload` (receiver links, peek, receive-by-sequence-number, the operator's peek),
so the rules of docs/design.md §2.2 cannot drift between them.
"""

from __future__ import annotations

from busd.amqp import codec
from busd.errors import BusdError, Condition
from busd.storage.messages import LockTokens, NewMessage, StoredMessage
from busd.storage.specs import QueueSpec, TopicSpec

# Service Bus: SessionId and ReplyToSessionId are at most 128 characters (docs/design.md §2.2).
MAX_SESSION_ID_LENGTH = 128


def check_size(entity: QueueSpec | TopicSpec, size: int) -> None:
    if size > entity.max_message_size:
        raise BusdError(
            Condition.MESSAGE_SIZE_EXCEEDED,
            f"The message of {size} bytes exceeds the limit of {entity.max_message_size} bytes "
            f"of '{entity.name}'.",
        )


def check_session_id(session_id: str | None, what: str = "session id") -> None:
    """At most 128 characters and no NUL: the store's keys separate ids with NUL, so an id with
    one would reach another session's messages (docs/design.md §2.2, §3.4)."""
    if session_id is not None and (len(session_id) > MAX_SESSION_ID_LENGTH or "\0" in session_id):
        raise BusdError(
            Condition.ARGUMENT_OUT_OF_RANGE,
            f"The {what} must be at most {MAX_SESSION_ID_LENGTH} characters and contain no NUL "
            "character.",
        )


def admit(
    entity: QueueSpec | TopicSpec, incoming: codec.IncomingMessage, session_id: str | None = None
) -> NewMessage:
    """The message to store for `incoming` (parsed by busd.amqp.incoming), or the BusdError the
    client should see. `session_id`: one given beside the message (schedule-message's
    `session-id`), used when the message carries no group-id. The caller checks the size
    (`check_size`) of what arrived: a whole transfer may hold a batch of messages."""
    if incoming.session_id is not None:
        session_id = incoming.session_id
    check_session_id(session_id)
    check_session_id(incoming.reply_to_session_id, "reply-to session id")
    if isinstance(entity, TopicSpec):
        pass  # each subscription decides (a session subscription dead-letters a message
        # without one: docs/design.md §2.13)
    elif entity.requires_session:
        if session_id is None:  # "" is a session id, as in Service Bus
            raise BusdError(
                Condition.NOT_ALLOWED,
                f"The SessionId was not set on a message, and it cannot be sent to "
                f"'{entity.name}', which requires sessions.",
            )
    else:
        session_id = None  # a plain queue ignores group-id (it stays in the message)
    return NewMessage(
        blob=incoming.blob,
        session_id=session_id,
        message_id=incoming.message_id,
        ttl_ms=incoming.ttl_ms,
        scheduled_ms=incoming.scheduled_ms,
        partition_key=incoming.partition_key,
    )


def parse(payload: bytes) -> list[codec.IncomingMessage]:
    """The messages of one transfer: one message, or each of a batch envelope (format
    0x80013700); DECODE_ERROR when it is malformed."""
    try:
        return codec.parse_transfer(payload)
    except codec.CodecError as exc:
        raise BusdError(Condition.DECODE_ERROR, f"Malformed message: {exc}") from None


def parse_one(payload: bytes) -> codec.IncomingMessage:
    try:
        return codec.parse_incoming(payload)
    except codec.CodecError as exc:
        raise BusdError(Condition.DECODE_ERROR, f"Malformed message: {exc}") from None


def delivery_payload(message: StoredMessage, *, locked: bool = True, state: bool = False) -> bytes:
    """The message as a client receives it: the stored form with the broker's annotations
    (docs/wire.md §6.3). `locked`: include the lock expiry and the lock token (peek-lock);
    `state`: include `x-opt-message-state` (peek, receive-by-sequence-number)."""
    return codec.encode_delivery(
        message.blob,
        seq=message.seq,
        enqueued_ms=message.enqueued_ms,
        delivery_count=message.delivery_count,
        locked_until_ms=message.locked_until_ms if locked else None,
        lock_token=message.lock_token if locked else None,
        message_state=int(message.state) if state else None,
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_description=message.dead_letter_description,
        properties_patch=message.properties_patch,
        enqueue_seq=message.enqueue_seq,
        dead_letter_source=message.dead_letter_source,
    )


def new_tokens(count: int) -> LockTokens:
    """`count` random 16-byte lock tokens from one read of the system's random source."""
    return LockTokens(count)
