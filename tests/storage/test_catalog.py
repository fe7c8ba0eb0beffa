"""The entity catalog: records in the store, every process's view following them at once, and
an entity's data going with its record."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import pytest_asyncio

from busd.broker.catalog import Catalog
from busd.config.entities_file import EntitiesFile
from busd.entities import access_rules
from busd.entities.records import QueueEntity, RuleEntity, SubscriptionEntity, TopicEntity
from busd.errors import BusdError, Condition
from busd.server.seeding import seed_catalog
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.partitioned.router import wrap
from busd.storage.redis.store import RedisStore
from tests.conftest import delete_prefix


@pytest_asyncio.fixture
async def two_views(redis_url):
    """Two catalogs over two store clients sharing one prefix: two busd processes."""
    prefix = f"catalog-{uuid.uuid4().hex[:12]}"
    stores = [RedisStore(redis_url, prefix=prefix) for _ in range(2)]
    catalogs = []
    for s in stores:
        await s.connect()
        catalog = Catalog(s)
        await catalog.start()
        catalogs.append(catalog)
    yield catalogs
    for catalog, s in zip(catalogs, stores):
        await catalog.stop()
        await s.close()
    delete_prefix(redis_url, prefix)


async def until(condition, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the other view did not follow"
        await asyncio.sleep(0.01)


async def test_a_change_on_one_process_reaches_the_other_at_once(two_views):
    a, b = two_views
    await a.create(QueueEntity("Orders", lock_duration_ms=5000))
    await until(lambda: b.queue("orders") is not None)
    assert b.queue("ORDERS").lock_duration_ms == 5000
    await b.update(QueueEntity("orders", lock_duration_ms=7000))
    await until(lambda: a.queue("orders").lock_duration_ms == 7000)
    assert a.queue("orders").created_ms is not None  # kept across the update
    await a.delete("queue", "orders")
    await until(lambda: b.queue("orders") is None)


async def test_a_namespace_made_by_one_process_is_known_to_every_process(two_views):
    made_by, other = (wrap(view.store) for view in two_views)
    assert not await other.namespace_known("team-a")
    await made_by.namespace_add("team-a")
    await made_by.namespace_add("team-a")  # each process that makes it writes it: no harm
    assert await other.namespace_known("team-a")
    assert not await other.namespace_known("team-b")


async def test_subscriptions_get_the_default_rule_and_cascade_on_delete(two_views):
    a, b = two_views
    await a.create(TopicEntity("t"))
    await a.create(SubscriptionEntity("t", "s1"))
    await a.create(
        SubscriptionEntity("t", "s2", requires_session=True),
        rules=[RuleEntity("t", "s2", "mine", {"config": {"FilterType": "Sql"}})],
    )
    await until(lambda: len(b.rules("t", "s2")) == 1 and len(b.rules("t", "s1")) == 1)
    assert [r.name for r in b.rules("t", "s1")] == ["$Default"]
    assert b.spec("t/subscriptions/s2").requires_session
    assert b.spec("t/subscriptions/s2").topic == "t"
    assert [s.name for s in b.subscriptions("T")] == ["s1", "s2"]
    await a.delete("topic", "t")
    await until(
        lambda: (
            b.topic("t") is None
            and not b.subscriptions("t")
            and not b.rules("t", "s1")
            and b.spec("t/subscriptions/s1") is None
        )
    )


async def test_names_are_unique_across_queues_and_topics(two_views):
    a, _ = two_views
    await a.create(QueueEntity("x"))
    with pytest.raises(BusdError) as exists:
        await a.create(TopicEntity("X"))
    assert exists.value.condition == Condition.ENTITY_ALREADY_EXISTS
    with pytest.raises(BusdError) as missing:
        await a.create(SubscriptionEntity("nope", "s"))
    assert missing.value.condition == Condition.NOT_FOUND


async def test_put_seeds_and_the_file_wins_for_what_it_names(two_views):
    a, b = two_views
    await a.create(TopicEntity("t"))
    await a.put(
        SubscriptionEntity("t", "s", max_delivery_count=3),
        rules=[RuleEntity("t", "s", "r1", {"config": 1})],
    )
    await b.create(RuleEntity("t", "s", "added-at-run-time"))
    await b.put(
        SubscriptionEntity("t", "s", max_delivery_count=5),
        rules=[RuleEntity("t", "s", "R1", {"config": 2})],
    )
    await until(
        lambda: (
            a.subscription("t", "s").max_delivery_count == 5
            and [r.rule for r in a.rules("t", "s")] == [{"config": 2}]
        )
    )


async def test_a_new_view_loads_everything_and_unreadable_records_are_skipped(two_views, redis_url):
    a, _ = two_views
    await a.create(QueueEntity("q"))
    await a.store.catalog_put("queue", "broken", {"name": "broken", "lock_duration_ms": []})
    await a.store.catalog_put("martian", "m", {})
    late = Catalog(a.store)
    await late.reload()
    assert late.queue("q") is not None
    assert {q.name for q in late.queues()} >= {"q"}


async def test_deleting_an_entity_deletes_its_messages(two_views):
    a, _ = two_views
    store = a.store
    await a.create(QueueEntity("q"))
    await a.create(TopicEntity("t"))
    await a.create(SubscriptionEntity("t", "keep"))
    await a.create(SubscriptionEntity("t", "gone"))
    q = a.spec("q")
    keep, gone = a.spec("t/subscriptions/keep"), a.spec("t/subscriptions/gone")
    for spec in (q, keep, gone):
        await store.send(spec, [NewMessage(b"m", session_id=None)])
    await a.delete("subscription", "t/subscriptions/gone")
    await a.delete("queue", "q")
    assert (await store.counts(gone)).active == 0
    assert (await store.counts(q)).active == 0
    assert len(await store.receive(keep, 5, ReceiveMode.RECEIVE_AND_DELETE, [])) == 1
    client = store._client
    leftovers = [k async for k in client.scan_iter(match=f"{{{store.prefix}:q}}:*")]
    leftovers += [k async for k in client.scan_iter(match=f"{{{store.prefix}:t}}:s:gone:*")]
    assert leftovers == []
    assert await client.smembers(f"{{{store.prefix}:t}}:subs") == {b"keep"}


async def test_seeding_keeps_the_access_keys_another_process_made_first(redis_url):
    """Two processes seed one entities file whose rule has no keys: the one that has not seen
    the other's record yet keeps its keys instead of writing keys of its own
    (docs/design.md §2.10)."""
    prefix = f"catalog-{uuid.uuid4().hex[:12]}"
    stores = [RedisStore(redis_url, prefix=prefix) for _ in range(2)]
    rules = access_rules.normalize([{"KeyName": "app", "Rights": ["Send"]}], fill=False)
    entities = EntitiesFile(queues=[QueueEntity("orders", extra={"AuthorizationRules": rules})])
    try:
        for s in stores:
            await s.connect()
        first, late = Catalog(stores[0]), Catalog(stores[1])  # `late` has read nothing yet
        await first.start()
        await seed_catalog(first, entities)
        (made,) = first.queue("orders").extra["AuthorizationRules"]
        assert made["PrimaryKey"] and made["SecondaryKey"]
        await seed_catalog(late, entities)
        (kept,) = (await first.stored("queue", "orders")).extra["AuthorizationRules"]
        assert (kept["PrimaryKey"], kept["SecondaryKey"], kept["CreatedTime"]) == (
            made["PrimaryKey"],
            made["SecondaryKey"],
            made["CreatedTime"],
        )
        await first.stop()
    finally:
        for s in stores:
            await s.close()
        delete_prefix(redis_url, prefix)
