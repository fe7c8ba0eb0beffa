"""The operations of a transaction as the store keeps them until it is discharged
(docs/design.md §3.15): sends, topic sends, settlements, session state, cancellations."""

from __future__ import annotations

from dataclasses import dataclass

from busd.storage.messages import NewMessage, Placement, Settlement
from busd.storage.specs import QueueSpec, TopicSpec


@dataclass(slots=True)
class StagedSend:
    """A message sent in a transaction: enqueued at its commit, under `seq` when one was
    reserved for it (a scheduled message's number is answered at once)."""

    queue: QueueSpec
    message: NewMessage
    seq: int | None = None


@dataclass(slots=True)
class StagedPublish:
    """A message sent to a topic in a transaction: fanned out at its commit to the copies its
    subscriptions' rules made of it when it was staged (`placements`, whose indexes are into
    `subscriptions`: the topic's subscriptions' own names then), under `seq` when one was
    reserved for it. A subscription deleted since gets nothing; one created since, nothing."""

    topic: TopicSpec
    message: NewMessage
    subscriptions: list[str]
    placements: list[Placement]
    seq: int | None = None


@dataclass(slots=True)
class StagedSettlement:
    """A settlement made in a transaction: applied at its commit, if its lock is still live."""

    entity: QueueSpec
    settlement: Settlement
    holder: str | None = None  # the receiver settling: a session message's lock must be its


@dataclass(slots=True)
class StagedSessionState:
    """Session state set in a transaction: written at its commit, if the holder still holds
    the session."""

    queue: QueueSpec
    session_id: str
    holder: str
    state: bytes | None  # None clears it


@dataclass(slots=True)
class StagedCancel:
    """A scheduled message cancelled in a transaction: removed at its commit (from every
    subscription, for a topic)."""

    queue: QueueSpec | TopicSpec
    seq: int


StagedOperation = StagedSend | StagedPublish | StagedSettlement | StagedSessionState | StagedCancel
