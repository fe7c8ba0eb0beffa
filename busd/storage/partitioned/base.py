"""The base of the partitioned store's calls: the inner store it wraps, the handles of an
entity's partitions, the order a call looks in them, and this process's waiters of partitions
(docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from busd.storage.api import WAKE_ALL, WakeCallback
from busd.storage.messages import NewMessage
from busd.storage.partitioned.routing import message_key, partition_of_key
from busd.storage.partitioned.waits import PartitionWaits, QueueWaits
from busd.storage.specs import QueueSpec, TopicSpec

Spec = QueueSpec | TopicSpec
T = TypeVar("T")

log = logging.getLogger("busd.storage")


class PartitionedBase:
    """The inner store, and the handles of the partitions each call reaches."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        # fixed when the inner store is made (its URL and its process's id)
        self.process_id: str = inner.process_id
        self.cross_slot_transactions: bool = inner.cross_slot_transactions
        self._parts: dict[Spec, tuple[Any, ...]] = {}
        self._turn = itertools.count()
        # this process's acceptors and receivers of partitioned entities, waiting as one
        self._waits = PartitionWaits(self.process_id)
        self._waits.pass_on = self._pass_on
        self._waits_specs: dict[str, QueueSpec] = {}  # each such entity's spec, by kind + name
        self._passing: set[asyncio.Task] = set()

    # --- wake-ups: this process's waiters of partitions take theirs first --------------------
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

    # --- partitions ---------------------------------------------------------------------------
    def parts(self, spec: Spec) -> tuple[Any, ...]:
        parts = self._parts.get(spec)
        if parts is None:
            if len(self._parts) > 10_000:  # entities changed a lot: start over
                self._parts.clear()
            parts = self._parts[spec] = spec.partition_specs
        return parts

    def part_of_session(self, spec: QueueSpec, session_id: str) -> QueueSpec:
        parts = self.parts(spec)
        return parts[partition_of_key(session_id, len(parts))]

    def by_message(self, spec: Spec, messages: list[NewMessage]) -> dict[int, list[int]]:
        """The indexes of the messages in each partition they go to."""
        groups: dict[int, list[int]] = {}
        count = spec.partitions or 1
        for i, m in enumerate(messages):
            key = message_key(m)
            p = next(self._turn) if key is None else partition_of_key(key, count)
            groups.setdefault(p % count, []).append(i)
        return groups

    def rotation(self, spec: QueueSpec) -> list[QueueSpec]:
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
        order = self.rotation(spec)
        if first is not None:
            order = [parts[first]] + [x for x in order if x is not parts[first]]
        now = time.monotonic()
        return [
            (part, p)
            for part in order
            if (p := part.partition or 0) == first or not waits.skips(p, now)
        ]


def in_order(groups: dict[int, list[int]], answers: Iterable[Sequence[T]], size: int) -> list[T]:
    """The answers of the calls of each partition's items (`groups`: their indexes), one per
    item, in the items' order."""
    out: list[Any] = [None] * size
    for idx, answer in zip(groups.values(), answers):
        for i, value in zip(idx, answer, strict=True):
            out[i] = value
    return out
