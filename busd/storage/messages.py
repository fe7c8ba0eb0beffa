"""Messages as the store takes and hands them back: sent (`NewMessage`), stored and received
(`StoredMessage`), a topic's copies (`Placement`), a send's hand-over to a holder (`HandOver`,
`Sent`), their lock tokens and their settlement (`Outcome`, `Settlement`)."""

from __future__ import annotations

import enum
import hashlib
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Bytes 9 to 12 of every lock token a worker of `busd serve --workers` hands out: its parent's
# mark of the worker (`token_tag`), by which the parent finds the message locks of a worker
# that died and ends them at once (lua/releaseProcessMessageLocks.lua) instead of when they
# run out. The first 8 bytes are the message's sequence number (lua/includes/lockToken.lua),
# the last one a partitioned entity's partition; None (a single busd): all random.
_token_tag: bytes | None = None
TAG_AT = 8  # where the tag starts in a token
TAG_BYTES = 4


def token_tag(id_prefix: str) -> bytes:
    """The tag of the lock tokens of the worker whose process ids start with `id_prefix`."""
    return hashlib.blake2b(id_prefix.encode(), digest_size=TAG_BYTES).digest()


def tag_lock_tokens(tag: bytes | None) -> None:
    """Mark every lock token this process hands out from now with `tag` (None: no mark)."""
    global _token_tag
    assert tag is None or len(tag) == TAG_BYTES
    _token_tag = tag


class LockTokens(Sequence[bytes]):
    """`count` random lock tokens from one read of the system's random source, kept as the one
    string of 16 bytes each that the store sends: a receive asks for as many as its credit
    (often far more than it takes), so neither a list nor its join is built per call. A
    worker's tokens carry its tag (`tag_lock_tokens`), written into every token by one
    slice assignment per call."""

    __slots__ = ("packed",)

    def __init__(self, count: int) -> None:
        if _token_tag is None:
            self.packed = os.urandom(16 * count)
            return
        packed = bytearray(os.urandom(16 * count))
        memoryview(packed).cast("I")[TAG_AT // 4 :: 4] = array("I", _token_tag) * count
        self.packed = bytes(packed)

    def __len__(self) -> int:
        return len(self.packed) // 16

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.packed[16 * i : 16 * i + 16] for i in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.packed[16 * index : 16 * index + 16]


@dataclass(slots=True)
class Placement:
    """One copy of a message sent to a topic, as the subscriptions' rules decided it: in
    subscription `subscription` (an index into the call's subscriptions), with its own blob,
    session id or time to live where an action changed them (the message's own when None,
    unless the matching `own_*` flag is set), or filed straight in that subscription's
    dead-letter sub-queue with `dead_letter` = (reason, description)."""

    subscription: int
    blob: bytes | None = None
    session_id: str | None = None
    own_session_id: bool = False
    ttl_ms: int | None = None
    own_ttl: bool = False
    dead_letter: tuple[str, str] | None = None


class ReceiveMode(enum.IntEnum):
    PEEK_LOCK = 1
    RECEIVE_AND_DELETE = 0


class MessageState(enum.IntEnum):
    """Values of the `x-opt-message-state` annotation."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class Outcome(enum.Enum):
    COMPLETE = "complete"  # delete
    ABANDON = "abandon"  # unlock, delivery count + 1 (dead-lettered past its delivery limit)
    DEFER = "defer"  # unlock, hide until fetched by sequence number
    DEAD_LETTER = "dead-letter"  # move to the DLQ with reason and description
    RELEASE = "release"  # unlock, delivery count unchanged (AMQP `released`)


@dataclass(slots=True)
class NewMessage:
    """A message as the broker hands it to the store on send."""

    blob: bytes  # opaque stored form (busd.amqp.codec); the store never looks inside
    session_id: str | None = None
    message_id: str | None = None  # for duplicate detection
    ttl_ms: int | None = None  # the sender's header.ttl; capped by QueueSpec.default_ttl_ms
    scheduled_ms: int | None = None  # x-opt-scheduled-enqueue-time: invisible until then
    partition_key: str | None = None  # x-opt-partition-key: a partitioned entity's partition


@dataclass(slots=True)
class StoredMessage:
    """A message as the store hands it back (received, peeked or fetched by sequence number)."""

    seq: int
    blob: bytes
    delivery_count: int
    enqueued_ms: int
    session_id: str | None = None
    lock_token: bytes | None = None  # set when locked by this call (peek-lock)
    locked_until_ms: int | None = None  # set when locked
    expires_ms: int | None = None
    state: MessageState = MessageState.ACTIVE
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    properties_patch: bytes | None = None  # opaque, from Settlement.properties_patch
    # A forwarded message (docs/design.md §3.16): the number first given to it, at the entity
    # it was first sent to; the entity whose dead-letter sub-queue it was forwarded from.
    enqueue_seq: int | None = None
    dead_letter_source: str | None = None
    hops: int = 0  # how many times it was forwarded (forwarders only: Store.take_forwarding)


@dataclass(frozen=True, slots=True)
class HandOver:
    """An offer with a send: the sending process's own receiver `holder`, which holds session
    `session_id` and has credit, takes at most `count` of the sent messages of that session at
    once, locked under `tokens` (docs/design.md §3.5). The rest is filed as usual."""

    session_id: str
    holder: str
    count: int
    tokens: Sequence[bytes]


class Received(list[StoredMessage]):
    """What a session receive took (busd.storage.api Store.receive_session), and with `stand`
    the sequence numbers of the session's messages in flight under the holder's lock before
    it took any (`in_flight`)."""

    in_flight: Sequence[int] = ()


@dataclass(slots=True)
class Sent:
    """What `Store.send_handing_over` did: the sequence number of each message (0 for a
    duplicate dropped), and per offer, in the offers' order, the messages handed over to its
    holder, in order."""

    seqs: list[int]
    handed: list[list[StoredMessage]]


@dataclass(slots=True)
class Settlement:
    token: bytes  # the lock token of the delivery being settled
    outcome: Outcome
    session_id: str | None = None  # set for session messages: the lock checked is the session's
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    properties_patch: bytes | None = None  # opaque (codec-encoded application-properties changes)
