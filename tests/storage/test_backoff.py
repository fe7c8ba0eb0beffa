"""Redelivery backoff (docs/design.md §2.17): an abandoned or lock-expired message is available
again only once its delay, growing with its delivery count, has passed; it stays active (counts,
peek) meanwhile, and on a session queue it keeps its session's order: the session waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from busd.storage.messages import MessageState, NewMessage, Outcome, ReceiveMode, Settlement

pytestmark = pytest.mark.every_store

PL = ReceiveMode.PEEK_LOCK
MIN_MS, MAX_MS = 300, 600  # delays: 300, 600, then 600 (capped, not 1200)


def backoff(**more):
    return {"backoff_min_ms": MIN_MS, "backoff_max_ms": MAX_MS, "backoff_factor": 2.0, **more}


def msgs(sid, *bodies):
    return [NewMessage(b, session_id=sid) for b in bodies]


# A lower bound on a delay holds however slow the machine, when measured from a moment before
# the store started it (the store counts its delays in whole ms: hence the margin); an upper
# bound would not, so that a delay is no longer than it should be is shown by a receive made
# once it should be over, which a slow machine only makes later.
MS = 0.01


async def until(take, since: float | None = None, limit_s: float = 5.0):
    """Call `take` every 20 ms until it returns something; (what it returned, seconds since
    `since`, a time.monotonic() taken before the delay began, or since the call)."""
    started = time.monotonic()
    since = started if since is None else since
    while time.monotonic() - started < limit_s:
        got = await take()
        if got:
            return got, time.monotonic() - since
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing within {limit_s} s")


async def abandon(store, q, m, holder=None):
    outcome = Settlement(m.lock_token, Outcome.ABANDON, session_id=m.session_id)
    assert await store.settle(q, [outcome], holder) == [None]


async def test_abandoned_message_waits_a_delay_that_grows_up_to_the_maximum(
    store, make_queue, tokens
):
    q = make_queue(**backoff())
    await store.send(q, [NewMessage(b"a")])
    (m,) = await store.receive(q, 1, PL, tokens(1))
    for dc, delay_ms in ((1, 300), (2, 600)):
        before = time.monotonic()
        await abandon(store, q, m)
        (m,), took = await until(lambda: store.receive(q, 1, PL, tokens(1)), before)
        assert m.delivery_count == dc
        assert took >= delay_ms / 1000 - MS, (dc, took)
    await abandon(store, q, m)  # the third: 600 ms again (capped), not 1200
    await asyncio.sleep(MAX_MS / 1000 + 0.1)
    (m,) = await store.receive(q, 1, PL, tokens(1))
    assert m.delivery_count == 3


async def test_a_waiting_message_is_active_and_peeked_as_such(store, make_queue, tokens):
    q = make_queue(**backoff())
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    first, _ = await store.receive(q, 2, PL, tokens(2))
    await abandon(store, q, first)
    counts = await store.counts(q)
    assert (counts.active, counts.locked, counts.scheduled) == (1, 1, 0)
    (peeked,) = await store.peek(q, first.seq, 1)
    assert (peeked.seq, peeked.state, peeked.delivery_count) == (first.seq, MessageState.ACTIVE, 1)
    assert await store.receive(q, 5, PL, tokens(5)) == []


async def test_lock_expiry_waits_the_delay_too(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=200, **backoff())
    await store.send(q, [NewMessage(b"a")])
    before = time.monotonic()  # the lock, then the delay, start after this
    await store.receive(q, 1, PL, tokens(1))
    await asyncio.sleep(0.25)
    assert (await store.sweep(q)).expired_message_locks == 1
    assert await store.receive(q, 1, PL, tokens(1)) == []
    assert (await store.counts(q)).active == 1
    (m,), took = await until(lambda: store.receive(q, 1, PL, tokens(1)), before)
    assert m.delivery_count == 1
    assert took >= (200 + MIN_MS) / 1000 - MS


async def test_release_and_max_delivery_count_do_not_wait(store, make_queue, tokens):
    q = make_queue(max_delivery_count=2, **backoff())
    await store.send(q, [NewMessage(b"a")])
    (m,) = await store.receive(q, 1, PL, tokens(1))
    await store.settle(q, [Settlement(m.lock_token, Outcome.RELEASE)])
    (m,) = await store.receive(q, 1, PL, tokens(1))  # a release is no failed delivery
    await abandon(store, q, m)
    (m,), _ = await until(lambda: store.receive(q, 1, PL, tokens(1)))
    await abandon(store, q, m)  # the 2nd failed delivery: dead-lettered at once
    (dead,) = await store.receive(q.dead_letter_queue, 1, PL, tokens(1))
    assert (dead.seq, dead.dead_letter_reason) == (m.seq, "MaxDeliveryCountExceeded")


async def test_backoff_turned_off_releases_waiting_messages_at_the_sweep(store, make_queue, tokens):
    q = make_queue(backoff_min_ms=60_000)
    await store.send(q, [NewMessage(b"a")])
    (m,) = await store.receive(q, 1, PL, tokens(1))
    await abandon(store, q, m)
    assert await store.receive(q, 1, PL, tokens(1)) == []
    off = type(q)(**{**{f: getattr(q, f) for f in q.__dataclass_fields__}, "backoff_min_ms": None})
    await store.sweep(off)
    (again,) = await store.receive(off, 1, PL, tokens(1))
    assert (again.seq, again.delivery_count) == (m.seq, 1)


async def test_session_waits_for_its_first_message_and_keeps_its_order(store, make_queue, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=30_000, **backoff())
    await store.send(q, msgs("s1", b"1", b"2", b"3"))
    await store.accept_session(q, "s1", "h1")
    (one,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    before = time.monotonic()
    await abandon(store, q, one, "h1")
    # the holder gets nothing from its session until the first message is due: not "2"
    assert await store.receive_session(q, "s1", "h1", 3, PL, tokens(3)) == []
    counts = await store.counts(q)
    assert (counts.active, counts.free_sessions) == (3, 0)
    got, took = await until(lambda: store.receive_session(q, "s1", "h1", 3, PL, tokens(3)), before)
    assert [(m.blob, m.delivery_count) for m in got] == [(b"1", 1), (b"2", 0), (b"3", 0)]
    assert took >= MIN_MS / 1000 - MS


async def test_next_available_skips_a_session_whose_first_message_waits(store, make_queue, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=30_000, **backoff())
    await store.send(q, msgs("waits", b"1", b"2"))
    await store.accept_session(q, "waits", "h1")
    (one,) = await store.receive_session(q, "waits", "h1", 1, PL, tokens(1))
    # the delay runs from the abandon, not from the wait below: what happens in between may
    # take most of it on a busy machine
    before = time.monotonic()
    await abandon(store, q, one, "h1")
    await store.release_session(q, "waits", "h1")
    await store.send(q, msgs("ready", b"r"))
    await store.send(q, msgs("waits", b"3"))  # a new message does not make it free either
    lock = await store.accept_session(q, None, "h2")
    assert lock is not None and lock.session_id == "ready"
    assert await store.accept_session(q, None, "h3") is None
    lock, took = await until(lambda: store.accept_session(q, None, "h3"), before)
    assert lock.session_id == "waits" and took >= MIN_MS / 1000 - MS
    got = await store.receive_session(q, "waits", "h3", 5, PL, tokens(5))
    assert [(m.blob, m.delivery_count) for m in got] == [(b"1", 1), (b"2", 0), (b"3", 0)]


async def test_session_lock_expiry_makes_the_session_wait(store, make_queue, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=200, **backoff())
    await store.send(q, msgs("s1", b"1", b"2", b"3"))
    await store.accept_session(q, "s1", "h1")
    await store.receive_session(q, "s1", "h1", 2, PL, tokens(2))
    await asyncio.sleep(0.25)
    assert (await store.sweep(q)).expired_session_locks == ["s1"]
    assert await store.accept_session(q, None, "h2") is None
    lock, _ = await until(lambda: store.accept_session(q, None, "h2"))
    assert lock.session_id == "s1"
    got = await store.receive_session(q, "s1", "h2", 5, PL, tokens(5))
    assert [(m.blob, m.delivery_count) for m in got] == [(b"1", 1), (b"2", 1), (b"3", 0)]
