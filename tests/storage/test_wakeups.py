"""Wake-ups: scripts publish a queue's name when it may have work; subscribers hear it."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from busd.storage.api import EntityRef, NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis_store import RedisStore

PL = ReceiveMode.PEEK_LOCK


class Wakes:
    """Collects wake-ups; `next()` waits for one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()

    def __call__(self, name: str) -> None:
        self.queue.put_nowait(name)

    async def next(self, timeout: float = 2.0) -> str:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def none(self, wait: float = 0.15) -> bool:
        await asyncio.sleep(wait)
        return self.queue.empty()

    def clear(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()


@pytest_asyncio.fixture
async def wakes(store):
    w = Wakes()
    await store.subscribe(w)
    await asyncio.sleep(0.05)
    return w


async def test_send_wakes_every_subscribed_process(store, make_queue, wakes, redis_url):
    other = RedisStore(redis_url, prefix=store.prefix)
    await other.connect()
    other_wakes = Wakes()
    await other.subscribe(other_wakes)
    try:
        await asyncio.sleep(0.05)
        q = make_queue()
        await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
        assert await wakes.next() == q.name
        assert await other_wakes.next() == q.name
        assert await wakes.none()  # once per call, not per message
    finally:
        await other.close()


async def test_scheduled_send_does_not_wake_until_due(store, make_queue, wakes, server_now):
    q = make_queue()
    await store.schedule(q, [NewMessage(b"a", scheduled_ms=server_now() + 400)])
    assert await wakes.none(0.1)
    await asyncio.sleep(0.35)
    await store.sweep(q)
    assert await wakes.next() == q.name


async def test_abandon_and_release_wake(store, make_queue, wakes, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    await wakes.next()
    for outcome in (Outcome.ABANDON, Outcome.RELEASE):
        (m,) = await store.receive(EntityRef(q), 1, PL, tokens(1))
        assert await wakes.none(0.05)
        await store.settle(EntityRef(q), [Settlement(m.lock_token, outcome)])
        assert await wakes.next() == q.name


async def test_complete_does_not_wake(store, make_queue, wakes, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    await wakes.next()
    (m,) = await store.receive(EntityRef(q), 1, PL, tokens(1))
    await store.settle(EntityRef(q), [Settlement(m.lock_token, Outcome.COMPLETE)])
    assert await wakes.none()


async def test_lock_expiry_wakes(store, make_queue, wakes, tokens):
    q = make_queue(lock_duration_ms=50)
    await store.send(q, [NewMessage(b"a")])
    await wakes.next()
    await store.receive(EntityRef(q), 1, PL, tokens(1))
    await asyncio.sleep(0.1)
    await store.sweep(q)
    assert await wakes.next() == q.name


async def test_release_session_wakes(store, make_queue, wakes, tokens):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    await wakes.next()
    await store.accept_session(q, "s1", "h1")
    await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    await store.release_session(q, "s1", "h1")
    assert await wakes.next() == q.name


async def test_a_failing_callback_does_not_stop_the_listener(store, make_queue):
    seen: list[str] = []

    def callback(name: str) -> None:
        seen.append(name)
        raise RuntimeError("boom")

    await store.subscribe(callback)
    await asyncio.sleep(0.05)
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    await store.send(q, [NewMessage(b"b")])
    for _ in range(40):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.05)
    assert seen == [q.name, q.name]


async def test_listener_resubscribes_after_its_connection_is_killed(
    store, make_queue, wakes, redis_url
):
    import redis.asyncio as redis

    admin = redis.Redis.from_url(redis_url)
    try:
        clients = await admin.client_list(_type="pubsub")
        ours = [c["id"] for c in clients if c["name"] == f"busd:{store.prefix}"]
        assert ours
        for client_id in ours:
            await admin.client_kill_filter(_id=client_id)
    finally:
        await admin.aclose()
    q = make_queue()
    for _ in range(40):  # until the listener is back
        await store.send(q, [NewMessage(b"a")])
        try:
            assert await wakes.next(timeout=0.1) == q.name
            return
        except asyncio.TimeoutError:
            pass
    pytest.fail("no wake-up after the subscription's connection was killed")
