"""The Store on Redis or Valkey: every method is one Lua script call (lua/*.lua).

This module only turns Store calls into KEYS/ARGV and script replies into api types; the
semantics live in the scripts. Nothing here holds queue state, so any number of broker
processes can share one server. The connection, its URLs and the call limiter are
busd/storage/redis_connection.py; the conversions both ways busd/storage/redis_codec.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from busd.errors import BusdError, Condition
from busd.storage import keys as keyspace
from busd.storage.api import (
    ForwardDestination,
    ForwardedMessage,
    ForwardResult,
    QueueSpec,
    StagedCancel,
    StagedOperation,
    StagedPublish,
    StagedSend,
    StagedSessionState,
    StagedSettlement,
    StoredMessage,
    SweepResult,
    TopicSpec,
)
from busd.storage.call_limiter import CALL_WAIT_S
from busd.storage.redis_catalog import CatalogCalls
from busd.storage.redis_codec import (
    ScriptStatus,
    _check,
    _check_session_ids,
    _effective_ttl,
    _entity,
    _message,
    _opt,
    _placement_args,
    _placement_fields,
    _sid,
    _sid_text,
    _token_string,
)
from busd.storage.redis_connection import (
    DEFAULT_MAX_CALLS,
    SWEEP_BUDGET,
    _cluster_url,
    _sentinel_url,
)
from busd.storage.redis_messages import MessageCalls
from busd.storage.redis_sessions import SessionCalls

__all__ = ["RedisStore", "_cluster_url", "_sentinel_url"]

log = logging.getLogger("busd.storage")

# A process that has not swept for this long counts as gone: its waiters are dropped.
LIVENESS_MS = 15_000
# Most waiters of one kind a sweep wakes where work and waiters meet (lost wake-ups).
REPAIR_WAKES = 16


# Why a message that cannot be forwarded stays at its source (lua/forwardMessages.lua keeps
# the same words for a single server's move).
FORWARD_HOPS_REASON = "MaxTransferHopCountExceeded"
FORWARD_HOPS_DESCRIPTION = ("The maximum number of allowed hops when forwarding between queues "
                            "has been exceeded. This value is set to 4.")
FORWARD_GONE_REASON = "MessagingEntityNotFound"


class RedisStore(CatalogCalls, MessageCalls, SessionCalls):
    def __init__(
        self, url: str, prefix: str = "busd", *, max_calls: int = DEFAULT_MAX_CALLS,
        durability: str = "local",
    ) -> None:
        super().__init__(url, prefix, max_calls=max_calls, durability=durability,
                         call_wait_s=CALL_WAIT_S)

    # --- auto-forwarding (docs/design.md §3.16) ---------------------------------------------
    async def take_forwarding(
        self, entity: QueueSpec, forwarder: str, count: int, tokens: Sequence[bytes]
    ) -> list[StoredMessage] | None:
        if count <= 0:
            return []
        if len(tokens) < count:
            raise ValueError("a forwarder takes one token per message")
        reply = await self._run_queue("forwardTake", entity, _entity(entity), forwarder, count,
                                      _token_string(tokens, count))
        if reply[0] != 0:
            return None
        return [_message(r) for r in reply[1:]]

    async def forward(
        self, entity: QueueSpec, destination: ForwardDestination,
        messages: list[ForwardedMessage], *, hop_limit: int,
    ) -> list[ForwardResult]:
        if not messages:
            return []
        _check_session_ids(m.session_id for m in messages)
        if not self.cross_slot_transactions:
            return await self._forward_in_steps(entity, destination, messages, hop_limit)
        assert self._scripts is not None
        keys = list(self._keys_for("forwardMessages", entity))
        keys.append(keyspace.catalog_key(self.prefix).encode())
        args: list[Any] = self._queue_args(entity) + [
            _entity(entity), destination.record, hop_limit]
        if destination.queue is not None:
            queue = destination.queue
            entity_name, subscription = queue.key_scope
            keys += [k.encode() for k in keyspace.keys(self.prefix, entity_name,
                                                        keyspace.QUEUE_KEYS, subscription)]
            args += ["q", *self._queue_args(queue), queue.duplicate_detection_window_ms or 0,
                     1 if queue.requires_session else 0, _opt(queue.default_ttl_ms)]
        elif destination.topic is not None:
            topic, subs = destination.topic, destination.subscriptions
            names = tuple(sub.subscription or "" for sub in subs)
            keys += self._topic_keys("publishMessages", topic.name, names)
            args += ["t", topic.name, len(subs)]
            for sub, name in zip(subs, names):
                args += self._queue_args(sub)
                args[-6] = name  # the subscription's own name: what `subs` holds
            args.append(topic.duplicate_detection_window_ms or 0)
            for sub in subs:
                args += [1 if sub.requires_session else 0, _opt(sub.default_ttl_ms)]
        else:
            args.append("")
        for m in messages:
            args += [m.token, _sid(m.session_id), _opt(m.message_id)]
            args += _placement_args(m.placements)
        await self._acquire()
        try:
            reply = await self._scripts.run("forwardMessages", keys, args)
        finally:
            self._slots.release()
        return [ForwardResult(r) for r in reply]

    async def _forward_in_steps(
        self, entity: QueueSpec, destination: ForwardDestination,
        messages: list[ForwardedMessage], hop_limit: int,
    ) -> list[ForwardResult]:
        """A move on a Redis Cluster: enqueue at the destination, recorded there so that a
        repeat is a no-op (lua/forwardEnqueue.lua, lua/forwardPublish.lua); delete at the
        source (lua/forwardSettle.lua); then forget the records of what the source deleted.
        A forwarder that dies in between leaves its messages locked at the source: they come
        back and move again, and the destination's records keep them from arriving twice."""
        gone = destination.queue is None and destination.topic is None
        settle: list[Any] = []
        moving: list[ForwardedMessage] = []
        at: list[int] = []  # the index of each moving message among `messages`
        for i, m in enumerate(messages):
            if gone:
                name = destination.record.partition(":")[2]
                settle += [m.token, FORWARD_GONE_REASON,
                           f"The forwarding destination '{name}' does not exist."]
            elif m.hops >= hop_limit:
                settle += [m.token, FORWARD_HOPS_REASON, FORWARD_HOPS_DESCRIPTION]
            else:
                moving.append(m)
                at.append(i)
                settle += [m.token, "", ""]
        records = [self._forward_record(entity, m) for m in moving]
        if moving:
            await self._forward_enqueue(entity, destination, moving, records, [])
        results = [ForwardResult(r) for r in await self._run_queue(
            "forwardSettle", entity, _entity(entity), *settle)]
        done = [record for record, i in zip(records, at) if results[i] == ForwardResult.MOVED]
        if done:
            await self._forward_enqueue(entity, destination, [], [], done)
        return results

    @staticmethod
    def _forward_record(entity: QueueSpec, m: ForwardedMessage) -> str:
        """What names a forwarded message at its destination: its source, number and
        enqueued time there (a source deleted and created again reuses numbers)."""
        taken = m.message
        assert taken is not None, "on a Redis Cluster a move carries the message it moves"
        return f"\0fwd:{entity.path}:{taken.seq}:{taken.enqueued_ms}"

    async def _forward_enqueue(
        self, entity: QueueSpec, destination: ForwardDestination,
        moving: list[ForwardedMessage], records: list[str], forget: list[str],
    ) -> None:
        per_message: list[Any] = []
        for m, record in zip(moving, records):
            taken = m.message
            assert taken is not None
            ttl = None if taken.expires_ms is None else taken.expires_ms - taken.enqueued_ms
            dead = entity.dlq
            per_message += [
                record, taken.blob, _sid(m.session_id), _opt(m.message_id),
                taken.enqueue_seq or taken.seq, m.hops + 1, entity.name if dead else "",
                _opt(taken.dead_letter_reason if dead else None),
                _opt(taken.dead_letter_description if dead else None),
                _opt(taken.properties_patch), _opt(ttl),
            ]
            if destination.topic is not None:
                per_message += _placement_args(m.placements)
        if destination.queue is not None:
            queue = destination.queue
            await self._run_queue(
                "forwardEnqueue", queue, queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0, _opt(queue.default_ttl_ms),
                len(forget), *forget, *per_message)
            return
        assert destination.topic is not None
        topic, subs = destination.topic, destination.subscriptions
        args: list[Any] = [topic.duplicate_detection_window_ms or 0]
        for sub in subs:
            args += [1 if sub.requires_session else 0, _opt(sub.default_ttl_ms)]
        args += [len(forget), *forget, *per_message]
        await self._run_topic("forwardPublish", topic.name, subs, args)

    # --- housekeeping ---------------------------------------------------------------------

    async def sweep(self, queue: QueueSpec) -> SweepResult:
        reply = await self._run_queue(
            "sweepQueue", queue, self.process_id, LIVENESS_MS, REPAIR_WAKES, budget=SWEEP_BUDGET
        )
        return SweepResult(
            expired_message_locks=reply[0],
            expired_messages=reply[1],
            activated_scheduled=reply[2],
            expired_session_locks=[_sid_text(sid) or "" for sid in reply[3:]],
        )

    # --- transactions (docs/design.md §3.15) ----------------------------------------------
    async def stage_transaction(
        self, via: QueueSpec | TopicSpec, txn_id: bytes, operations: list[StagedOperation], *,
        first: bool, timeout_ms: int, limit: int,
    ) -> tuple[int, int]:
        _check_session_ids(_staged_session_ids(operations))
        args: list[Any] = [txn_id, timeout_ms, limit, 1 if first else 0, len(operations)]
        for op in operations:
            fields = _staged_fields(op)
            args.append(len(fields))
            args += fields
        reply = await self._run("stageTransaction", via, args)
        if reply[0] == ScriptStatus.TRANSACTION_TIMEOUT:
            raise BusdError(Condition.TRANSACTION_TIMEOUT, "The transaction timed out.")
        if reply[0] == ScriptStatus.RESOURCE_LIMIT:
            raise BusdError(
                Condition.RESOURCE_LIMIT,
                f"A transaction cannot hold more than {limit} operations.",
            )
        return reply[0], reply[1]

    async def commit_transaction(
        self, via: QueueSpec | TopicSpec, others: list[QueueSpec], txn_id: bytes,
        topics: Sequence[tuple[TopicSpec, list[QueueSpec]]] = (),
    ) -> None:
        queues = ([via] if isinstance(via, QueueSpec) else []) + list(others)
        keys = list(self._keys_for("commitTransaction", via))
        args: list[Any] = [txn_id, len(keyspace.QUEUE_KEYS), len(queues)]
        for queue in queues:
            keys += self._keys_for("sendMessages", queue)
            args += self._queue_args(queue) + [
                queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0,
            ]
        args.append(len(topics))
        for topic, subscriptions in topics:
            names = tuple(s.subscription or "" for s in subscriptions)
            keys += self._topic_keys("publishMessages", topic.name, names)
            args += [topic.name, len(subscriptions)]
            for spec, name in zip(subscriptions, names):
                args += [name] + self._queue_args(spec)[1:]
            args.append(topic.duplicate_detection_window_ms or 0)
            for spec in subscriptions:
                args += [1 if spec.requires_session else 0, _opt(spec.default_ttl_ms)]
        assert self._scripts is not None
        await self._acquire()
        try:
            reply = await self._scripts.run("commitTransaction", keys, args)
        finally:
            self._slots.release()
        status = reply[0]
        if status == ScriptStatus.OK:
            return
        if status == ScriptStatus.TRANSACTION_TIMEOUT:
            raise BusdError(Condition.TRANSACTION_TIMEOUT, "The transaction timed out.")
        if status == ScriptStatus.UNKNOWN_ENTITY:
            raise BusdError(Condition.TRANSACTION_ROLLBACK,
                            "The transaction names an entity it was not committed with.")
        _check(status)

    async def reserve_sequence_numbers(
        self, queue: QueueSpec | TopicSpec, count: int
    ) -> list[int]:
        if count <= 0:
            return []
        last = await self._run("reserveSequenceNumbers", queue, [count])
        return list(range(last - count + 1, last + 1))

    async def discard_transaction(self, via: QueueSpec | TopicSpec, txn_id: bytes) -> None:
        await self._run("discardTransaction", via, [txn_id])

    async def sweep_transactions(self, queue: QueueSpec | TopicSpec) -> int:
        return await self._run("sweepTransactions", queue, [SWEEP_BUDGET])


def _staged_session_ids(operations: list[StagedOperation]) -> list[str | None]:
    ids: list[str | None] = []
    for op in operations:
        if isinstance(op, (StagedSend, StagedPublish)):
            ids.append(op.message.session_id)
            if isinstance(op, StagedPublish):
                ids += [c.session_id for c in op.placements if c.own_session_id]
        elif isinstance(op, StagedSettlement):
            ids.append(op.settlement.session_id)
        elif isinstance(op, StagedSessionState):
            ids.append(op.session_id)
    return ids


def _staged_fields(op: StagedOperation) -> list[Any]:
    """The record lua/stageTransaction-2.lua keeps per operation (the kinds and fields of
    lua/commitTransaction.lua)."""
    if isinstance(op, StagedSend):
        m = op.message
        return ["s", op.queue.name, m.blob, _sid(m.session_id), _opt(m.message_id),
                _opt(_effective_ttl(op.queue, m)), _opt(m.scheduled_ms), _opt(op.seq)]
    if isinstance(op, StagedPublish):
        m = op.message
        fields = ["p", op.topic.name, m.blob, _sid(m.session_id), _opt(m.message_id),
                  _opt(_effective_ttl(op.topic, m)), _opt(m.scheduled_ms), _opt(op.seq),
                  len(op.placements)]
        for c in op.placements:
            fields += [op.subscriptions[c.subscription], *_placement_fields(c)]
        return fields
    if isinstance(op, StagedSettlement):
        s = op.settlement
        return ["x", op.entity.name, _entity(op.entity), s.token, s.outcome.value,
                _sid(s.session_id), _opt(s.dead_letter_reason), _opt(s.dead_letter_description),
                _opt(s.properties_patch), _opt(op.holder)]
    if isinstance(op, StagedSessionState):
        return ["t", op.queue.name, _sid(op.session_id), op.holder, 0 if op.state is None else 1,
                op.state or b""]
    if isinstance(op, StagedCancel):
        return ["c", op.queue.name, op.seq]
    raise TypeError(f"not a staged operation: {op!r}")
