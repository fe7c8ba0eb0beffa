"""Wake-ups on a Cluster go by sharded pub/sub (busd/storage/redis/shard_wakeups.py, docs/design.md
§3.9): a script's wake-up is an SPUBLISH on the shard that ran it, never a PUBLISH that crosses
the cluster bus; a subscription lost - the primary dropped the channels of a slot it gave
away, or the subscriber's connection broke - is made again where the slot is now, and everyone
waiting looks again (WAKE_ALL). On three primaries on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from busd.storage.api import WAKE_ALL
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.faults.replicas import Cluster
from tests.storage.test_cluster_routing import (
    elsewhere,
    finish_migration,
    owner,
    slot_of,
    start_migration,
)

pytestmark = pytest.mark.timeout(90)

RAD = ReceiveMode.RECEIVE_AND_DELETE


@pytest.fixture
def cluster(store_cluster) -> Cluster:
    """This process's test cluster (tests/storage/conftest.py): a slot a test moves holds only
    its own keys' tag, and other tests follow it where it went."""
    return store_cluster


@pytest.fixture
async def store(cluster, request) -> AsyncIterator[RedisStore]:
    s = RedisStore(cluster.url, prefix=f"wake-{request.node.name[-40:]}")
    await s.connect()
    yield s
    await s.close()


def published(cluster: Cluster) -> dict[int, tuple[int, int]]:
    """Per primary's port: the PUBLISH and SPUBLISH it has run (inside scripts too)."""
    counts = {}
    for port in cluster.primaries():
        with cluster.client(port) as node:
            stats = node.info("commandstats")
        counts[port] = tuple(
            int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("publish", "spublish")
        )
    return counts


async def woken_once(store: RedisStore, q: QueueSpec, woken: asyncio.Queue[str]) -> None:
    """A receiver of `store`'s process waits on `q` (its call registers it) and a send wakes
    it."""
    waiter = f"{store.process_id}:receiver"
    assert await store.receive(q, 1, RAD, [], waiter) == []
    await store.send(q, [NewMessage(b"x")])
    assert await asyncio.wait_for(woken.get(), 5) == waiter
    assert [m.blob for m in await store.receive(q, 1, RAD, [])] == [b"x"]


async def until_woken_all(woken: asyncio.Queue[str]) -> None:
    while await asyncio.wait_for(woken.get(), 10) != WAKE_ALL:
        pass


async def test_a_wake_up_is_published_on_the_shard_that_ran_the_script(cluster, store):
    woken: asyncio.Queue[str] = asyncio.Queue()
    await store.subscribe(woken.put_nowait)
    q = QueueSpec("waits")
    before = published(cluster)
    await woken_once(store, q, woken)
    after = published(cluster)
    home = owner(cluster, slot_of(store, q))
    assert {port: (after[port][0] - b[0], after[port][1] - b[1]) for port, b in before.items()} == {
        port: (0, 1 if port == home else 0) for port in before
    }


async def test_a_slot_given_away_is_subscribed_again_where_it_went(cluster, store):
    woken: asyncio.Queue[str] = asyncio.Queue()
    await store.subscribe(woken.put_nowait)
    q = QueueSpec("moves")
    await woken_once(store, q, woken)
    await store.send(q, [NewMessage(b"kept")])  # keys in the slot, to move
    slot = slot_of(store, q)
    source = owner(cluster, slot)
    target = elsewhere(cluster, source)
    start_migration(cluster, slot, source, target)
    finish_migration(cluster, slot, target)
    # the source dropped the slot's channels (sunsubscribe): made again on the target, and
    # everyone waiting looks again, for what was published meanwhile
    await until_woken_all(woken)
    assert [m.blob for m in await store.receive(q, 1, RAD, [])] == [b"kept"]
    before = published(cluster)
    await woken_once(store, q, woken)
    assert published(cluster)[target][1] == before[target][1] + 1


async def test_a_broken_subscriber_connection_is_made_again_and_everyone_looks(cluster, store):
    woken: asyncio.Queue[str] = asyncio.Queue()
    await store.subscribe(woken.put_nowait)
    q = QueueSpec("breaks")
    await woken_once(store, q, woken)
    home = owner(cluster, slot_of(store, q))
    with cluster.client(home) as node:  # the sharded subscriber's alone (`ssub`)
        (sharded,) = [c["id"] for c in node.client_list() if int(c.get("ssub", 0)) > 0]
        assert node.execute_command("CLIENT", "KILL", "ID", sharded) == 1
    await until_woken_all(woken)
    await woken_once(store, q, woken)
