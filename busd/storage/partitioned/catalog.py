"""The partitioned store's catalog and whole-entity calls: records (a partitioned entity's
counters started before its record), live and dropped subscriptions and queues in every
partition, and an entity's counts, size, totals and purge summed over its partitions
(docs/design.md §3.18)."""

from __future__ import annotations

import asyncio

from busd.storage.api import CatalogCallback
from busd.storage.counts import EntityCounts
from busd.storage.keys import FIRST_LAYOUT
from busd.storage.partitioned.base import PartitionedBase
from busd.storage.partitioned.routing import first_seq
from busd.storage.specs import QueueSpec, TopicSpec


class PartitionedCatalogCalls(PartitionedBase):
    # --- the catalog -------------------------------------------------------------------------
    async def catalog_put(
        self, kind: str, path: str, record: dict, *, only_new: bool = False
    ) -> bool:
        partitions = record.get("partitions")
        if partitions and kind in ("queue", "topic"):
            # before the record: no message may be numbered from a counter not yet started
            layout = record.get(
                "partition_layout", FIRST_LAYOUT
            )  # busd.entities.records.from_record
            spec = (
                QueueSpec(name=path, partitions=partitions, partition_layout=layout)
                if kind == "queue"
                else TopicSpec(name=path, partitions=partitions, partition_layout=layout)
            )
            await asyncio.gather(
                *(
                    self.inner.start_sequence(part, first_seq(part.partition or 0))
                    for part in spec.partition_specs[1:]
                )
            )
        return bool(await self.inner.catalog_put(kind, path, record, only_new=only_new))

    async def catalog_all(self) -> dict[str, dict]:
        return dict(await self.inner.catalog_all())

    async def catalog_get(self, kind: str, path: str) -> dict | None:
        return await self.inner.catalog_get(kind, path)

    async def catalog_delete(self, items: list[tuple[str, str]]) -> int:
        return int(await self.inner.catalog_delete(items))

    async def catalog_subscribe(self, on_change: CatalogCallback) -> None:
        await self.inner.catalog_subscribe(on_change)

    async def fault_hit(self, fault_id: str) -> int:
        return int(await self.inner.fault_hit(fault_id))

    async def fault_forget(self, fault_id: str) -> None:
        await self.inner.fault_forget(fault_id)

    async def namespace_add(self, name: str) -> None:
        await self.inner.namespace_add(name)

    async def namespace_known(self, name: str) -> bool:
        return bool(await self.inner.namespace_known(name))

    async def open_subscriptions(self, topic: TopicSpec | str, subscriptions: list[str]) -> None:
        if isinstance(topic, str) or not topic.partitions:
            return await self.inner.open_subscriptions(topic, subscriptions)
        # live in every partition: a partition p of the topic fans out to partition p of each
        await asyncio.gather(
            *(self.inner.open_subscriptions(t, subscriptions) for t in self.topic_parts(topic))
        )

    async def drop_subscriptions(
        self, topic: TopicSpec | str, subscriptions: list[QueueSpec], *, with_topic: bool = False
    ) -> int:
        if isinstance(topic, str) or not topic.partitions:
            return int(
                await self.inner.drop_subscriptions(topic, subscriptions, with_topic=with_topic)
            )
        sparts = [self.parts(s) for s in subscriptions]
        dropped = await asyncio.gather(
            *(
                self.inner.drop_subscriptions(t, [s[p] for s in sparts], with_topic=with_topic)
                for p, t in enumerate(self.topic_parts(topic))
            )
        )
        return sum(dropped)

    async def drop_queue(self, queue: QueueSpec) -> int:
        if not queue.partitions:
            return int(await self.inner.drop_queue(queue))
        return sum(await asyncio.gather(*(self.inner.drop_queue(p) for p in self.parts(queue))))

    # --- whole entities: their partitions' together ------------------------------------------
    async def topic_totals(self, topic: TopicSpec) -> dict[str, int]:
        if not topic.partitions:
            return dict(await self.inner.topic_totals(topic))
        total: dict[str, int] = {}
        for totals in await asyncio.gather(
            *(self.inner.topic_totals(t) for t in self.topic_parts(topic))
        ):
            for name, n in totals.items():
                total[name] = total.get(name, 0) + n
        return total

    async def purge(self, entity: QueueSpec) -> int:
        if not entity.partitions:
            return int(await self.inner.purge(entity))
        return sum(await asyncio.gather(*(self.inner.purge(p) for p in self.parts(entity))))

    async def size_in_bytes(self, entity: QueueSpec) -> int:
        if not entity.partitions:
            return await self.inner.size_in_bytes(entity)
        sizes = await asyncio.gather(*(self.inner.size_in_bytes(p) for p in self.parts(entity)))
        return sum(sizes)

    async def counts(self, entity: QueueSpec) -> EntityCounts:
        if not entity.partitions:
            return await self.inner.counts(entity)
        total = EntityCounts()
        for c in await asyncio.gather(*(self.inner.counts(p) for p in self.parts(entity))):
            total.active += c.active
            total.locked += c.locked
            total.scheduled += c.scheduled
            total.deferred += c.deferred
            total.dead_letter += c.dead_letter
            total.sessions += c.sessions
            total.locked_sessions += c.locked_sessions
            total.free_sessions += c.free_sessions
            if c.oldest_enqueued_ms is not None:
                total.oldest_enqueued_ms = min(
                    total.oldest_enqueued_ms or c.oldest_enqueued_ms, c.oldest_enqueued_ms
                )
            for name, n in c.totals.items():
                total.totals[name] = total.totals.get(name, 0) + n
        return total
