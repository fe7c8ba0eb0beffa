"""The base of the partitioned store's calls: the inner store it wraps, the handles of an
entity's partitions and how a call is spread over them (docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from busd.storage.api import WakeCallback
from busd.storage.messages import NewMessage
from busd.storage.partition_routing import message_key, partition_of_key
from busd.storage.specs import QueueSpec, TopicSpec

T = TypeVar("T")


class PartitionedBase:
    """The inner store, and the handles of the partitions each call reaches."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        # fixed when the inner store is made (its URL and its process's id)
        self.process_id: str = inner.process_id
        self.cross_slot_transactions: bool = inner.cross_slot_transactions
        self._parts: dict[QueueSpec, tuple[QueueSpec, ...]] = {}
        self._topic_parts: dict[TopicSpec, tuple[TopicSpec, ...]] = {}
        self._turn = itertools.count()
        # next-available acceptors (holder ids) -> partitions where they may be registered
        self._session_waits: dict[str, set[int]] = {}

    # --- lifecycle: the inner store's --------------------------------------------------------
    async def connect(self) -> None:
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> bool:
        return bool(await self.inner.ping())

    async def subscribe(self, on_wake: WakeCallback) -> None:
        await self.inner.subscribe(on_wake)

    async def shards(self, entities: Sequence[QueueSpec | TopicSpec]) -> list[list[str]]:
        # the inner store places each partition of a partitioned handle itself
        return [list(where) for where in await self.inner.shards(entities)]

    # --- partitions ---------------------------------------------------------------------------
    def parts(self, spec: QueueSpec) -> tuple[QueueSpec, ...]:
        parts = self._parts.get(spec)
        if parts is None:
            if len(self._parts) > 10_000:  # entities changed a lot: start over
                self._parts.clear()
            parts = self._parts[spec] = spec.partition_specs
        return parts

    def topic_parts(self, topic: TopicSpec) -> tuple[TopicSpec, ...]:
        parts = self._topic_parts.get(topic)
        if parts is None:
            if len(self._topic_parts) > 10_000:
                self._topic_parts.clear()
            parts = self._topic_parts[topic] = topic.partition_specs
        return parts

    def part_of_session(self, spec: QueueSpec, session_id: str) -> QueueSpec:
        parts = self.parts(spec)
        return parts[partition_of_key(session_id, len(parts))]

    def part_of_message(self, spec: QueueSpec | TopicSpec, message: NewMessage) -> int:
        assert spec.partitions
        key = message_key(message)
        if key is None:
            return next(self._turn) % spec.partitions
        return partition_of_key(key, spec.partitions)

    def _rotation(self, spec: QueueSpec) -> list[QueueSpec]:
        parts = self.parts(spec)
        first = next(self._turn) % len(parts)
        return list(parts[first:] + parts[:first])

    async def _by_partition(
        self,
        spec: QueueSpec,
        items: Sequence[T],
        partition_of: Callable[[T], int],
        call: Callable[[QueueSpec, list[T]], Awaitable[list[Any]]],
    ) -> list[Any]:
        """call(partition, its items) for each partition the items fall in, at once; the
        answers, one per item, in the items' order."""
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(partition_of(item), []).append(i)
        parts = self.parts(spec)
        if len(groups) == 1:
            ((p, _),) = groups.items()
            return await call(parts[p], list(items))
        answers = await asyncio.gather(
            *(call(parts[p], [items[i] for i in idx]) for p, idx in groups.items())
        )
        out: list[Any] = [None] * len(items)
        for idx, answer in zip(groups.values(), answers):
            for i, value in zip(idx, answer):
                out[i] = value
        return out
