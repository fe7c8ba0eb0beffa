"""Fixtures of the in-memory protocol tests: busd's real protocol, connection handler and
broker over the session's real Redis/Valkey (tests/conftest.py), with no socket in between.

The `broker` and `new_protocol` fixtures are the one place that builds the broker side, as
busd/server/lifecycle.py does at start-up and for each accepted socket.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from busd.amqp.protocol import AmqpProtocol
from busd.broker.broker import Broker
from busd.broker.links.connection import ConnectionHandler
from busd.broker.settings import BrokerSettings
from busd.entities.records import QueueEntity
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import delete_prefix
from tests.protocol.harness import SAS_KEYS, ProtocolClient

# The queues every test's broker serves (docs/design.md §2.1 for the properties).
QUEUES = [
    QueueSpec("plain"),
    QueueSpec("other"),
    QueueSpec("sessions", requires_session=True, lock_duration_ms=10_000),
    QueueSpec("small", max_message_size=1024),
    # Short locks, so that expiry is seen within a test (QueueSpec takes what the entities
    # file would refuse as too short).
    QueueSpec("short-lock", lock_duration_ms=300),
    QueueSpec("short-sessions", requires_session=True, lock_duration_ms=300),
    # Locks renewed every quarter of their length: a machine would have to stall for most of
    # one to lose them between renewals.
    QueueSpec("renewed-sessions", requires_session=True, lock_duration_ms=2000),
]


class _Errors(logging.Handler):
    """Collects busd's ERROR records: a handler that failed inside the protocol loop is only
    logged there (busd/amqp/protocol.py), so the tests look for it."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest_asyncio.fixture
async def broker(redis_url: str) -> AsyncIterator[object]:
    """A started broker with a key prefix of its own, stopped and wiped afterwards. It gets a
    store of its own on the session's server (not the `store` fixture's): `Broker.start`
    connects its store, as busd/server/lifecycle.py has it do."""
    prefix = f"proto-{uuid.uuid4().hex[:12]}"
    store = RedisStore(redis_url, prefix=prefix)
    broker = Broker(store, sas_keys=dict(SAS_KEYS), settings=BrokerSettings(sweep_interval_s=0.2))
    errors = _Errors()
    busd_log = logging.getLogger("busd")
    busd_log.addHandler(errors)
    await broker.start()
    for queue in QUEUES:
        await broker.catalog.create(QueueEntity.from_spec(queue))
    try:
        yield broker
    finally:
        await broker.stop()
        busd_log.removeHandler(errors)
        delete_prefix(redis_url, prefix)
    assert not errors.records, "busd logged errors: " + "; ".join(
        r.getMessage() for r in errors.records
    )


@pytest.fixture
def new_protocol(broker) -> Callable[[], AmqpProtocol]:
    """The broker side of one connection, built as busd/server/lifecycle.py builds it."""
    return lambda: AmqpProtocol(lambda proto: ConnectionHandler(proto, broker))


@pytest_asyncio.fixture
async def connect(new_protocol) -> AsyncIterator[Callable[[], Awaitable[ProtocolClient]]]:
    """`await connect()`: a new client connection, open (SASL, open, begin); all are closed at
    the end, and the broker's clean-up of them is awaited."""
    clients: list[ProtocolClient] = []
    peers = iter(range(1, 1 << 16))

    async def make() -> ProtocolClient:
        client = ProtocolClient(new_protocol(), peer=("memory", next(peers)))
        clients.append(client)
        return await client.open()

    yield make
    for client in clients:
        try:
            if not client.sock.closed:
                await client.close()
        finally:
            client.sock.close()  # unanswered close: drop the "socket", as a peer would
    # What closing started (link releases) reaches the store before the broker stops.
    current = asyncio.current_task()
    pending = [
        t
        for t in asyncio.all_tasks()
        if t is not current and not t.done() and not (t.get_name() or "").startswith("busd-")
    ]
    if pending:
        await asyncio.wait(pending, timeout=3)


@pytest_asyncio.fixture
async def client(connect) -> ProtocolClient:
    """An open connection holding CBS grants for every queue."""
    c = await connect()
    await c.authorize(*(q.name for q in QUEUES))
    return c
