"""The base of the partitioned store's calls: the inner store it wraps, the handles of an
entity's partitions and how a call is spread over them (docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from busd.storage.api import WAKE_ALL, WakeCallback
from busd.storage.messages import NewMessage
from busd.storage.partitioned.routing import message_key, partition_of_key
from busd.storage.partitioned.waits import PartitionWaits, QueueWaits
from busd.storage.specs import QueueSpec, TopicSpec

T = TypeVar("T")

log = logging.getLogger("busd.storage")


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
        # this process's acceptors and receivers of partitioned entities, waiting as one
        self._waits = PartitionWaits(self.process_id)
        self._waits.pass_on = self._pass_on
        self._waits_specs: dict[str, QueueSpec] = {}  # each such entity's spec, by kind + name
        self._passing: set[asyncio.Task] = set()

    # --- lifecycle: the inner store's --------------------------------------------------------
    async def connect(self) -> None:
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> bool:
        return bool(await self.inner.ping())

    async def subscribe(self, on_wake: WakeCallback) -> None:
        waits = self._waits

        def wake(waiter: str) -> None:
            if waiter == WAKE_ALL:
                waits.lost()
            elif waits.woke(waiter):  # this process's waiter of a partition
                return
            on_wake(waiter)

        waits.wake = on_wake
        await self.inner.subscribe(wake)

    def _pass_on(self, waits: QueueWaits, partition: int, waiter: str) -> None:
        """A wake-up of this process's waiter that no acceptor or receiver here takes goes
        back to the store, which wakes another waiter if there is work in that partition (a
        free session, an available message: lua/stopWaiting.lua)."""
        spec = self._waits_specs.get(waits.kind + waits.name)
        if spec is None:
            return
        task = asyncio.get_running_loop().create_task(
            self.inner.stop_waiting(self.parts(spec)[partition], waits.kind, waiter)
        )
        self._passing.add(task)
        task.add_done_callback(self._passed_on)

    def _passed_on(self, task: asyncio.Task) -> None:
        self._passing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the sweep wakes a waiter where a session is free (lua/sweepQueue.lua)
            log.debug("passing a wake-up on failed: %s", task.exception())

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

    def _to_look(
        self, spec: QueueSpec, waits: QueueWaits, first: int | None
    ) -> list[tuple[QueueSpec, int]]:
        """The partitions a waiter's call looks in, in turn, with their numbers: `first` (the
        one it was woken for) first, then from a rotating one, less those where this process
        waits already (busd/storage/partitioned/waits.py)."""
        parts = self.parts(spec)
        order = self._rotation(spec)
        if first is not None:
            order = [parts[first]] + [x for x in order if x is not parts[first]]
        now = time.monotonic()
        return [
            (part, p)
            for part in order
            if (p := part.partition or 0) == first or not waits.skips(p, now)
        ]

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
