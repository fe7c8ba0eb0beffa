"""The base of the partitioned store's calls: the inner store it wraps, the handles of an
entity's partitions, the order a call looks in them, and this process's waiters of partitions
(docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from busd.storage.api import WakeCallback
from busd.storage.partitioned.routing import partition_of_key
from busd.storage.partitioned.waits import PartitionWaits
from busd.storage.specs import QueueSpec, TopicSpec

Spec = QueueSpec | TopicSpec
T = TypeVar("T")


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
        self._waits.hands_back(inner, self.parts)

    async def subscribe(self, on_wake: WakeCallback) -> None:
        # this process's waiters of partitions take their wake-ups first
        await self.inner.subscribe(self._waits.routed(on_wake))

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

    async def each(self, spec: Spec, call: Callable[[Any], Awaitable[T]]) -> list[T]:
        """`call` on every partition of `spec` at once: their answers."""
        return list(await asyncio.gather(*(call(part) for part in self.parts(spec))))

    def rotation(self, spec: QueueSpec) -> list[QueueSpec]:
        parts = self.parts(spec)
        first = next(self._turn) % len(parts)
        return list(parts[first:] + parts[:first])
