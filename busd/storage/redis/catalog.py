"""The entities of the Redis/Valkey store: the catalog of entity records (one hash, its changes
announced on a channel), and the calls on an entity as a whole: open and drop subscriptions,
drop a queue, purge, count (docs/design.md §3.4)."""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from busd.storage import keys as keyspace
from busd.storage.api import CatalogCallback
from busd.storage.counts import EntityCounts
from busd.storage.redis.codec import as_text, entity_kind
from busd.storage.redis.connection import RedisConnection
from busd.storage.specs import QueueSpec, TopicSpec

log = logging.getLogger("busd.storage")
# Messages sizeEntity.lua reads at each end of a sub-queue: SizeInBytes is exact up to twice
# this, and costs that many reads however many messages the entity holds.
SIZE_SAMPLE = 32
# How long a fault's count of hits is kept after its last hit (a fault that is never spent
# nor removed, its process gone), and after the fault ended (fault_forget).
FAULT_HITS_KEPT_S = 30 * 86_400
FAULT_FORGOTTEN_S = 60


def catalog_field(kind: str, path: str) -> str:
    """A record's field in the catalog hash: `<kind>:<path>` (kinds hold no ':')."""
    return f"{kind}:{path}"


class CatalogCalls(RedisConnection):
    # Entity records change rarely and are not messages: each change is one MULTI/EXEC (the
    # record and its announcement together), not a script.
    async def catalog_all(self) -> dict[str, dict[str, Any]]:
        assert self._client is not None
        raw = await self._client.hgetall(keyspace.catalog_key(self.prefix))
        return {as_text(field) or "": json.loads(value) for field, value in raw.items()}

    async def catalog_get(self, kind: str, path: str) -> dict[str, Any] | None:
        assert self._client is not None
        raw = await self._client.hget(keyspace.catalog_key(self.prefix), catalog_field(kind, path))
        return None if raw is None else json.loads(raw)

    async def catalog_put(
        self, kind: str, path: str, record: dict[str, Any], *, only_new: bool = False
    ) -> bool:
        assert self._client is not None
        name = catalog_field(kind, path)
        value = json.dumps(record, separators=(",", ":"), sort_keys=True)
        key, channel = keyspace.catalog_key(self.prefix), keyspace.catalog_channel(self.prefix)
        if not self.cross_slot_transactions:
            # A cluster client refuses PUBLISH in a pipeline: the record first, then its
            # announcement (a process that misses one reloads all when it subscribes again).
            if only_new:
                written = await self._client.hsetnx(key, name, value)
            else:
                written = await self._client.hset(key, name, value)
            await self._client.publish(channel, name)
            return bool(written) or not only_new
        async with self._client.pipeline(transaction=True) as pipe:
            if only_new:
                pipe.hsetnx(key, name, value)
            else:
                pipe.hset(key, name, value)
            pipe.publish(channel, name)
            written, _ = await pipe.execute()
        return bool(written) or not only_new

    async def catalog_delete(self, items: list[tuple[str, str]]) -> int:
        assert self._client is not None
        if not items:
            return 0
        names = [catalog_field(kind, path) for kind, path in items]
        if not self.cross_slot_transactions:  # as in catalog_put
            deleted = await self._client.hdel(keyspace.catalog_key(self.prefix), *names)
            for name in names:
                await self._client.publish(keyspace.catalog_channel(self.prefix), name)
            return int(deleted)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hdel(keyspace.catalog_key(self.prefix), *names)
            for name in names:
                pipe.publish(keyspace.catalog_channel(self.prefix), name)
            deleted, *_ = await pipe.execute()
        return int(deleted)

    # Faults on demand (busd.broker.faults): their records are catalog records of kind
    # `fault`; a fault with a count counts its hits here, shared by every process.
    # A spent count is not deleted at once but left to expire: another process that has not
    # heard yet that the fault ended still counts past it (a deleted count would start again
    # at 1 and let its hits through).
    async def fault_hit(self, fault_id: str) -> int:
        assert self._client is not None
        key = keyspace.fault_hits_key(self.prefix, fault_id)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, FAULT_HITS_KEPT_S)
            hits, _ = await pipe.execute()
        return int(hits)

    async def fault_forget(self, fault_id: str) -> None:
        assert self._client is not None
        await self._client.expire(keyspace.fault_hits_key(self.prefix, fault_id), FAULT_FORGOTTEN_S)

    # The namespaces made: one set, written once per process that makes one for a Manage key,
    # read only by a process that does not serve the namespace (busd.broker.namespaces).
    async def namespace_add(self, name: str) -> None:
        assert self._client is not None
        await self._client.sadd(keyspace.namespaces_key(self.prefix), name)

    async def namespace_known(self, name: str) -> bool:
        assert self._client is not None
        return bool(await self._client.sismember(keyspace.namespaces_key(self.prefix), name))

    async def namespace_record(self, name: str, kind: str, path: str) -> dict[str, Any] | None:
        assert self._client is not None
        key = keyspace.catalog_key(keyspace.namespace_prefix(self.prefix, name))
        raw = await self._client.hget(key, catalog_field(kind, path))
        return None if raw is None else json.loads(raw)

    async def catalog_subscribe(self, on_change: CatalogCallback) -> None:
        assert self._node is not None
        pubsub = self._node.pubsub(ignore_subscribe_messages=False)
        await pubsub.subscribe(keyspace.catalog_channel(self.prefix))
        self._listeners.append(
            asyncio.create_task(self._listen_catalog(pubsub, on_change), name="busd-catalog")
        )

    async def _listen_catalog(self, pubsub: Any, on_change: CatalogCallback) -> None:
        try:
            while True:
                try:
                    message = await pubsub.get_message(timeout=None)
                except (RedisConnectionError, OSError) as exc:
                    # redis-py subscribes again on the next read; its confirmation below
                    # makes everyone reload what changed meanwhile.
                    log.warning("catalog subscription interrupted: %s", exc)
                    await asyncio.sleep(0.5)
                    continue
                if message is None:
                    continue
                kind = message.get("type")
                if kind == "subscribe":  # (re)subscribed: changes may have been missed
                    changed = None
                elif kind == "message":
                    changed = message["data"].decode()
                else:
                    continue
                try:
                    on_change(changed)
                except Exception:
                    log.exception("catalog change callback failed")
        finally:
            await pubsub.aclose()

    async def open_subscriptions(self, topic: TopicSpec | str, subscriptions: list[str]) -> None:
        if subscriptions:
            await self._run_topic("openSubscriptions", _scope(topic), [], list(subscriptions))

    async def drop_queue(self, queue: QueueSpec) -> int:
        return await self._run_queue("dropQueue", queue)

    async def start_sequence(self, queue: QueueSpec | TopicSpec, first: int) -> None:
        """Start the queue's sequence counter at `first` (the next number is first + 1) unless
        it counted already: a partition's numbers carry the partition (docs/wire.md §6.3)."""
        assert self._client is not None
        scope = queue.key_scope
        await self._client.set(keyspace.key(self.prefix, scope[0], "seq"), first, nx=True)

    async def drop_subscriptions(
        self, topic: TopicSpec | str, subscriptions: list[QueueSpec], *, with_topic: bool = False
    ) -> int:
        return await self._run_topic(
            "dropSubscriptions", _scope(topic), subscriptions, [1 if with_topic else 0]
        )

    async def shards(self, entities: Sequence[QueueSpec | TopicSpec]) -> list[list[str]]:
        ranges = await self._slot_ranges()
        starts = [first for first, _, _ in ranges]
        out = []
        for entity in entities:
            where = []
            for part in entity.partition_specs:
                tag = keyspace.key(self.prefix, part.key_scope[0], "seq")
                slot = keyspace.slot(tag[1 : tag.index("}")])
                first, last, address = ranges[max(0, bisect.bisect_right(starts, slot) - 1)]
                where.append(address if first <= slot <= last else "")
            out.append(where)
        return out

    async def _slot_ranges(self) -> list[tuple[int, int, str]]:
        """(first slot, last slot, primary's `host:port`) of each shard, by first slot; one
        range of every slot on a single server."""
        assert self._node is not None
        kwargs = self._node.connection_pool.connection_kwargs
        here = f"{kwargs.get('host', '')}:{kwargs.get('port', '')}"
        if self.cross_slot_transactions:  # a single server (or Sentinel's primary)
            return [(0, keyspace.SLOTS - 1, here)]
        reply = await self._node.execute_command("CLUSTER", "SLOTS")
        ranges = []
        for first, last, primary, *_ in reply:
            host = as_text(primary[0]) or kwargs.get("host", "")
            ranges.append((int(first), int(last), f"{host}:{int(primary[1])}"))
        return sorted(ranges)

    async def topic_totals(self, topic: TopicSpec) -> dict[str, int]:
        assert self._client is not None
        raw = await self._client.hgetall(keyspace.key(self.prefix, topic.key_scope[0], "tstats"))
        return {as_text(k) or "": int(v) for k, v in raw.items()}

    async def purge(self, entity: QueueSpec) -> int:
        return await self._run_queue("purgeEntity", entity, entity_kind(entity))

    async def size_in_bytes(self, entity: QueueSpec) -> int:
        bytes_, _, _ = await self._run_queue("sizeEntity", entity, SIZE_SAMPLE)
        return int(bytes_)

    async def counts(self, entity: QueueSpec) -> EntityCounts:
        reply = await self._run_queue("countEntity", entity, entity_kind(entity))
        (
            active,
            locked,
            scheduled,
            deferred,
            dead_letter,
            sessions,
            locked_sessions,
            free_sessions,
            oldest,
        ) = reply[:9]
        totals = reply[9:]
        return EntityCounts(
            active=active,
            locked=locked,
            scheduled=scheduled,
            deferred=deferred,
            dead_letter=dead_letter,
            sessions=sessions,
            locked_sessions=locked_sessions,
            free_sessions=free_sessions,
            oldest_enqueued_ms=oldest or None,
            totals={name.decode(): count for name, count in zip(totals[0::2], totals[1::2])},
        )


def _scope(topic: TopicSpec | str) -> str:
    """What stands for a topic (or one partition of one) in its keys."""
    return topic if isinstance(topic, str) else topic.key_scope[0]
