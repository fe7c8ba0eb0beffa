"""Resubmitting dead-lettered messages, and the event totals the store keeps for the metrics.

The totals are counted inside the scripts, so every path that changes a message (receive,
settle, lock expiry found by the sweep or lazily, TTL, purge) counts exactly once.
"""

from __future__ import annotations

import asyncio

from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement


async def dead_letter_all(store, q, tokens, n):
    got = await store.receive(q, n, ReceiveMode.PEEK_LOCK, tokens(n))
    assert len(got) == n
    settlements = [
        Settlement(m.lock_token, Outcome.DEAD_LETTER, dead_letter_reason="bad") for m in got
    ]
    assert await store.settle(q, settlements) == [None] * n  # every one applied
    return got


async def test_resubmit_moves_dead_letters_back_as_new_messages(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b"), NewMessage(b"c")])
    dead = await dead_letter_all(store, q, tokens, 3)

    assert await store.resubmit_dead_letters(q, 2) == 2
    assert await store.resubmit_dead_letters(q, 2) == 1
    assert await store.resubmit_dead_letters(q, 2) == 0

    counts = await store.counts(q)
    assert (counts.active, counts.dead_letter) == (3, 0)
    again = await store.receive(q, 3, ReceiveMode.PEEK_LOCK, tokens(3))
    assert [m.blob for m in again] == [b"a", b"b", b"c"]  # oldest first
    assert min(m.seq for m in again) > max(m.seq for m in dead)  # new sequence numbers
    assert all(m.delivery_count == 0 and m.dead_letter_reason is None for m in again)


async def test_resubmit_leaves_locked_dead_letters_and_keeps_sessions(store, make_queue, tokens):
    q = make_queue(requires_session=True)
    await store.send(q, [NewMessage(b"s1", session_id="s"), NewMessage(b"s2", session_id="s")])
    lock = await store.accept_session(q, "s", "holder")
    assert lock is not None
    got = await store.receive_session(q, "s", "holder", 2, ReceiveMode.PEEK_LOCK, tokens(2))
    await store.settle(
        q,
        [Settlement(m.lock_token, Outcome.DEAD_LETTER, session_id="s") for m in got],
        "holder",
    )
    await store.release_session(q, "s", "holder")
    held = await store.receive(q.dead_letter_queue, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    assert [m.blob for m in held] == [b"s1"]

    assert await store.resubmit_dead_letters(q, 100) == 1
    dlq = await store.counts(q.dead_letter_queue)
    assert (dlq.active, dlq.locked) == (0, 1)
    infos = (await store.session_page(q, "id", None, 10)).sessions
    assert [(i.session_id, i.message_count) for i in infos] == [("s", 1)]
    lock = await store.accept_session(q, None, "other")
    assert lock is not None and lock.session_id == "s"


async def test_totals_count_each_event_once(store, make_queue, tokens):
    q = make_queue(max_delivery_count=2, lock_duration_ms=300)
    await store.send(q, [NewMessage(f"m{i}".encode()) for i in range(6)])
    await store.send(q, [NewMessage(b"short", ttl_ms=1)])
    await asyncio.sleep(0.05)

    got = await store.receive(q, 6, ReceiveMode.PEEK_LOCK, tokens(6))  # expires one
    assert len(got) == 6
    outcomes = [
        Outcome.COMPLETE,
        Outcome.COMPLETE,
        Outcome.ABANDON,
        Outcome.DEFER,
        Outcome.DEAD_LETTER,
        Outcome.RELEASE,
    ]
    assert (
        await store.settle(q, [Settlement(m.lock_token, o) for m, o in zip(got, outcomes)])
        == [None] * 6
    )
    # the abandoned and released ones: delivered again, then their locks run out; the
    # abandoned one reaches MaxDeliveryCount 2 and is dead-lettered
    again = await store.receive(q, 2, ReceiveMode.PEEK_LOCK, tokens(2))
    assert len(again) == 2
    await asyncio.sleep(0.4)
    await store.sweep(q)
    await store.sweep(q)  # finds nothing more

    totals = (await store.counts(q)).totals
    assert totals == {
        "sent": 7,
        "received": 8,
        "completed": 2,
        "abandoned": 1,
        "deferred": 1,
        "released": 1,
        "deadlettered": 2,
        "expired": 1,
        "lockexpired": 2,
    }
    assert await store.purge(q.dead_letter_queue) == 2
    assert (await store.counts(q.dead_letter_queue)).totals == {"purged": 2}
    assert await store.resubmit_dead_letters(q, 10) == 0
    assert (await store.counts(q)).totals["sent"] == 7  # purge keeps totals


async def test_session_lock_expiry_and_duplicates_are_counted(store, make_queue, tokens):
    q = make_queue(
        requires_session=True, lock_duration_ms=200, duplicate_detection_window_ms=60_000
    )
    seqs = await store.send(
        q,
        [
            NewMessage(b"x", session_id="s", message_id="id-1"),
            NewMessage(b"x", session_id="s", message_id="id-1"),
        ],
    )
    assert seqs[1] == 0
    assert await store.accept_session(q, "s", "holder") is not None
    await asyncio.sleep(0.3)
    result = await store.sweep(q)
    assert result.expired_session_locks == ["s"]
    totals = (await store.counts(q)).totals
    assert totals == {"sent": 1, "duplicates": 1, "sessionlockexpired": 1}
