"""A partitioned entity's partitions spread evenly over a Cluster's shards (the even layout of
their hash tags, busd.storage.keys), its sessions evenly over its partitions, entities stored
in the first layout stay readable, and the partitioned store is a whole Store of its own
(docs/design.md §3.18)."""

from __future__ import annotations

import inspect
import uuid
from collections import Counter

import pytest
import pytest_asyncio
import redis

from busd.entities.records import QueueEntity, from_record, to_record
from busd.storage import keys
from busd.storage.api import Store
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.partitioned.router import PartitionedStore, wrap
from busd.storage.partitioned.routing import partition_of_key
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import start_valkey_shards

RD = ReceiveMode.RECEIVE_AND_DELETE
SHARDS, PARTITIONS, SESSIONS = 3, 16, 960


def even_split(shards: int) -> list[range]:
    """The slot ranges of `shards` primaries sharing the slots evenly, in order (as
    `valkey-cli --cluster create` and tests.conftest.start_valkey_shards split them)."""
    step = keys.SLOTS // shards
    return [
        range(i * step, keys.SLOTS if i == shards - 1 else (i + 1) * step) for i in range(shards)
    ]


def partitions_per_shard(prefix: str, entity: str, partitions: int, shards: int) -> list[int]:
    ranges = even_split(shards)
    slots = [
        keys.slot(keys.hash_tag(prefix, keys.partition_scope(entity, p, partitions))[1:-1])
        for p in range(partitions)
    ]
    return [sum(1 for s in slots if s in r) for r in ranges]


@pytest.mark.parametrize("partitions", [8, 16, 24, 32])
@pytest.mark.parametrize("shards", [2, 3, 4, 6, 8])
def test_partitions_fall_evenly_on_evenly_split_shards(partitions, shards):
    for prefix, entity in (("busd", "orders"), ("busd:ns:eu", "a/b.c"), ("x", "q-1")):
        spread = partitions_per_shard(prefix, entity, partitions, shards)
        assert sum(spread) == partitions
        # as even as whole partitions allow: P/S each when S divides P, else one apart
        assert max(spread) - min(spread) <= (0 if partitions % shards == 0 else 1), spread


def test_sixteen_partitions_over_three_shards_are_within_fifteen_percent():
    for n in range(50):
        spread = partitions_per_shard(f"p{n}", f"queue-{n}", 16, 3)
        assert max(spread) <= 16 / 3 * 1.15 and min(spread) >= 16 / 3 * 0.85, spread


def test_the_first_layout_keeps_its_tags():
    """An entity stored before the even layout (its record has no `partition_layout`) keeps
    the keys it has: `{<prefix>:<queue>:<p>}`."""
    old = QueueEntity("orders", partitions=4)
    record = to_record(old)
    del record["partition_layout"]
    entity = from_record("queue", record)
    assert entity.partition_layout == keys.FIRST_LAYOUT
    spec = entity.spec
    assert [keys.key("busd", p.key_scope[0], "seq") for p in spec.partition_specs] == [
        f"{{busd:orders:{p}}}:seq" for p in range(4)
    ]
    # a new entity's record says it is in the even layout
    assert to_record(QueueEntity("new", partitions=4))["partition_layout"] == keys.EVEN_LAYOUT
    new = QueueEntity("new", partitions=4).spec
    tags = {keys.key("busd", p.key_scope[0], "seq") for p in new.partition_specs}
    assert all("#" in t for t in tags) and len(tags) == 4


def test_the_partitioned_store_implements_the_whole_store_protocol():
    """Every method and attribute of the Store protocol is the partitioned store's own (its
    class's or one of the partitioned modules' it is composed of): none reaches the inner
    store unseen (there is no __getattr__ to forward it)."""
    assert not any("__getattr__" in vars(c) for c in PartitionedStore.__mro__)
    methods = {
        name
        for name, value in vars(Store).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }
    for name in methods:
        own = inspect.getattr_static(PartitionedStore, name, None)
        assert inspect.iscoroutinefunction(own), f"PartitionedStore does not implement {name}"
        assert own.__module__.startswith("busd.storage.partition"), name
        assert inspect.signature(own).parameters.keys() == (
            inspect.signature(vars(Store)[name]).parameters.keys()
        ), name

    class Inner:
        process_id = "p1"
        cross_slot_transactions = False

    store = PartitionedStore(Inner())
    for name in Store.__annotations__:  # process_id, cross_slot_transactions
        assert name in vars(store), name


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    servers = start_valkey_shards(tmp_path_factory.mktemp("shards"), primaries=SHARDS, replicas=0)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest_asyncio.fixture
async def cluster_store(shards):
    prefix = f"lay-{uuid.uuid4().hex[:8]}"
    store = wrap(RedisStore(f"redis+cluster://127.0.0.1:{shards[0].port}", prefix=prefix))
    await store.connect()
    try:
        yield store, prefix
    finally:
        await store.close()


async def test_a_partitioned_queue_spreads_its_sessions_evenly_over_three_shards(
    cluster_store, shards
):
    store, prefix = cluster_store
    queue = QueueSpec("orders", requires_session=True, partitions=PARTITIONS)
    await store.catalog_put(
        "queue", "orders", to_record(QueueEntity("orders", True, partitions=PARTITIONS))
    )
    sids = [f"session-{i}" for i in range(SESSIONS)]
    for start in range(0, SESSIONS, 96):
        await store.send(queue, [NewMessage(b"m", session_id=s) for s in sids[start : start + 96]])

    # where busd says each partition is, and where the servers hold the sessions
    (where,) = await store.shards([queue])
    assert len(where) == PARTITIONS and len(set(where)) == SHARDS
    by_partition = Counter(partition_of_key(s, PARTITIONS) for s in sids)
    sessions_on = Counter()
    for p, address in enumerate(where):
        sessions_on[address] += by_partition[p]
    held = {}
    for server in shards:
        node = redis.Redis(host="127.0.0.1", port=server.port)
        try:
            held[f"127.0.0.1:{server.port}"] = sum(
                node.zcard(k) for k in node.scan_iter(match=f"{{{prefix}:orders:*}}:sessions")
            )
        finally:
            node.close()
    assert held == dict(sessions_on)
    even = SESSIONS / SHARDS
    assert all(abs(n - even) <= 0.15 * even for n in held.values()), held
    # and the partitions themselves: 5, 5 and 6
    assert sorted(Counter(where).values()) == [5, 5, 6]
    assert (await store.counts(queue)).sessions == SESSIONS
    got = await store.receive(queue, 10, RD, [])
    assert got == []  # session messages are taken by accepting their session
    lock = await store.accept_session(queue, None, f"{store.process_id}:1", count=5, mode=RD)
    assert lock is not None and len(lock.messages) == 1
    assert await store.drop_queue(queue) == SESSIONS - 1


async def test_an_entity_stored_in_the_first_layout_stays_readable(store, redis_url):
    """A partitioned queue whose record predates the even layout is read, served and
    updated on the keys its messages are in; a new one gets the even layout."""
    from busd.broker.catalog import Catalog

    partitioned = wrap(store)
    record = to_record(QueueEntity("legacy", True, partitions=4))
    del record["partition_layout"]  # as written before the even layout
    await partitioned.catalog_put("queue", "legacy", record)
    before = QueueSpec("legacy", requires_session=True, partitions=4, partition_layout=0)
    sids = [f"s{i}" for i in range(8)]
    await partitioned.send(before, [NewMessage(s.encode(), session_id=s) for s in sids])
    client = redis.Redis.from_url(redis_url)
    try:
        tags = {k.split(b"}")[0] for k in client.scan_iter(match=f"{{{store.prefix}:legacy:*")}
    finally:
        client.close()
    assert tags == {f"{{{store.prefix}:legacy:{p}".encode() for p in range(4)}

    catalog = Catalog(partitioned)
    await catalog.reload()
    spec = catalog.spec("legacy")
    assert spec is not None and spec.partition_layout == keys.FIRST_LAYOUT
    got = []
    for n in range(len(sids)):
        lock = await partitioned.accept_session(
            spec, None, f"{store.process_id}:{n}", count=1, mode=RD
        )
        assert lock is not None
        got += [m.blob.decode() for m in lock.messages]
    assert sorted(got) == sorted(sids)

    # an update keeps the layout (the file or the management API do not carry it)
    await catalog.put(QueueEntity("legacy", True, lock_duration_ms=30_000, partitions=4))
    assert (await catalog.stored("queue", "legacy")).partition_layout == keys.FIRST_LAYOUT
    new = await catalog.create(QueueEntity("fresh", partitions=4))
    assert new.partition_layout == keys.EVEN_LAYOUT
