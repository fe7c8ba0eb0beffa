"""The partitioned store's transactions (docs/design.md §3.15, §3.18)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from busd.storage.partitioned.base import PartitionedBase
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import StagedOperation


class PartitionedTransactionCalls(PartitionedBase):
    # --- transactions: staged in one partition (broker.links.staging picks it) -----------
    async def sweep_transactions(self, queue: QueueSpec | TopicSpec) -> int:
        if not queue.partitions:
            return int(await self.inner.sweep_transactions(queue))
        parts = self.topic_parts(queue) if isinstance(queue, TopicSpec) else self.parts(queue)
        return sum(await asyncio.gather(*(self.inner.sweep_transactions(p) for p in parts)))

    async def reserve_sequence_numbers(self, queue: QueueSpec | TopicSpec, count: int) -> list[int]:
        # a partitioned entity's: its partition's (busd.broker.links.staging picks it)
        assert not queue.partitions
        return list(await self.inner.reserve_sequence_numbers(queue, count))

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
        return await self.inner.stage_transaction(
            via, txn_id, operations, first=first, timeout_ms=timeout_ms, limit=limit
        )

    async def commit_transaction(
        self,
        via: QueueSpec | TopicSpec,
        others: list[QueueSpec],
        txn_id: bytes,
        topics: Sequence[tuple[TopicSpec, list[QueueSpec]]] = (),
    ) -> None:
        # the broker hands partitions' handles here (busd.broker.transactions)
        await self.inner.commit_transaction(via, others, txn_id, topics)

    async def discard_transaction(self, via: QueueSpec | TopicSpec, txn_id: bytes) -> None:
        await self.inner.discard_transaction(via, txn_id)
