"""Deferral, scheduled messages, peek, duplicate detection, purge and counts."""

from __future__ import annotations

import asyncio

import pytest

from busd.errors import BusdError, Condition
from busd.storage.messages import MessageState, NewMessage, Outcome, ReceiveMode, Settlement
from tests.storage.conftest import named

PL = ReceiveMode.PEEK_LOCK
RD = ReceiveMode.RECEIVE_AND_DELETE
OK = None  # settle: applied


async def defer_all(store, entity, n, tokens):
    got = await store.receive(entity, n, PL, tokens(n))
    await store.settle(entity, [Settlement(m.lock_token, Outcome.DEFER) for m in got])
    return [m.seq for m in got]


async def test_receive_deferred_locks_and_settles_like_any_delivery(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    seqs = await defer_all(store, q, 2, tokens)
    toks = tokens(2)
    got = await store.receive_deferred(q, seqs, PL, toks)
    assert [m.blob for m in got] == [b"a", b"b"]
    assert [m.lock_token for m in got] == [named(t, m.seq) for t, m in zip(toks, got)]
    assert all(m.state == MessageState.DEFERRED for m in got)
    statuses = await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE) for m in got])
    assert statuses == [OK, OK]
    assert (await store.counts(q)).deferred == 0


async def test_receive_deferred_and_delete(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    (seq,) = await defer_all(store, q, 1, tokens)
    (m,) = await store.receive_deferred(q, [seq], RD, [])
    assert m.blob == b"a" and m.lock_token is None
    assert await store.peek(q, 0, 10) == []


async def test_receive_deferred_of_non_deferred_message_is_not_found_and_changes_nothing(
    store, make_queue, tokens
):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    (seq,) = await defer_all(store, q, 1, tokens)
    for bad in ([seq, 2], [seq, 99]):
        with pytest.raises(BusdError) as err:
            await store.receive_deferred(q, bad, PL, tokens(2))
        assert err.value.condition == Condition.MESSAGE_NOT_FOUND
    c = await store.counts(q)
    assert (c.deferred, c.active, c.locked) == (1, 1, 0)


async def test_abandoned_deferred_message_stays_deferred(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    (seq,) = await defer_all(store, q, 1, tokens)
    (m,) = await store.receive_deferred(q, [seq], PL, tokens(1))
    await store.settle(q, [Settlement(m.lock_token, Outcome.ABANDON)])
    assert await store.receive(q, 1, PL, tokens(1)) == []
    (again,) = await store.receive_deferred(q, [seq], PL, tokens(1))
    assert again.delivery_count == 1


async def test_receive_deferred_in_session_needs_that_session_and_its_holder(
    store, make_queue, tokens
):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"a", session_id="s1"), NewMessage(b"b", session_id="s2")])
    await store.accept_session(q, "s1", "h1")
    (m,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    defer = Settlement(m.lock_token, Outcome.DEFER, session_id="s1")
    await store.settle(q, [defer], "h1")
    assert await store.receive_session(q, "s1", "h1", 5, PL, tokens(5)) == []
    assert await store.list_sessions(q, 0, 10, None) == ["s1", "s2"]  # still a member of s1
    with pytest.raises(BusdError) as err:
        await store.receive_deferred(q, [m.seq], PL, tokens(1), session_id="s1", holder="h2")
    assert err.value.condition == Condition.SESSION_LOCK_LOST
    await store.accept_session(q, "s2", "h2")
    with pytest.raises(BusdError) as err:
        await store.receive_deferred(q, [m.seq], PL, tokens(1), session_id="s2", holder="h2")
    assert err.value.condition == Condition.MESSAGE_NOT_FOUND
    toks = tokens(1)
    (d,) = await store.receive_deferred(q, [m.seq], PL, toks, session_id="s1", holder="h1")
    assert d.blob == b"a"
    done = Settlement(d.lock_token, Outcome.COMPLETE, session_id="s1")
    assert await store.settle(q, [done], "h1") == [OK]


async def test_scheduled_message_is_invisible_until_due(store, make_queue, tokens, server_now):
    q = make_queue()
    due = server_now() + 500
    seqs = await store.schedule(q, [NewMessage(b"later", scheduled_ms=due)])
    await store.send(q, [NewMessage(b"now")])
    assert seqs == [1]
    got = await store.receive(q, 5, PL, tokens(5))
    assert [m.blob for m in got] == [b"now"]
    (peeked,) = await store.peek(q, 1, 1)
    assert peeked.state == MessageState.SCHEDULED
    assert (await store.counts(q)).scheduled == 1
    await asyncio.sleep(0.6)
    (m,) = await store.receive(q, 5, PL, tokens(5))
    assert (m.blob, m.seq, m.enqueued_ms) == (b"later", 1, due)


async def test_scheduled_message_in_the_past_is_sent_now(store, make_queue, tokens, server_now):
    q = make_queue()
    await store.send(q, [NewMessage(b"x", scheduled_ms=server_now() - 1000)])
    assert len(await store.receive(q, 1, PL, tokens(1))) == 1


async def test_scheduled_session_message_joins_its_session_in_sequence_order(
    store, make_queue, tokens, server_now
):
    q = make_queue(requires_session=True)
    due = server_now() + 150
    await store.schedule(q, [NewMessage(b"first", session_id="s1", scheduled_ms=due)])
    await store.send(q, [NewMessage(b"second", session_id="s1")])
    await asyncio.sleep(0.2)
    result = await store.sweep(q)
    assert result.activated_scheduled == 1
    await store.accept_session(q, None, "h1")
    got = await store.receive_session(q, "s1", "h1", 5, PL, tokens(5))
    assert [m.blob for m in got] == [b"first", b"second"]


async def test_scheduled_session_becomes_acceptable_when_due(store, make_queue, server_now):
    q = make_queue(requires_session=True)
    await store.schedule(q, [NewMessage(b"x", session_id="s1", scheduled_ms=server_now() + 400)])
    assert await store.accept_session(q, None, "h1") is None
    await asyncio.sleep(0.45)
    assert (await store.accept_session(q, None, "h1")).session_id == "s1"


async def test_scheduled_message_ttl_counts_from_activation(store, make_queue, tokens, server_now):
    q = make_queue()
    due = server_now() + 100
    await store.schedule(q, [NewMessage(b"x", scheduled_ms=due, ttl_ms=60_000)])
    await asyncio.sleep(0.15)
    (m,) = await store.receive(q, 1, PL, tokens(1))
    assert m.expires_ms == due + 60_000


async def test_cancel_scheduled_removes_them(store, make_queue, tokens, server_now):
    q = make_queue()
    later = server_now() + 60_000
    seqs = await store.schedule(
        q, [NewMessage(b"a", scheduled_ms=later), NewMessage(b"b", scheduled_ms=later)]
    )
    await store.cancel_scheduled(q, seqs)
    assert (await store.counts(q)).scheduled == 0
    assert await store.peek(q, 0, 10) == []


async def test_cancel_scheduled_of_unscheduled_message_changes_nothing(
    store, make_queue, server_now
):
    q = make_queue()
    (s,) = await store.schedule(q, [NewMessage(b"a", scheduled_ms=server_now() + 60_000)])
    (plain,) = await store.send(q, [NewMessage(b"b")])
    with pytest.raises(BusdError) as err:
        await store.cancel_scheduled(q, [s, plain])
    assert err.value.condition == Condition.MESSAGE_NOT_FOUND
    assert (await store.counts(q)).scheduled == 1


async def test_peek_returns_every_state_in_order_without_locking(
    store, make_queue, tokens, server_now
):
    q = make_queue()
    await store.send(q, [NewMessage(b"1"), NewMessage(b"2"), NewMessage(b"3")])
    await store.schedule(q, [NewMessage(b"4", scheduled_ms=server_now() + 60_000)])
    one, two = await store.receive(q, 2, PL, tokens(2))
    await store.settle(q, [Settlement(two.lock_token, Outcome.DEFER)])
    peeked = await store.peek(q, 0, 10)
    assert [(m.seq, m.state) for m in peeked] == [
        (1, MessageState.ACTIVE),
        (2, MessageState.DEFERRED),
        (3, MessageState.ACTIVE),
        (4, MessageState.SCHEDULED),
    ]
    assert all(m.lock_token is None for m in peeked)
    assert [m.seq for m in await store.peek(q, 2, 2)] == [2, 3]
    # peeking locked nothing: message 3 is still receivable
    (three,) = await store.receive(q, 5, PL, tokens(5))
    assert three.seq == 3


async def test_peek_by_session(store, make_queue):
    q = make_queue(requires_session=True)
    pairs = [(b"a", "s1"), (b"b", "s2"), (b"c", "s1")]
    await store.send(q, [NewMessage(body, session_id=sid) for body, sid in pairs])
    assert [m.blob for m in await store.peek(q, 0, 10, session_id="s1")] == [b"a", b"c"]
    assert [m.blob for m in await store.peek(q, 2, 10, session_id="s1")] == [b"c"]
    assert await store.peek(q, 0, 10, session_id="s") == []


async def test_duplicate_message_id_within_window_is_dropped(store, make_queue, tokens):
    q = make_queue(duplicate_detection_window_ms=60_000)

    def with_ids(*pairs):
        return [NewMessage(body, message_id=mid) for body, mid in pairs]

    assert await store.send(q, with_ids((b"a", "m1"), (b"b", "m1"))) == [1, 0]
    assert await store.send(q, with_ids((b"c", "m1"), (b"d", "m2"))) == [0, 2]
    # no id: never a duplicate
    assert await store.send(q, with_ids((b"e", None), (b"f", None))) == [3, 4]
    got = await store.receive(q, 10, RD, [])
    assert [m.blob for m in got] == [b"a", b"d", b"e", b"f"]


async def test_duplicate_message_id_after_window_passes_again(store, make_queue):
    q = make_queue(duplicate_detection_window_ms=400)
    assert await store.send(q, [NewMessage(b"a", message_id="m1")]) == [1]
    assert await store.send(q, [NewMessage(b"a", message_id="m1")]) == [0]
    await asyncio.sleep(0.45)
    assert await store.send(q, [NewMessage(b"a", message_id="m1")]) == [2]


async def test_without_duplicate_detection_same_id_is_accepted(store, make_queue):
    q = make_queue()
    same = [NewMessage(b"a", message_id="m1"), NewMessage(b"a", message_id="m1")]
    assert await store.send(q, same) == [1, 2]


async def test_purge_deletes_all_messages_and_keeps_session_state(
    store, make_queue, tokens, server_now
):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"a", session_id="s1"), NewMessage(b"b", session_id="s2")])
    await store.schedule(q, [NewMessage(b"c", session_id="s2", scheduled_ms=server_now() + 60_000)])
    await store.accept_session(q, "s1", "h1")
    await store.set_session_state(q, "s1", "h1", b"st")
    await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    assert await store.purge(q) == 3
    c = await store.counts(q)
    assert (c.active, c.locked, c.scheduled, c.sessions) == (0, 0, 0, 1)
    assert await store.list_sessions(q, 0, 10, None) == ["s1"]
    assert await store.accept_session(q, None, "h2") is None
    assert await store.send(q, [NewMessage(b"d", session_id="s3")]) == [4]  # numbers go on


async def test_counts_of_a_plain_queue(store, make_queue, tokens, server_now):
    q = make_queue(max_delivery_count=1)
    await store.send(q, [NewMessage(b"1"), NewMessage(b"2"), NewMessage(b"3"), NewMessage(b"4")])
    await store.schedule(q, [NewMessage(b"5", scheduled_ms=server_now() + 60_000)])
    a, b, c = await store.receive(q, 3, PL, tokens(3))
    await store.settle(
        q,
        [Settlement(a.lock_token, Outcome.DEFER), Settlement(b.lock_token, Outcome.ABANDON)],
    )
    counts = await store.counts(q)
    assert (counts.active, counts.locked, counts.scheduled) == (1, 1, 1)
    assert (counts.deferred, counts.dead_letter) == (1, 1)
