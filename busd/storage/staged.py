"""The operations of a transaction as the store keeps them until it is discharged
(docs/design.md §3.15): sends, topic sends, settlements, session state, cancellations."""

from __future__ import annotations

from dataclasses import dataclass

from busd.storage.messages import NewMessage, Placement, Settlement
from busd.storage.partitioned.routing import partition_of_key, partition_of_seq, partition_of_token
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
Spec = QueueSpec | TopicSpec


def placed(op: StagedOperation, entity: Spec, via: Spec | None) -> Spec:
    """The partition of the partitioned queue or topic `entity` that a transaction's operation
    works in, found as the partitioned store finds a call's (docs/design.md §3.18): by its lock
    token, session id or sequence number, else its message's partition key. A send without
    either goes to the transaction's partition (`via`'s, once it works in this entity), else
    to its message id's, as in Service Bus: a transaction stays in one partition."""
    count = entity.partitions
    assert count
    current = None
    if via is not None and via.partition is not None:  # in this entity's partition?
        if via.key_scope[0] == entity.partition_spec(via.partition).key_scope[0]:
            current = via.partition
    return entity.partition_spec(_partition(op, count, current))


def _partition(op: StagedOperation, count: int, current: int | None) -> int:
    if isinstance(op, StagedSettlement):
        return partition_of_token(op.settlement.token, count)
    if isinstance(op, StagedSessionState):
        return partition_of_key(op.session_id, count)
    if isinstance(op, (StagedCancel, StagedSend, StagedPublish)) and op.seq is not None:
        return partition_of_seq(op.seq, count)
    if isinstance(op, (StagedSend, StagedPublish)):
        m = op.message
        key = m.session_id if m.session_id is not None else m.partition_key
        if key is not None:
            return partition_of_key(key, count)
        if current is not None:
            return current
        return partition_of_key(m.message_id, count) if m.message_id is not None else 0
    return current or 0
