"""A broker process known to be gone: its session locks end at once, as expired ones do
(lua/releaseProcessLocks.lua), and nobody else's are touched."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as redis

from busd.errors import BusdError, Condition
from busd.storage.keys import key
from busd.storage.messages import (
    LockTokens,
    NewMessage,
    Outcome,
    ReceiveMode,
    Settlement,
    StoredMessage,
    tag_lock_tokens,
    token_tag,
)
from busd.storage.partitioned.router import wrap

PL = ReceiveMode.PEEK_LOCK


def msgs(sid: str, *bodies: bytes) -> list[NewMessage]:
    return [NewMessage(b, session_id=sid) for b in bodies]


def seen(messages: list[StoredMessage]) -> list[tuple[bytes, int]]:
    return [(m.blob, m.delivery_count) for m in messages]


@pytest.fixture
def sq(make_queue):
    # A lock far longer than the test: only the release can end it.
    return make_queue(requires_session=True, lock_duration_ms=60_000, max_delivery_count=5)


async def test_the_dead_process_s_session_locks_end_with_a_counted_attempt(store, sq, tokens):
    await store.send(sq, msgs("s1", b"a", b"b", b"c"))
    await store.send(sq, msgs("s2", b"x"))
    await store.send(sq, msgs("s3", b"y"))
    await store.send(sq, msgs("s4", b"z"))
    # The dead process "pA" holds s1 (two of its three messages in flight) and s2; "pB" holds
    # s3, and "pAx", whose id starts like pA's, holds s4.
    first = await store.accept_session(sq, "s1", "pA:1", count=2, tokens=tokens(2))
    assert seen(first.messages) == [(b"a", 0), (b"b", 0)]
    await store.accept_session(sq, "s2", "pA:2")
    await store.accept_session(sq, "s3", "pB:1")
    await store.accept_session(sq, "s4", "pAx:1")

    assert await store.release_process_locks(sq, "pA:") == 2

    # s1 is free at once, its messages first again and in order, those that were in flight
    # with the attempt counted (as when a lock expires).
    again = await store.accept_session(sq, "s1", "pB:2", count=3, tokens=tokens(3))
    assert seen(again.messages) == [(b"a", 1), (b"b", 1), (b"c", 0)]
    assert (await store.accept_session(sq, "s2", "pB:3")).session_id == "s2"
    # The dead process's holder can do nothing more under its old lock.
    with pytest.raises(BusdError) as err:
        await store.renew_session_lock(sq, "s1", "pA:1")
    assert err.value.condition == Condition.SESSION_LOCK_LOST
    # The live processes keep theirs.
    for sid in ("s3", "s4"):
        with pytest.raises(BusdError) as err:
            await store.accept_session(sq, sid, "pC:1")
        assert err.value.condition == Condition.SESSION_CANNOT_BE_LOCKED
    counts = await store.counts(sq)
    assert counts.totals.get("sessionlockexpired") == 2
    # Nothing left to release: a second call changes nothing.
    assert await store.release_process_locks(sq, "pA:") == 0


async def test_a_message_at_max_delivery_count_is_dead_lettered_as_on_expiry(
    store, make_queue, tokens
):
    q = make_queue(requires_session=True, lock_duration_ms=60_000, max_delivery_count=1)
    await store.send(q, msgs("s", b"poison", b"next"))
    await store.accept_session(q, "s", "pA:1", count=1, tokens=tokens(1))
    assert await store.release_process_locks(q, "pA:") == 1
    lock = await store.accept_session(q, "s", "pB:1", count=5, tokens=tokens(5))
    assert seen(lock.messages) == [(b"next", 0)]
    assert (await store.counts(q)).dead_letter == 1


async def test_the_dead_process_s_waiters_are_dropped_and_a_free_session_wakes_another(
    store, sq, redis_url
):
    woken: list[str] = []
    await store.subscribe(woken.append)
    # pA's next-available acceptor waits (nothing free); then pB's.
    assert await store.accept_session(sq, None, "pA:7", wait=True) is None
    assert await store.accept_session(sq, None, f"{store.process_id}:1", wait=True) is None
    client = redis.Redis.from_url(redis_url)
    swaiters = key(store.prefix, sq.name, "swaiters")
    try:
        assert set(await client.zrange(swaiters, 0, -1)) == {
            b"pA:7",
            f"{store.process_id}:1".encode(),
        }
        await store.release_process_locks(sq, "pA:")
        assert await client.zrange(swaiters, 0, -1) == [f"{store.process_id}:1".encode()]
    finally:
        await client.aclose()
    # The next free session wakes the live waiter, not the dead one.
    await store.send(sq, msgs("s9", b"m"))
    for _ in range(100):
        if woken:
            break
        await asyncio.sleep(0.02)
    assert woken == [f"{store.process_id}:1"]


async def test_many_held_sessions_are_released_in_bounded_steps(store, make_queue):
    q = make_queue(requires_session=True, lock_duration_ms=60_000)
    sessions = [f"s{i}" for i in range(2500)]  # more than one step (SWEEP_BUDGET) holds
    for start in range(0, len(sessions), 250):
        await asyncio.gather(
            *(store.accept_session(q, sid, f"pA:{sid}") for sid in sessions[start : start + 250])
        )
    await store.accept_session(q, "kept", "pB:1")
    assert await store.release_process_locks(q, "pA:") == len(sessions)
    counts = await store.counts(q)
    assert counts.locked_sessions == 1


async def test_a_partitioned_queue_is_released_in_every_partition(store, make_queue, tokens):
    partitioned = wrap(store)
    q = make_queue(requires_session=True, lock_duration_ms=60_000, partitions=4)
    sessions = [f"s{i}" for i in range(12)]  # spread over the partitions
    for sid in sessions:
        await partitioned.send(q, msgs(sid, b"m"))
        await partitioned.accept_session(q, sid, "pA:1", count=1, tokens=tokens(1))
    assert await partitioned.release_process_locks(q, "pA:") == len(sessions)
    for sid in sessions:
        lock = await partitioned.accept_session(q, sid, "pB:1", count=1, tokens=tokens(1))
        assert seen(lock.messages) == [(b"m", 1)]


async def test_a_worker_prefix_ends_the_locks_of_every_store_of_the_worker(store, sq, redis_url):
    # A worker's stores (one per namespace) all have process ids starting with its prefix.
    await store.accept_session(sq, "a", "w1-default:1")
    await store.accept_session(sq, "b", "w1-teamns:1")
    await store.accept_session(sq, "c", "w10-default:1")  # another worker
    client = redis.Redis.from_url(redis_url)
    procs = key(store.prefix, sq.name, "procs")
    try:
        await client.zadd(procs, {"w1-default": 1, "w10-default": 1})
        assert await store.release_process_locks(sq, "w1-") == 2
        assert await client.zrange(procs, 0, -1) == [b"w10-default"]
    finally:
        await client.aclose()
    assert (await store.accept_session(sq, "a", "w2-x:1")).session_id == "a"
    assert (await store.accept_session(sq, "b", "w2-x:1")).session_id == "b"
    with pytest.raises(BusdError):
        await store.accept_session(sq, "c", "w2-x:1")


async def test_an_empty_prefix_is_refused(store, sq):
    await store.accept_session(sq, "a", "pA:1")
    with pytest.raises(ValueError):
        await store.release_process_locks(sq, "")
    with pytest.raises(BusdError):
        await store.accept_session(sq, "a", "pB:1")


# --- message locks: a worker's lock tokens carry its tag ---------------------------------------


def tagged(tag: bytes, n: int) -> list[bytes]:
    """n lock tokens of the worker whose tag is `tag`, as busd.storage.messages makes them."""
    tag_lock_tokens(tag)
    try:
        return list(LockTokens(n))
    finally:
        tag_lock_tokens(None)


async def test_the_dead_worker_s_message_locks_end_with_a_counted_attempt(
    store, make_queue, tokens
):
    q = make_queue(lock_duration_ms=60_000, max_delivery_count=5)
    dead, live = token_tag("w0.dead-"), token_tag("w1.live-")
    await store.send(q, [NewMessage(b) for b in (b"a", b"b", b"c", b"d", b"e")])
    held = await store.receive(q, 2, PL, tagged(dead, 2))
    kept = await store.receive(q, 1, PL, tagged(live, 1))
    untagged = await store.receive(q, 1, PL, tokens(1))  # a single busd's: all random
    assert [m.blob for m in held + kept + untagged] == [b"a", b"b", b"c", b"d"]

    assert await store.release_process_message_locks(q, dead) == 2

    again = await store.receive(q, 5, PL, tokens(5))
    # the dead worker's two again, their attempt counted as on expiry; then the one never taken
    assert seen(again) == [(b"a", 1), (b"b", 1), (b"e", 0)]
    # the live ones keep their locks: they settle
    settled = await store.settle(
        q, [Settlement(m.lock_token, Outcome.COMPLETE) for m in kept + untagged]
    )
    assert settled == [None, None]
    assert (await store.counts(q)).totals.get("lockexpired") == 2
    assert await store.release_process_message_locks(q, dead) == 0


async def test_a_dead_worker_s_dead_letter_locks_end_too(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=60_000, max_delivery_count=1)
    dead = token_tag("w0.dead-")
    await store.send(q, [NewMessage(b"poison")])
    # at MaxDeliveryCount the released lock dead-letters it, as an expired one does
    await store.receive(q, 1, PL, tagged(dead, 1))
    assert await store.release_process_message_locks(q, dead) == 1
    assert (await store.counts(q)).dead_letter == 1
    dlq = q.dead_letter_queue
    (letter,) = await store.receive(dlq, 1, PL, tagged(dead, 1))
    assert await store.release_process_message_locks(q, dead) == 1
    (again,) = await store.receive(dlq, 1, PL, tokens(1))
    assert again.blob == letter.blob == b"poison"


async def test_many_message_locks_are_released_in_bounded_steps(store, make_queue):
    q = make_queue(lock_duration_ms=60_000)
    dead = token_tag("w0.dead-")
    count = 2500  # more than one step (SWEEP_BUDGET)
    for _ in range(count // 500):
        await store.send(q, [NewMessage(b"m")] * 500)
        await store.receive(q, 500, PL, tagged(dead, 500))
    assert await store.release_process_message_locks(q, dead) == count
    assert (await store.counts(q)).locked == 0


async def test_a_partitioned_queue_s_message_locks_are_released_in_every_partition(
    store, make_queue, tokens
):
    partitioned = wrap(store)
    q = make_queue(lock_duration_ms=60_000, partitions=4)
    dead = token_tag("w0.dead-")
    await partitioned.send(q, [NewMessage(f"m{i}".encode()) for i in range(12)])
    got = []
    while len(got) < 12:
        got += await partitioned.receive(q, 12, PL, tagged(dead, 12))
    assert await partitioned.release_process_message_locks(q, dead) == 12
    again = []
    while len(again) < 12:
        again += await partitioned.receive(q, 12, PL, tokens(12))
    assert sorted(seen(again)) == sorted((f"m{i}".encode(), 1) for i in range(12))
