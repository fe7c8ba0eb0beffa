"""Wake-ups reach only who can take the work: the holder of a session, one waiting
next-available receiver per session that becomes free, one waiting receiver per message that
becomes available; each on its own process's channel, each once."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from busd.storage import keys as keyspace
from busd.storage.api import WAKE_ALL
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec

PL = ReceiveMode.PEEK_LOCK
RAD = ReceiveMode.RECEIVE_AND_DELETE


class Wakes:
    """Collects the wake-ups of one process; `next()` waits for one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()

    def __call__(self, waiter: str) -> None:
        self.queue.put_nowait(waiter)

    async def next(self, timeout: float = 2.0) -> str:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def all(self, wait: float = 0.2) -> list[str]:
        await asyncio.sleep(wait)
        out = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out

    async def none(self, wait: float = 0.15) -> bool:
        await asyncio.sleep(wait)
        return self.queue.empty()


@pytest_asyncio.fixture
async def wakes(store):
    w = Wakes()
    await store.subscribe(w)
    await asyncio.sleep(0.05)
    return w


@pytest_asyncio.fixture
async def other(store, redis_url):
    """A second broker process's store over the same server, with its wake-ups."""
    s = RedisStore(redis_url, prefix=store.prefix)
    await s.connect()
    s.wakes = Wakes()
    await s.subscribe(s.wakes)
    await asyncio.sleep(0.05)
    yield s
    await s.close()


def waiter(store, name: str) -> str:
    return f"{store.process_id}:{name}"


async def wait_for_message(store, q, name: str, dlq: bool = False) -> str:
    """Register `name` as a waiting receiver of an empty entity; returns its waiter id."""
    w = waiter(store, name)
    assert await store.receive((q.dead_letter_queue if dlq else q), 1, RAD, [], w) == []
    return w


async def wait_for_session(store, q, name: str) -> str:
    w = waiter(store, name)
    assert await store.accept_session(q, None, w, wait=True) is None
    return w


async def test_a_message_wakes_one_waiter_on_its_own_process_only(store, make_queue, wakes, other):
    q = make_queue()
    first = await wait_for_message(other, q, "first")
    second = await wait_for_message(store, q, "second")
    await store.send(q, [NewMessage(b"a")])
    assert await other.wakes.next() == first  # the oldest waiter, on the other process
    assert await wakes.none()
    await store.send(q, [NewMessage(b"b")])
    assert await wakes.next() == second
    assert await other.wakes.none()


async def test_a_batch_wakes_as_many_waiters_as_messages_once_each(store, make_queue, wakes):
    q = make_queue()
    ids = [await wait_for_message(store, q, f"r{i}") for i in range(5)]
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    assert sorted(await wakes.all()) == sorted(ids[:2])
    await store.send(q, [NewMessage(b"c")] * 10)
    assert sorted(await wakes.all()) == sorted(ids[2:])  # three left to wake, none twice


async def test_idle_waiters_cost_nothing_per_message(store, make_queue, wakes):
    """With many waiters and no free work, a send wakes exactly one of them."""
    q = make_queue()
    for i in range(200):
        await wait_for_message(store, q, f"r{i}")
    await store.send(q, [NewMessage(b"a")])
    assert await wakes.all() == [waiter(store, "r0")]


async def test_a_receiver_that_got_everything_it_asked_for_is_not_waiting(store, make_queue, wakes):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    w = waiter(store, "r")
    assert len(await store.receive(q, 1, RAD, [], w)) == 1
    await store.send(q, [NewMessage(b"b")])
    assert await wakes.none()


async def test_scheduled_send_does_not_wake_until_due(store, make_queue, wakes, server_now):
    q = make_queue()
    w = await wait_for_message(store, q, "r")
    await store.schedule(q, [NewMessage(b"a", scheduled_ms=server_now() + 400)])
    assert await wakes.none(0.1)
    await asyncio.sleep(0.35)
    await store.sweep(q)
    assert await wakes.next() == w


async def test_abandon_and_release_wake_a_waiter(store, make_queue, wakes, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    for outcome in (Outcome.ABANDON, Outcome.RELEASE):
        (m,) = await store.receive(q, 1, PL, tokens(1))
        w = await wait_for_message(store, q, f"after-{outcome.value}")
        assert await wakes.none(0.05)
        await store.settle(q, [Settlement(m.lock_token, outcome)])
        assert await wakes.next() == w


async def test_complete_does_not_wake(store, make_queue, wakes, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    (m,) = await store.receive(q, 1, PL, tokens(1))
    await wait_for_message(store, q, "r")
    await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE)])
    assert await wakes.none()


async def test_dead_lettering_wakes_a_dead_letter_receiver(store, make_queue, wakes, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    (m,) = await store.receive(q, 1, PL, tokens(1))
    plain = await wait_for_message(store, q, "plain")
    dead = await wait_for_message(store, q, "dead", dlq=True)
    await store.settle(q, [Settlement(m.lock_token, Outcome.DEAD_LETTER)])
    assert await wakes.all() == [dead]
    assert await store.stop_waiting(q, "q", plain)


async def test_lock_expiry_wakes(store, make_queue, wakes, tokens):
    q = make_queue(lock_duration_ms=50)
    await store.send(q, [NewMessage(b"a")])
    await store.receive(q, 1, PL, tokens(1))
    w = await wait_for_message(store, q, "r")
    await asyncio.sleep(0.1)
    await store.sweep(q)
    assert await wakes.next() == w


# --- sessions ------------------------------------------------------------------------------
async def test_a_new_session_wakes_one_next_available_waiter(store, make_queue, wakes, other):
    q = make_queue(requires_session=True)
    first = await wait_for_session(other, q, "first")
    second = await wait_for_session(store, q, "second")
    await store.send(q, [NewMessage(b"a", session_id="s1"), NewMessage(b"b", session_id="s1")])
    assert await other.wakes.next() == first  # one session became free: one waiter
    assert await wakes.none()
    lock = await other.accept_session(q, None, first, wait=True)
    assert lock is not None and lock.session_id == "s1"
    await store.send(q, [NewMessage(b"c", session_id="s2")])
    assert await wakes.next() == second


async def test_a_waiter_that_locks_a_session_is_no_longer_woken(store, make_queue, wakes):
    """An accept tells whether an earlier call registered the holder as a waiter (`waiting`):
    then the lock takes it off the waiters, else there is nothing to take off."""
    q = make_queue(requires_session=True)
    # waiters are woken oldest first, and by name within a millisecond: "a-" goes first
    woken = await wait_for_session(store, q, "a-woken")
    early = await wait_for_session(store, q, "b-early")
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    assert await wakes.next() == woken  # taken off the waiters by the wake-up
    # a waiter not woken locks it first (its time-out ran out, say): it leaves the waiters
    lock = await store.accept_session(q, None, early, wait=True, waiting=True)
    assert lock is not None and lock.session_id == "s1"
    await store.send(q, [NewMessage(b"b", session_id="s2")])
    assert await wakes.none()  # neither waits any more
    # a receiver no call registered needs no taking off
    fresh = waiter(store, "fresh")
    lock = await store.accept_session(q, None, fresh, wait=True, waiting=False)
    assert lock is not None and lock.session_id == "s2"
    later = await wait_for_session(store, q, "later")
    await store.send(q, [NewMessage(b"c", session_id="s3")])
    assert await wakes.next() == later


async def test_a_held_session_wakes_its_holder_only(store, make_queue, wakes, other, tokens):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    holder = waiter(other, "holder")
    assert (await other.accept_session(q, "s1", holder)).session_id == "s1"
    idle = [await wait_for_session(store, q, f"idle{i}") for i in range(50)]
    await other.receive_session(q, "s1", holder, 10, PL, tokens(10))
    await store.send(q, [NewMessage(b"b", session_id="s1"), NewMessage(b"c", session_id="s1")])
    assert await other.wakes.next() == holder  # once for the batch
    assert await other.wakes.none()
    assert await wakes.none()  # none of the 50 idle waiters
    assert all([await store.stop_waiting(q, "s", w) for w in idle])


async def test_the_holder_is_not_woken_by_its_own_abandon(store, make_queue, wakes, tokens):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    holder = waiter(store, "holder")
    await store.accept_session(q, "s1", holder)
    (m,) = await store.receive_session(q, "s1", holder, 1, PL, tokens(1))
    await store.settle(q, [Settlement(m.lock_token, Outcome.ABANDON, session_id="s1")], holder)
    assert await wakes.none()


async def test_releasing_a_session_wakes_a_waiter_not_the_holder(store, make_queue, wakes, tokens):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    holder = waiter(store, "holder")
    await store.accept_session(q, "s1", holder)
    await store.receive_session(q, "s1", holder, 1, PL, tokens(1))
    w = await wait_for_session(store, q, "next")
    await store.release_session(q, "s1", holder)
    assert await wakes.all() == [w]


async def test_an_expired_session_lock_wakes_a_waiter(store, make_queue, wakes, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=50)
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    holder = waiter(store, "holder")
    await store.accept_session(q, "s1", holder)
    await store.receive_session(q, "s1", holder, 1, PL, tokens(1))
    w = await wait_for_session(store, q, "next")
    await asyncio.sleep(0.1)
    await store.sweep(q)
    assert await wakes.all() == [w]


# --- waiters that go away, processes that die ------------------------------------------------
async def test_a_waiter_that_leaves_passes_its_wake_up_on(store, make_queue, wakes):
    q = make_queue(requires_session=True)
    gone = await wait_for_session(store, q, "gone")
    stays = await wait_for_session(store, q, "stays")
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    assert await wakes.next() == gone
    # it leaves without accepting: the session is still free, so the next waiter is woken
    assert not await store.stop_waiting(q, "s", gone)
    assert await wakes.next() == stays
    assert (await store.accept_session(q, None, stays, wait=True)).session_id == "s1"


async def test_a_waiter_that_leaves_while_waiting_wakes_no_one(store, make_queue, wakes):
    q = make_queue()
    w1 = await wait_for_message(store, q, "w1")
    await wait_for_message(store, q, "w2")
    assert await store.stop_waiting(q, "q", w1)
    assert await wakes.none()


async def test_the_sweep_drops_the_waiters_of_a_process_that_stopped(
    store, make_queue, wakes, monkeypatch
):
    import busd.storage.redis.store as rs

    q = make_queue()
    monkeypatch.setattr(rs, "LIVENESS_MS", 50)
    dead = "deadbeef0000"
    # the other process was live once (no SessionIdleTimeToLive: '')
    await store._run_queue("sweepQueue", q, dead, 50, 16, "")
    assert await store.receive(q, 1, RAD, [], f"{dead}:r") == []
    live = await wait_for_message(store, q, "live")
    await asyncio.sleep(0.1)
    await store.sweep(q)  # the dead process did not sweep: its waiter goes
    await store.send(q, [NewMessage(b"a")])
    assert await wakes.next() == live


async def test_the_sweep_wakes_waiters_where_work_and_waiters_meet(store, make_queue, wakes):
    """A wake-up lost on the way (an interrupted subscription) is made good by the sweep."""
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    # a waiter registered beside an available message: what a lost wake-up leaves behind
    w = waiter(store, "stuck")
    await store._client.zadd(keyspace.key(store.prefix, q.name, "q.waiters"), {w: 0})
    assert await wakes.none(0.05)
    await store.sweep(q)
    assert await wakes.next() == w


async def test_a_failing_callback_does_not_stop_the_listener(store, make_queue):
    seen: list[str] = []

    def callback(name: str) -> None:
        seen.append(name)
        raise RuntimeError("boom")

    await store.subscribe(callback)
    await asyncio.sleep(0.05)
    q = make_queue()
    w1 = await wait_for_message(store, q, "w1")
    w2 = await wait_for_message(store, q, "w2")
    await store.send(q, [NewMessage(b"a")])
    await store.send(q, [NewMessage(b"b")])
    for _ in range(40):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.05)
    assert seen == [w1, w2]


async def test_listener_resubscribes_after_its_connection_is_killed_and_wakes_everyone(
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
    # wake-ups may have been lost meanwhile: everyone is told to look again
    assert await wakes.next(timeout=5) == WAKE_ALL
    q = make_queue()
    for i in range(40):  # until the listener is back
        w = await wait_for_message(store, q, f"r{i}")
        await store.send(q, [NewMessage(b"a")])
        try:
            if await wakes.next(timeout=0.1) == w:
                return
        except TimeoutError:
            pass
        await store.receive(q, 10, RAD, [])
    pytest.fail("no wake-up after the subscription's connection was killed")


async def test_a_topic_send_committed_in_a_transaction_wakes_the_subscriptions_it_reached(
    store, wakes
):
    """The commit fans out as a send does: a waiter on each subscription that got a copy is
    woken, one on a subscription that got none is not."""
    import os
    import uuid

    from busd.storage.messages import Placement
    from busd.storage.specs import TopicSpec, subscription_path
    from busd.storage.staged import StagedPublish

    name = f"t-{uuid.uuid4().hex[:8]}"
    subs = [QueueSpec(subscription_path(name, n), topic=name) for n in ("a", "b", "c")]
    await store.open_subscriptions(name, ["a", "b", "c"])
    topic = TopicSpec(name)
    a, b, c = [await wait_for_message(store, s, s.subscription) for s in subs]
    txn = os.urandom(16)
    await store.stage_transaction(
        topic,
        txn,
        [StagedPublish(topic, NewMessage(b"m"), ["a", "b", "c"], [Placement(0), Placement(2)])],
        first=True,
        timeout_ms=60_000,
        limit=100,
    )
    assert await wakes.none()  # staged: nothing to take yet
    await store.commit_transaction(topic, [], txn, [(topic, subs)])
    assert sorted(await wakes.all()) == sorted([a, c])
    assert b not in await wakes.all()
