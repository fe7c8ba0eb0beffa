"""On a Cluster each script call goes on busd's own pipelined connection to the primary owning
its queue's slot (busd/storage/redis/cluster.py, docs/design.md §3.4): a slot moved to another
primary is followed (MOVED), a slot being migrated is served from its target (ASK, then
ASKING), a script on a slot in migration is refused until it ends (TRYAGAIN), and with
`--durability replicated` a shard whose replica is gone refuses its writes while the other
shards keep accepting them (docs/design.md §3.9).

Three primaries (with a replica each where durability is tested) of the test's own on
loopback (tests/faults/replicas.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from busd.storage import keys as keyspace
from busd.storage.api import StoreUnavailable
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.redis.cluster import ShardPipelines
from busd.storage.redis.pipeline import resp_command
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.faults.replicas import Cluster

pytestmark = pytest.mark.timeout(90)

PL = ReceiveMode.PEEK_LOCK


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path_factory.mktemp("routing"), primaries=3, replicas=0)
    yield nodes
    nodes.stop()


def slot_of(store: RedisStore, queue: QueueSpec) -> int:
    return key_slot(keyspace.key(store.prefix, queue.key_scope[0], "seq").encode())


def owner(cluster: Cluster, slot: int) -> int:
    """The port of the primary serving `slot` now."""
    with cluster.client(cluster.primary_ports[0]) as node:
        for low, high, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
            if low <= slot <= high:
                return int(primary[1])
    raise AssertionError(f"no primary serves slot {slot}")


def start_migration(cluster: Cluster, slot: int, source: int, target: int) -> None:
    """Mark `slot` migrating from `source` to `target` and move all of its keys: `source`
    answers ASK from now on, and `target` serves the slot only after ASKING."""
    with cluster.client(source) as src, cluster.client(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.ids[source])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.ids[target])
        names = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        assert names, "the queue has no keys to move"
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *names)


def finish_migration(cluster: Cluster, slot: int, target: int) -> None:
    """`target` owns `slot`, as every primary is told (the others answer MOVED)."""
    for port in cluster.primaries():
        with cluster.client(port) as node:
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", cluster.ids[target])


def elsewhere(cluster: Cluster, port: int) -> int:
    return next(p for p in cluster.primaries() if p != port)


async def test_a_moved_slot_is_followed_to_its_new_primary(cluster, tokens):
    store = RedisStore(cluster.url, prefix="moved")
    await store.connect()
    try:
        q = QueueSpec("moving")
        await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
        slot = slot_of(store, q)
        source = owner(cluster, slot)
        target = elsewhere(cluster, source)
        start_migration(cluster, slot, source, target)
        finish_migration(cluster, slot, target)
        assert owner(cluster, slot) == target

        # The first call after the move reaches the old owner, which answers MOVED: busd
        # reads the slot map again and sends it to the new owner, once.
        await store.send(q, [NewMessage(b"c")])
        received = await store.receive(q, 10, PL, tokens(10))
        assert [m.blob for m in received] == [b"a", b"b", b"c"]
        with cluster.client(source) as src:
            assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    finally:
        await store.close()


async def test_a_migrating_slot_is_served_from_its_target_after_asking(cluster):
    """A one-key command on busd's pipelines (busd/storage/redis/cluster.py): the source still
    owns the slot but no longer has the key, so it answers ASK; the target runs the command
    only right after an ASKING on the same connection (without one it answers MOVED)."""
    client = RedisCluster.from_url(cluster.url.replace("redis+cluster://", "redis://"))
    await client.initialize()
    shards = ShardPipelines(client, ())
    key = b"{asked}:k"
    slot = key_slot(key)
    source = owner(cluster, slot)
    target = elsewhere(cluster, source)
    try:
        with cluster.client(source) as src:
            src.set(key, b"moved along")
        start_migration(cluster, slot, source, target)
        assert await shards.call(resp_command(b"GET", key), "GET", key) == b"moved along"
    finally:
        finish_migration(cluster, slot, target)
        await shards.close()
        await client.aclose()


async def test_a_script_on_a_migrating_slot_is_refused_until_the_migration_ends(cluster, tokens):
    """A script's KEYS are many, some of them absent: during the migration the target
    refuses it (TRYAGAIN) even after ASKING. busd answers server-busy and nothing ran; once
    the slot has moved, the call is served from its new owner."""
    store = RedisStore(cluster.url, prefix="migrating")
    await store.connect()
    q = QueueSpec("migrating")
    slot = slot_of(store, q)
    source = owner(cluster, slot)
    target = elsewhere(cluster, source)
    try:
        await store.send(q, [NewMessage(b"before")])
        start_migration(cluster, slot, source, target)
        with pytest.raises(StoreUnavailable, match="rehashing"):
            await store.send(q, [NewMessage(b"during")])
        finish_migration(cluster, slot, target)
        await store.send(q, [NewMessage(b"after")])
        received = await store.receive(q, 10, PL, tokens(10))
        assert [m.blob for m in received] == [b"before", b"after"]
    finally:
        await store.close()


async def test_replicated_durability_waits_on_each_shard_and_refuses_where_no_replica_is_left(
    tmp_path,
):
    nodes = Cluster(tmp_path, primaries=3, replicas=1)
    store = RedisStore(nodes.url, prefix="durable", durability="replicated")
    try:
        await store.connect()
        queues = [QueueSpec(f"q{i}") for i in range(12)]
        by_shard: dict[int, list[QueueSpec]] = {}
        for q in queues:
            by_shard.setdefault(owner(nodes, slot_of(store, q)), []).append(q)
        assert len(by_shard) == 3, "the queues are not on every shard"
        for q in queues:
            await store.send(q, [NewMessage(b"confirmed")])

        lonely = next(iter(by_shard))
        (replica,) = nodes.replicas_of[lonely]
        nodes.kill(replica)
        # The shard without a replica cannot confirm a write (WAIT 1 answers 0 after 1 s):
        # refused, which clients hear as com.microsoft:server-busy.
        with pytest.raises(StoreUnavailable, match="durable"):
            await asyncio.wait_for(store.send(by_shard[lonely][0], [NewMessage(b"x")]), 10)
        # Each shard waits on its own replica: the others still accept.
        for port, on_shard in by_shard.items():
            if port != lonely:
                await store.send(on_shard[0], [NewMessage(b"still")])
    finally:
        await store.close()
        nodes.stop()


async def test_durability_on_a_cluster_needs_every_primarys_append_only_file(tmp_path):
    nodes = Cluster(tmp_path, primaries=3, replicas=0)
    try:
        last = nodes.primary_ports[-1]
        with nodes.client(last) as node:
            node.config_set("appendonly", "no")
        store = RedisStore(nodes.url, prefix="noaof", durability="fsync")
        with pytest.raises(RuntimeError, match=f"appendonly yes.*{last}"):
            await store.connect()
        await store.close()
    finally:
        nodes.stop()


async def test_a_primary_that_lost_the_scripts_gets_them_again(cluster, tokens):
    """A promoted replica that never had busd's library, or a flushed primary, has none of
    the scripts ("Function not found"): the call loads the library on that primary and runs
    once."""
    store = RedisStore(cluster.url, prefix="noscript")
    await store.connect()
    try:
        q = QueueSpec("flushed")
        await store.send(q, [NewMessage(b"a")])
        with cluster.client(owner(cluster, slot_of(store, q))) as node:
            node.function_flush()
        await store.send(q, [NewMessage(b"b")])
        received = await store.receive(q, 10, PL, tokens(10))
        assert [m.blob for m in received] == [b"a", b"b"]
    finally:
        await store.close()
