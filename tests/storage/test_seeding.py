"""The entities file against the store's catalog (busd/server/seeding.py): checked whole
before anything is written, so a file asking for what a stored entity cannot become changes
nothing (docs/design.md §2.1)."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

from busd.broker.catalog import Catalog
from busd.config.entities_file import EntitiesFile
from busd.entities.records import QueueEntity, SubscriptionEntity, TopicEntity
from busd.errors import ConfigError
from busd.server.seeding import seed_catalog
from busd.storage.messages import NewMessage
from busd.storage.redis.store import RedisStore
from tests.conftest import delete_prefix


@pytest_asyncio.fixture
async def catalog(redis_url):
    prefix = f"seeding-{uuid.uuid4().hex[:12]}"
    store = RedisStore(redis_url, prefix=prefix)
    await store.connect()
    catalog = Catalog(store)
    await catalog.start()
    yield catalog
    await catalog.stop()
    await store.close()
    delete_prefix(redis_url, prefix)


def file_of(*, sessions: bool, lock_ms: int = 60_000) -> EntitiesFile:
    return EntitiesFile(
        queues=[QueueEntity("other", lock_duration_ms=lock_ms)],
        topics=[TopicEntity("events")],
        subscriptions=[SubscriptionEntity("events", "audit", requires_session=sessions)],
    )


async def test_a_subscription_holding_messages_keeps_its_requires_session(catalog):
    await seed_catalog(catalog, file_of(sessions=False))
    topic = catalog.topic("events")
    sub = catalog.subscription("events", "audit")
    await catalog.store.publish(topic.spec, [sub.spec(topic)], [NewMessage(b"m")])
    before = await catalog.store.catalog_all()

    with pytest.raises(ConfigError) as err:
        await seed_catalog(catalog, file_of(sessions=True, lock_ms=90_000))
    assert str(err.value) == (
        "entities file: subscription 'events/subscriptions/audit': RequiresSession cannot be "
        "turned on while it holds 1 messages (they would stay where no receiver could take "
        "them); receive or purge them, or keep the stored RequiresSession"
    )
    # `other`'s LockDuration, first in the file, was not written either
    assert await catalog.store.catalog_all() == before


async def test_an_empty_subscription_takes_the_file_s_requires_session(catalog):
    await seed_catalog(catalog, file_of(sessions=False))
    await seed_catalog(catalog, file_of(sessions=True))
    assert catalog.subscription("events", "audit").requires_session is True


async def test_a_topic_redeclared_as_a_queue_is_refused_naming_it(catalog):
    await seed_catalog(catalog, file_of(sessions=False))
    before = await catalog.store.catalog_all()
    redeclared = EntitiesFile(queues=[QueueEntity("other", lock_duration_ms=90_000)])
    redeclared.queues.append(QueueEntity("events"))
    with pytest.raises(ConfigError, match="queue 'events' is a topic in the store"):
        await seed_catalog(catalog, redeclared)
    assert await catalog.store.catalog_all() == before
