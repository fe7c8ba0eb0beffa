"""Calls of several partitions at once (Scripts.run_many, docs/design.md §3.18): the calls
bound for one server go as one FCALL of the library's `each`, each call answers for itself
(its error does not fail the others), and on a Cluster a call whose slot another primary
serves, or that is being migrated, is not run inside another's but sent alone, where it
gets what a call of its own gets.

On one Valkey (the suite's) and on a 3-primary Cluster (this module's own, since a test
migrates a slot of it)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis
from redis.crc import key_slot

from busd.storage import keys as keyspace
from busd.storage.api import StoreUnavailable
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from busd.testing.broker import delete_prefix
from tests.faults.replicas import Cluster
from tests.storage.test_cluster_routing import elsewhere, finish_migration, start_migration

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path_factory.mktemp("merged"), primaries=3, replicas=0)
    yield nodes
    nodes.stop()


@pytest.fixture(params=["server", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "server":
        return str(request.getfixturevalue("redis_url"))
    return str(request.getfixturevalue("cluster").url)


@pytest_asyncio.fixture
async def store(url: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(url, prefix=f"merged-{uuid.uuid4().hex[:8]}")
    await s.connect()
    try:
        yield s
    finally:
        await s.close()
        if "cluster" not in url:  # the suite's server; this module's Cluster goes with it
            delete_prefix(url, s.prefix)


def fcalls(url: str) -> int:
    """FCALLs run so far, over every primary."""
    if "cluster" not in url:
        clients = [redis.Redis.from_url(url)]
    else:
        with redis.RedisCluster.from_url(url.replace("redis+cluster", "redis")) as cluster:
            clients = [redis.Redis(host=n.host, port=n.port) for n in cluster.get_primaries()]
    total = 0
    for client in clients:
        with client:
            total += int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))
    return total


def owner(url: str, store: RedisStore, part: QueueSpec) -> tuple[str, int]:
    """The address of the primary serving `part`'s slot (one server: its own)."""
    if "cluster" not in url:
        return ("server", 0)
    slot = key_slot(keyspace.key(store.prefix, part.key_scope[0], "seq").encode())
    with redis.RedisCluster.from_url(url.replace("redis+cluster", "redis")) as cluster:
        node = cluster.nodes_manager.get_node_from_slot(slot)
        return (node.host, int(node.port))


def send_call(part: QueueSpec, body: bytes) -> tuple[str, QueueSpec, list[Any]]:
    """sendMessages' own arguments for one message of no session (lua/sendMessages.lua)."""
    return ("sendMessages", part, [0, 0, 0, body, "", "", "", ""])


async def test_the_partitions_of_one_server_are_one_call_and_each_answers_for_itself(url, store):
    queue = QueueSpec(f"q-{uuid.uuid4().hex[:6]}", partitions=16)
    parts = queue.partition_specs
    servers = {owner(url, store, p) for p in parts}
    before = fcalls(url)
    answers = await store._run_queue_many([send_call(p, b"m%d" % p.partition) for p in parts])
    assert fcalls(url) - before == len(servers)  # one FCALL per server, not per partition
    assert [len(a) for a in answers] == [1] * 16 and all(a[0] > 0 for a in answers)
    for p in parts:
        assert (await store.counts(p)).active == 1

    # A call that fails (an unknown entity kind: the script stops with an error) answers
    # its error; the calls before and after it ran.
    calls = [send_call(p, b"again") for p in parts[:3]]
    calls[1] = ("countEntity", parts[1], ["?"])
    answers = await store._run_queue_many(calls)
    assert isinstance(answers[1], redis.ResponseError)
    assert not isinstance(answers[0], BaseException)
    assert not isinstance(answers[2], BaseException)
    assert [(await store.counts(p)).active for p in parts[:3]] == [2, 1, 2]


def same_primary(store: RedisStore, url: str, parts: tuple[QueueSpec, ...]) -> list[QueueSpec]:
    by_owner: dict[tuple[str, int], list[QueueSpec]] = {}
    for p in parts:
        by_owner.setdefault(owner(url, store, p), []).append(p)
    return next(ps for ps in by_owner.values() if len(ps) >= 2)


async def test_a_call_whose_slot_is_being_migrated_is_not_run_inside_another(cluster):
    """Two partitions on one primary, the second's slot being migrated: the first runs, the
    second is sent alone and refused up front (server-busy, TRYAGAIN); once the slot has
    moved, the same calls run, each on its own primary."""
    url = cluster.url
    store = RedisStore(url, prefix=f"merged-{uuid.uuid4().hex[:8]}")
    await store.connect()
    try:
        queue = QueueSpec(f"q-{uuid.uuid4().hex[:6]}", partitions=16)
        stays, moves = same_primary(store, url, queue.partition_specs)[:2]
        await store._run_queue_many([send_call(stays, b"a1"), send_call(moves, b"b1")])
        slot = key_slot(keyspace.key(store.prefix, moves.key_scope[0], "seq").encode())
        source = owner(url, store, moves)[1]
        target = elsewhere(cluster, source)
        start_migration(cluster, slot, source, target)
        try:
            answers = await store._run_queue_many(
                [send_call(stays, b"a2"), send_call(moves, b"b2")]
            )
            assert not isinstance(answers[0], BaseException)
            assert isinstance(answers[1], StoreUnavailable)
        finally:
            finish_migration(cluster, slot, target)
        answers = await store._run_queue_many([send_call(stays, b"a3"), send_call(moves, b"b3")])
        assert not any(isinstance(a, BaseException) for a in answers), answers
        assert (await store.counts(stays)).active == 3
        assert (await store.counts(moves)).active == 2  # b1 and b3: b2 never ran
    finally:
        await store.close()


async def test_a_plain_send_over_every_partition_is_one_call_per_server(url, store):
    """Messages without a session or partition key go to the partitions in turn: a batch of
    16 touches all 16 partitions, and is still one call per server."""
    from busd.storage.messages import NewMessage
    from busd.storage.partitioned.router import wrap

    partitioned = wrap(store)
    queue = QueueSpec(f"q-{uuid.uuid4().hex[:6]}", partitions=16)
    servers = {owner(url, store, p) for p in queue.partition_specs}
    before = fcalls(url)
    seqs = await partitioned.send(queue, [NewMessage(b"m%d" % i) for i in range(16)])
    assert fcalls(url) - before == len(servers)
    assert len(seqs) == 16 and all(s > 0 for s in seqs)
    assert [(await store.counts(p)).active for p in queue.partition_specs] == [1] * 16
