"""The transactions of the Redis/Valkey store: operations staged on the via entity, then
committed, discarded or swept as one (docs/design.md §3.15)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from busd.errors import BusdError, Condition
from busd.storage.redis.codec import (
    ScriptStatus,
    check_session_ids,
    check_status,
    effective_ttl,
    entity_kind,
    optional_arg,
    placement_fields,
    session_arg,
    settlement_fields,
)
from busd.storage.redis.connection import SWEEP_BUDGET, RedisConnection
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import (
    StagedCancel,
    StagedOperation,
    StagedPublish,
    StagedSend,
    StagedSessionState,
    StagedSettlement,
)


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
        return [
            "s",
            op.queue.name,
            m.blob,
            session_arg(m.session_id),
            optional_arg(m.message_id),
            optional_arg(effective_ttl(op.queue, m)),
            optional_arg(m.scheduled_ms),
            optional_arg(op.seq),
        ]
    if isinstance(op, StagedPublish):
        m = op.message
        fields = [
            "p",
            op.topic.name,
            m.blob,
            session_arg(m.session_id),
            optional_arg(m.message_id),
            optional_arg(effective_ttl(op.topic, m)),
            optional_arg(m.scheduled_ms),
            optional_arg(op.seq),
            len(op.placements),
        ]
        for c in op.placements:
            fields += [op.subscriptions[c.subscription], *placement_fields(c)]
        return fields
    if isinstance(op, StagedSettlement):
        return [
            "x",
            op.entity.name,
            entity_kind(op.entity),
            *settlement_fields(op.settlement, op.holder),
        ]
    if isinstance(op, StagedSessionState):
        return [
            "t",
            op.queue.name,
            session_arg(op.session_id),
            op.holder,
            0 if op.state is None else 1,
            op.state or b"",
        ]
    if isinstance(op, StagedCancel):
        return ["c", op.queue.name, op.seq]
    raise TypeError(f"not a staged operation: {op!r}")


class TransactionCalls(RedisConnection):
    async def stage_transaction(
        self,
        via: QueueSpec | TopicSpec,
        txn_id: bytes,
        operations: list[StagedOperation],
        *,
        first: bool,
        timeout_ms: int,
        limit: int,
    ) -> tuple[int, int]:
        check_session_ids(_staged_session_ids(operations))
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
        self,
        via: QueueSpec | TopicSpec,
        others: list[QueueSpec],
        txn_id: bytes,
        topics: Sequence[tuple[TopicSpec, list[QueueSpec]]] = (),
    ) -> None:
        queues = ([via] if isinstance(via, QueueSpec) else []) + list(others)
        keys = list(self._keys_for("commitTransaction", via))
        args: list[Any] = [txn_id, len(queues)]
        for queue in queues:
            keys += self._keys_for("sendMessages", queue)
            args += self._queue_args(queue) + [
                queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0,
            ]
        args.append(len(topics))
        for topic, subscriptions in topics:
            names = tuple(s.subscription or "" for s in subscriptions)
            keys += self._topic_keys("publishMessages", topic.key_scope[0], names)
            args += self._topic_args(topic.name, subscriptions, names)
            args.append(topic.duplicate_detection_window_ms or 0)
            for spec in subscriptions:
                args += [1 if spec.requires_session else 0, optional_arg(spec.default_ttl_ms)]
        reply = await self._call(self._connected(), "commitTransaction", keys, args)
        status = reply[0]
        if status == ScriptStatus.OK:
            return
        if status == ScriptStatus.TRANSACTION_TIMEOUT:
            raise BusdError(Condition.TRANSACTION_TIMEOUT, "The transaction timed out.")
        if status == ScriptStatus.UNKNOWN_ENTITY:
            raise BusdError(
                Condition.TRANSACTION_ROLLBACK,
                "The transaction names an entity it was not committed with.",
            )
        check_status(status)

    async def reserve_sequence_numbers(self, queue: QueueSpec | TopicSpec, count: int) -> list[int]:
        if count <= 0:
            return []
        last = await self._run("reserveSequenceNumbers", queue, [count])
        return list(range(last - count + 1, last + 1))

    async def discard_transaction(self, via: QueueSpec | TopicSpec, txn_id: bytes) -> None:
        await self._run("discardTransaction", via, [txn_id])

    async def sweep_transactions(self, queue: QueueSpec | TopicSpec) -> int:
        return await self._run("sweepTransactions", queue, [SWEEP_BUDGET])
