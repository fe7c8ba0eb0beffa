"""A store named by its Sentinels (`redis+sentinel://`) follows the primary they promote:
while the primary is gone, calls fail at once with StoreUnavailable (clients hear
com.microsoft:server-busy), and they succeed again on the promoted replica, with what was
acknowledged before (docs/design.md §3.9)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from busd.storage.api import StoreUnavailable
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.redis.store import RedisStore, parse_sentinel_url
from busd.storage.specs import QueueSpec
from tests.faults.replicas import ReplicaSet

pytestmark = pytest.mark.timeout(90)


def test_sentinel_urls_name_the_sentinels_the_service_and_the_primary_credentials():
    assert parse_sentinel_url("redis+sentinel://a:26380,b/mymaster") == (
        [("a", 26380), ("b", 26379)],
        "mymaster",
        {},
    )
    assert parse_sentinel_url("rediss+sentinel://:p%40ss@h:1/svc") == (
        [("h", 1)],
        "svc",
        {"ssl": True, "password": "p@ss"},
    )
    assert parse_sentinel_url("redis://localhost:6379") is None
    with pytest.raises(ValueError):
        parse_sentinel_url("redis+sentinel://h:1")  # no service


@pytest.fixture
def replica_set(tmp_path):
    nodes = ReplicaSet(tmp_path, replicas=1, sentinels=3)
    yield nodes
    nodes.stop()


async def call_until(store: RedisStore, payload: bytes, done, timeout: float = 20) -> float:
    """Send `payload` until `done(outcome)` (an exception, or None for success); each call
    must end within 6 s, answered or refused. How long it took."""
    q = QueueSpec("q")
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        call = time.monotonic()
        try:
            await store.send(q, [NewMessage(payload)])
            outcome = None
        except StoreUnavailable as exc:
            outcome = exc
        assert time.monotonic() - call < 6, "a call hung"
        if done(outcome):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"not done within {timeout} s")


async def test_calls_fail_fast_while_the_primary_is_gone_and_resume_on_the_promoted_one(
    replica_set,
):
    """--durability replicated with one replica: once it is promoted, no replica is left to
    confirm a write, and writes are refused (never acknowledged unreplicated) until one is
    back."""
    store = RedisStore(
        replica_set.url, prefix=f"sentinel-{uuid.uuid4().hex[:8]}", durability="replicated"
    )
    await store.connect()
    try:
        q = QueueSpec("q")
        assert await store.send(q, [NewMessage(b"before")]) == [1]
        old = replica_set.primary_port
        replica_set.kill(old)
        # the promoted replica answers, but cannot confirm: refused, not acknowledged
        followed = await call_until(
            store, b"refused", lambda e: e is not None and "durable" in str(e)
        )
        assert followed < 10, followed
        assert replica_set.current_primary() not in (None, old)
        replica_set.add_replica("replacement")
        await call_until(store, b"acknowledged", lambda e: e is None)
        got = await store.receive(q, 100, ReceiveMode.RECEIVE_AND_DELETE, [])
        blobs = [m.blob for m in got]
        assert blobs[0] == b"before" and blobs[-1] == b"acknowledged"
        # refused calls may or may not have run (as any call whose answer is lost)
        assert set(blobs[1:-1]) <= {b"refused", b"acknowledged"}
    finally:
        await store.close()
