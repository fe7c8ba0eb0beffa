"""A process's next-available acceptors of a partitioned queue wait as one: its waiter is
registered once per partition, a session freed there wakes its oldest waiting acceptor with
the partition to look in, and no wake-up is lost (busd/storage/partitioned/waits.py). On a real
server, through the partitioned store as the broker uses it; the inner store's accept calls
are counted, not replaced."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest_asyncio
import redis

from busd.storage import keys as keyspace
from busd.storage.api import WAKE_ALL
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.partitioned.router import wrap
from busd.storage.partitioned.waits import PartitionWaits
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from busd.testing.broker import delete_prefix

from .test_wakeups import Wakes

PARTITIONS = 4
PL = ReceiveMode.PEEK_LOCK


class Process:
    """One broker process's partitioned store, its wake-ups and its inner accept calls."""

    def __init__(self, url: str, prefix: str) -> None:
        self.inner = RedisStore(url, prefix=prefix)
        self.store = wrap(self.inner)
        self.wakes = Wakes()
        self.accepts: list[int] = []  # the partition of each inner accept call
        accept = self.inner.accept_session

        async def counted(queue, *args, **kwargs):
            self.accepts.append(queue.partition or 0)
            return await accept(queue, *args, **kwargs)

        self.inner.accept_session = counted  # type: ignore[method-assign]

    def acceptor(self, name: str) -> str:
        return f"{self.store.process_id}:{name}"

    async def accept(self, queue: QueueSpec, name: str):
        return await self.store.accept_session(queue, None, self.acceptor(name), wait=True)


@pytest_asyncio.fixture
async def processes(redis_url: str, store_prefix: str) -> AsyncIterator[list[Process]]:
    made = [Process(redis_url, store_prefix) for _ in range(2)]
    for p in made:
        await p.store.connect()
        await p.store.subscribe(p.wakes)
    await asyncio.sleep(0.05)
    yield made
    for p in made:
        await p.store.close()
    delete_prefix(redis_url, store_prefix)


def queue() -> QueueSpec:
    return QueueSpec(
        name=f"pq-{uuid.uuid4().hex[:8]}", requires_session=True, partitions=PARTITIONS
    )


def session_in(store, q: QueueSpec, partition: int, n: int = 0) -> str:
    """The n-th session id (s0, s1, ...) that falls in `partition`."""
    found = [
        sid
        for sid in (f"s{i}" for i in range(1000))
        if store.part_of_session(q, sid).partition == partition
    ]
    return found[n]


def waiters(url: str, prefix: str, q: QueueSpec) -> list[list[str]]:
    """Each partition's registered next-available waiters."""
    names = [keyspace.key(prefix, part.key_scope[0], "swaiters") for part in q.partition_specs]
    with redis.Redis.from_url(url) as client:
        return [[w.decode() for w in client.zrange(name, 0, -1)] for name in names]


async def test_acceptors_of_one_process_register_it_once_per_partition(
    processes, redis_url, store_prefix
):
    p, _ = processes
    q = queue()
    for i in range(10):
        assert await p.accept(q, f"a{i}") is None
    # the first looked in every partition; the others knew this process waits in each
    assert sorted(p.accepts) == list(range(PARTITIONS))
    registered = waiters(redis_url, store_prefix, q)
    assert all(len(ws) == 1 and ws[0].startswith(p.store.process_id + ":") for ws in registered)
    for i in range(10):
        assert await p.store.stop_waiting(q, "s", p.acceptor(f"a{i}"))


async def test_a_freed_session_wakes_the_oldest_acceptor_which_takes_it_in_one_call(processes):
    p, _ = processes
    q = queue()
    for i in range(3):
        assert await p.accept(q, f"a{i}") is None
    sid = session_in(p.store, q, 2)
    await p.store.send(q, [NewMessage(b"x", session_id=sid)])
    assert await p.wakes.next() == p.acceptor("a0")
    assert await p.wakes.none()
    p.accepts.clear()
    lock = await p.accept(q, "a0")
    assert lock is not None and lock.session_id == sid
    assert p.accepts == [2]  # the partition it was woken for, first
    # the next acceptor looks there too (one more may be free): empty, it registers again
    assert await p.wakes.next() == p.acceptor("a1")
    p.accepts.clear()
    assert await p.accept(q, "a1") is None
    assert p.accepts == [2]


async def test_sessions_freed_together_in_a_partition_reach_as_many_acceptors(processes):
    """The store woke this process's one waiter for two sessions; the chain takes both."""
    p, _ = processes
    q = queue()
    for i in range(3):
        assert await p.accept(q, f"a{i}") is None
    sids = [session_in(p.store, q, 1, n) for n in range(2)]
    await p.store.send(q, [NewMessage(b"x", session_id=sid) for sid in sids])
    got = []
    for i in range(2):
        assert await p.wakes.next() == p.acceptor(f"a{i}")
        lock = await p.accept(q, f"a{i}")
        got.append(lock.session_id)
    assert sorted(got) == sorted(sids)
    assert await p.wakes.next() == p.acceptor("a2")  # looks, finds it empty, waits again
    assert await p.accept(q, "a2") is None
    assert await p.wakes.none()


async def test_a_wake_up_left_unused_goes_to_the_next_acceptor_then_to_another_process(
    processes,
):
    p, other = processes
    q = queue()
    assert await other.accept(q, "b0") is None  # another process, the oldest waiter
    for i in range(2):
        assert await p.accept(q, f"a{i}") is None
    sid = session_in(p.store, q, 3)
    await p.store.send(q, [NewMessage(b"x", session_id=sid)])
    assert await other.wakes.next() == other.acceptor("b0")
    # b0 leaves without looking: its process passes the wake-up back to the store, which
    # wakes the next waiter of that partition, this process's
    assert not await other.store.stop_waiting(q, "s", other.acceptor("b0"))
    assert await p.wakes.next() == p.acceptor("a0")
    # a0 leaves too: the next acceptor of its process gets the partition
    assert not await p.store.stop_waiting(q, "s", p.acceptor("a0"))
    assert await p.wakes.next() == p.acceptor("a1")
    lock = await p.accept(q, "a1")
    assert lock is not None and lock.session_id == sid


async def test_a_lost_subscription_makes_every_partition_looked_at_again(processes):
    p, _ = processes
    q = queue()
    assert await p.accept(q, "a0") is None
    p.accepts.clear()
    assert await p.accept(q, "a1") is None
    assert p.accepts == []
    p.store._waits.lost()  # what WAKE_ALL does, besides waking everyone
    assert await p.accept(q, "a2") is None
    assert sorted(p.accepts) == list(range(PARTITIONS))


async def test_the_subscription_routes_the_process_waiters_and_wake_all(redis_url, store_prefix):
    """What the partitioned store gives the inner store's subscription: its own waiters'
    wake-ups go to its acceptors; WAKE_ALL (a lost subscription) reaches everyone and drops
    the registrations. The subscription itself is captured, the store is real."""
    p = Process(redis_url, store_prefix)
    captured = []

    async def capture(on_wake) -> None:
        captured.append(on_wake)

    p.inner.subscribe = capture  # type: ignore[method-assign]
    await p.store.connect()
    try:
        await p.store.subscribe(p.wakes)
        (wrapper,) = captured
        q = queue()
        assert await p.accept(q, "a0") is None
        waits = p.store._waits.of(q.name)
        assert sorted(waits.registered) == list(range(PARTITIONS))
        wrapper(p.store._waits.waiter_id(waits, 2))  # the process's waiter of partition 2
        assert await p.wakes.next() == p.acceptor("a0")  # went to its acceptor
        assert sorted(waits.registered) == [0, 1, 3]
        wrapper(WAKE_ALL)
        assert await p.wakes.next() == WAKE_ALL
        assert not waits.registered
        wrapper(p.acceptor("held"))  # anyone else's wake-up goes through as it is
        assert await p.wakes.next() == p.acceptor("held")
    finally:
        await p.store.close()
        delete_prefix(redis_url, store_prefix)


# --- the bookkeeping alone -------------------------------------------------------------------
def test_a_wake_up_that_comes_during_an_accept_is_looked_at_by_it() -> None:
    waits = PartitionWaits("p1")
    woken: list[str] = []
    passed: list[tuple[str, int, str]] = []
    waits.wake = woken.append
    waits.pass_on = lambda w, partition, waiter: passed.append((w.name, partition, waiter))
    q = waits.of("q")
    waits.waiter_id(q, 3)
    first = waits.begin(q, "p1:a")
    assert first is None
    # the store woke the process for partition 3 while a's accept looked elsewhere
    assert waits.woke("p1:~s3:q")
    assert woken == [] and passed == []
    assert waits.next_pending(q) == 3  # the accept looks there before it waits
    waits.end(q, "p1:a", found=False, woken_for=None, wait=True)
    assert q.waiting == {"p1:a": None}
    # with nobody waiting and nothing under way, a wake-up goes back to the store
    assert waits.leave("q", "p1:a")
    assert waits.woke("p1:~s3:q")
    assert passed == [("q", 3, "p1:~")]  # as a waiter never registered
    assert not waits.woke("p1:someone-else")


def test_a_wake_up_goes_to_a_waiting_acceptor_before_an_accept_under_way() -> None:
    waits = PartitionWaits("p1")
    woken: list[str] = []
    passed: list[int] = []
    waits.wake = woken.append
    waits.pass_on = lambda w, partition, waiter: passed.append(partition)
    q = waits.of("q")
    waits.waiter_id(q, 1)
    waits.begin(q, "p1:b")
    waits.end(q, "p1:b", found=False, woken_for=None, wait=True)  # b waits
    waits.begin(q, "p1:a")  # a looks
    assert waits.woke("p1:~s1:q")
    assert woken == ["p1:b"] and q.woken == {"p1:b": 1} and not q.pending
    # a found a session elsewhere; a wake-up that came meanwhile and found nobody waiting
    # is handed on once a's accept is done: back to the store
    assert waits.woke("p1:~s1:q")
    assert q.pending == [1]
    waits.end(q, "p1:a", found=True, woken_for=None, wait=True)
    assert passed == [1] and not q.pending


def test_a_registration_answered_after_its_wake_up_is_not_trusted() -> None:
    """The store woke the process's waiter of a partition just after an accept registered it,
    and the wake-up came first (pub/sub has a connection of its own): that registration is
    gone, so the wake-up is not dropped as if the process still waited there."""
    waits = PartitionWaits("p1")
    woken: list[str] = []
    waits.wake = woken.append
    waits.pass_on = lambda w, partition, waiter: None
    q = waits.of("q")
    waits.waiter_id(q, 2)
    waits.begin(q, "p1:a")
    seen = waits.wakes_of(q, 2)  # the accept's call goes out
    assert waits.woke("p1:~s2:q")  # the wake-up arrives before its answer
    waits.registered(q, 2, seen)  # the answer: registered (then taken off by the wake-up)
    assert not q.skips(2, 0.0)
    waits.end(q, "p1:a", found=False, woken_for=None, wait=True)
    assert woken == ["p1:a"] and q.woken == {"p1:a": 2}  # it looks there again


# --- plain receivers -------------------------------------------------------------------------
def plain_queue() -> QueueSpec:
    return QueueSpec(name=f"pp-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS)


def key_in(q: QueueSpec, partition: int) -> str:
    """A partition key whose messages go to `partition`."""
    from busd.storage.partitioned.routing import partition_of_key

    return next(
        k for k in (f"k{i}" for i in range(1000)) if partition_of_key(k, PARTITIONS) == partition
    )


async def test_receivers_of_one_process_wait_as_one_and_a_message_takes_one_call(
    processes, redis_url, store_prefix, tokens
):
    p, _ = processes
    q = plain_queue()
    calls: list[int] = []
    receive = p.inner.receive

    async def counted(queue, *args, **kwargs):
        calls.append(queue.partition or 0)
        return await receive(queue, *args, **kwargs)

    p.inner.receive = counted  # type: ignore[method-assign]
    receivers = [p.acceptor(f"r{i}") for i in range(5)]
    for r in receivers:
        assert await p.store.receive(q, 10, PL, tokens(10), r) == []
    assert sorted(calls) == list(range(PARTITIONS))  # the first looked everywhere
    names = [
        keyspace.key(store_prefix, part.key_scope[0], "q.waiters") for part in q.partition_specs
    ]
    with redis.Redis.from_url(redis_url) as client:
        assert [client.zcard(n) for n in names] == [1] * PARTITIONS
    await p.store.send(q, [NewMessage(b"x", partition_key=key_in(q, 1))])
    assert await p.wakes.next() == receivers[0]  # the oldest receiver, once
    assert await p.wakes.none()
    calls.clear()
    (m,) = await p.store.receive(q, 10, PL, tokens(10), receivers[0])
    assert m.blob == b"x" and calls == [1]  # the partition it was woken for, and only it
    # leaving is this process's business: no store call, and the others still wait
    assert await p.store.stop_waiting(q, "q", receivers[1])
    calls.clear()
    await p.store.send(q, [NewMessage(b"y", partition_key=key_in(q, 2))])
    assert await p.wakes.next() == receivers[2]
    (m,) = await p.store.receive(q, 10, PL, tokens(10), receivers[2])
    assert m.blob == b"y" and calls == [2]
    for r in receivers:
        await p.store.stop_waiting(q, "q", r)


async def test_a_receiver_that_filled_its_credit_hands_the_partition_on(processes, tokens):
    """A partition that gave a receiver all it asked for may have more: the next waiting
    receiver looks there, and a wake-up one took no message for goes on when it leaves."""
    p, _ = processes
    q = plain_queue()
    a, b = p.acceptor("a"), p.acceptor("b")
    assert await p.store.receive(q, 2, PL, tokens(2), a) == []
    assert await p.store.receive(q, 2, PL, tokens(2), b) == []
    key = key_in(q, 3)
    await p.store.send(q, [NewMessage(str(i).encode(), partition_key=key) for i in range(3)])
    assert await p.wakes.next() == a
    assert [m.blob for m in await p.store.receive(q, 2, PL, tokens(2), a)] == [b"0", b"1"]
    assert await p.wakes.next() == b  # partition 3 had more
    assert [m.blob for m in await p.store.receive(q, 2, PL, tokens(2), b)] == [b"2"]
    await p.store.stop_waiting(q, "q", a)
    await p.store.stop_waiting(q, "q", b)
