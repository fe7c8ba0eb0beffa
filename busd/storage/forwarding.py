"""What a forwarder exchanges with the store (docs/design.md §3.16): where it moves messages
(`ForwardDestination`), the messages it took (`ForwardedMessage`) and what became of each
(`ForwardResult`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from busd.storage.messages import Placement, StoredMessage
from busd.storage.specs import QueueSpec, TopicSpec


@dataclass(slots=True)
class ForwardDestination:
    """Where a forwarder moves messages: a queue, or a topic with its subscriptions (as
    Store.publish takes them), or neither when it does not exist. `record` is the
    destination's catalog field (`<kind>:<path>`): a message moves only while it exists."""

    record: str
    queue: QueueSpec | None = None
    topic: TopicSpec | None = None
    subscriptions: list[QueueSpec] = field(default_factory=list)


@dataclass(slots=True)
class ForwardedMessage:
    """A message a forwarder took (by its lock token), with what its destination needs to know
    of it: session id and message id (read from the message), and for a topic the copies its
    rules make (None: every subscription, unchanged). `message`: as it was taken (where the
    move is not one script, the store carries it over itself)."""

    token: bytes
    seq: int
    hops: int = 0
    session_id: str | None = None
    message_id: str | None = None
    placements: list[Placement] | None = None
    message: StoredMessage | None = None


class ForwardResult(enum.IntEnum):
    MOVED = 0
    DEAD_LETTERED = 1  # stayed at the source: moved to its dead-letter sub-queue
    DEFERRED = 2  # stayed in the source's dead-letter sub-queue, deferred there
    LOCK_LOST = -1  # the forwarder's lock ended first: left alone
