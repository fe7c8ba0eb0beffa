"""The store's side of auto-forwarding (lua/forwardTake.lua, lua/forwardMessages.lua): the
forwarding lease that keeps one forwarder per entity, a move as one step, what a forwarder of a
dead process leaves behind, and messages that cannot move."""

from __future__ import annotations

import asyncio
import dataclasses

from busd.storage import keys as keyspace
from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement

PL = ReceiveMode.PEEK_LOCK


async def _catalog(store, *names: str) -> None:
    """Destinations exist for the move script when their catalog records do."""
    for name in names:
        await store.catalog_put("queue", name, {"name": name})


def _moves(taken) -> list[ForwardedMessage]:
    return [ForwardedMessage(token=m.lock_token, seq=m.seq, hops=m.hops) for m in taken]


async def test_a_move_is_a_new_message_at_the_destination(store, make_queue, tokens):
    src, dst = make_queue(), make_queue()
    await _catalog(store, dst.name)
    await store.send(dst, [NewMessage(b"already there")])
    await store.send(src, [NewMessage(f"m{i}".encode(), ttl_ms=60_000) for i in range(3)])
    taken = await store.take_forwarding(src, "p:1", 10, tokens(10))
    assert [m.seq for m in taken] == [1, 2, 3] and all(m.hops == 0 for m in taken)
    results = await store.forward(
        src, ForwardDestination(f"queue:{dst.name}", queue=dst), _moves(taken), hop_limit=4
    )
    assert results == [ForwardResult.MOVED] * 3
    got = await store.receive(dst, 10, PL, tokens(10))
    assert [(m.blob, m.seq, m.enqueue_seq, m.delivery_count) for m in got] == [
        (b"already there", 1, None, 0),
        (b"m0", 2, 1, 0),
        (b"m1", 3, 2, 0),
        (b"m2", 4, 3, 0),
    ]
    assert got[1].expires_ms == got[1].enqueued_ms + 60_000
    assert await store.peek(src, 0, 10) == []
    assert (await store.counts(src)).totals["forwarded"] == 3
    # the next take finds nothing: the lease is let go and the forwarder waits
    assert await store.take_forwarding(src, "p:1", 10, tokens(10)) == []


async def test_one_forwarder_at_a_time_and_a_dead_ones_lease_ends(store, make_queue, tokens):
    src = make_queue(lock_duration_ms=300)
    await store.send(src, [NewMessage(b"a"), NewMessage(b"b")])
    first = await store.take_forwarding(src, "dead:1", 1, tokens(1))
    assert [m.blob for m in first] == [b"a"]
    # another forwarder (another process) meets the lease, even for the next message
    assert await store.take_forwarding(src, "live:1", 10, tokens(10)) is None
    await asyncio.sleep(0.4)  # the first one's process died: its lock and lease end
    await store.sweep(src)
    again = await store.take_forwarding(src, "live:1", 10, tokens(10))
    assert [m.blob for m in again] == [b"a", b"b"]  # nothing lost, still in order
    assert again[0].delivery_count == 1
    # the dead forwarder's late move changes nothing
    dst = make_queue()
    await _catalog(store, dst.name)
    late = await store.forward(
        src, ForwardDestination(f"queue:{dst.name}", queue=dst), _moves(first), hop_limit=4
    )
    assert late == [ForwardResult.LOCK_LOST]
    assert await store.peek(dst, 0, 10) == []


async def test_a_waiting_forwarder_is_woken_by_a_send(store, make_queue, tokens):
    src = make_queue()
    woken: list[str] = []
    await store.subscribe(woken.append)
    me = f"{store.process_id}:7"
    assert await store.take_forwarding(src, me, 10, tokens(10)) == []
    await store.send(src, [NewMessage(b"x")])
    for _ in range(100):
        if woken:
            break
        await asyncio.sleep(0.01)
    assert woken == [me]


async def test_what_cannot_move_stays_at_the_source(store, make_queue, tokens):
    src = make_queue()
    gone = ForwardDestination("gone:nowhere")
    await store.send(src, [NewMessage(b"x")])
    taken = await store.take_forwarding(src, "p:1", 1, tokens(1))
    assert await store.forward(src, gone, _moves(taken), hop_limit=4) == [
        ForwardResult.DEAD_LETTERED
    ]
    dlq = src.dead_letter_queue
    (dead,) = await store.peek(dlq, 0, 10)
    assert dead.dead_letter_reason == "MessagingEntityNotFound"
    assert "'nowhere'" in (dead.dead_letter_description or "")
    # from a dead-letter sub-queue it is deferred there, so its forwarder leaves it
    taken = await store.take_forwarding(dlq, "p:2", 1, tokens(1))
    assert await store.forward(dlq, gone, _moves(taken), hop_limit=4) == [ForwardResult.DEFERRED]
    assert await store.take_forwarding(dlq, "p:2", 1, tokens(1)) == []
    (parked,) = await store.peek(dlq, 0, 10)
    assert parked.state == 1 and parked.seq == dead.seq


async def test_the_hop_count_travels_and_stops_at_the_limit(store, make_queue, tokens):
    a, b = make_queue(), make_queue()
    await _catalog(store, a.name, b.name)
    to = {
        a.name: ForwardDestination(f"queue:{b.name}", queue=b),
        b.name: ForwardDestination(f"queue:{a.name}", queue=a),
    }
    await store.send(a, [NewMessage(b"loop")])
    at = a
    for hop in range(4):
        (m,) = await store.take_forwarding(at, "p:1", 1, tokens(1))
        assert m.hops == hop and m.enqueue_seq == (None if hop == 0 else 1)
        assert await store.forward(at, to[at.name], _moves([m]), hop_limit=4) == [
            ForwardResult.MOVED
        ]
        at = b if at is a else a
    (m,) = await store.take_forwarding(at, "p:1", 1, tokens(1))
    assert m.hops == 4
    assert await store.forward(at, to[at.name], _moves([m]), hop_limit=4) == [
        ForwardResult.DEAD_LETTERED
    ]
    (dead,) = await store.peek(at.dead_letter_queue, 0, 10)
    assert dead.dead_letter_reason == "MaxTransferHopCountExceeded" and dead.enqueue_seq == 1


async def test_a_dead_letter_moves_with_its_source_and_reason(store, make_queue, tokens):
    src, dst = make_queue(), make_queue()
    await _catalog(store, dst.name)
    await store.send(src, [NewMessage(b"bad")])
    (m,) = await store.receive(src, 1, PL, tokens(1))
    await store.settle(
        src,
        [
            Settlement(
                m.lock_token,
                Outcome.DEAD_LETTER,
                dead_letter_reason="r",
                dead_letter_description="d",
            )
        ],
    )
    dlq = src.dead_letter_queue
    taken = await store.take_forwarding(dlq, "p:1", 10, tokens(10))
    assert await store.forward(
        dlq, ForwardDestination(f"queue:{dst.name}", queue=dst), _moves(taken), hop_limit=4
    ) == [ForwardResult.MOVED]
    (got,) = await store.receive(dst, 1, PL, tokens(1))
    assert (
        got.dead_letter_source,
        got.dead_letter_reason,
        got.dead_letter_description,
        got.enqueue_seq,
    ) == (src.name, "r", "d", 1)


async def test_a_dropped_queue_leaves_no_forwarding_key(store, make_queue, tokens, redis_url):
    import redis.asyncio as redis

    src = make_queue()
    await store.send(src, [NewMessage(b"x")])
    await store.take_forwarding(src, "p:1", 1, tokens(1))
    await store.drop_queue(src)
    client = redis.Redis.from_url(redis_url)
    try:
        assert await client.exists(keyspace.key(store.prefix, src.name, "fwd")) == 0
    finally:
        await client.aclose()


async def test_a_session_message_keeps_its_session_at_a_session_destination(
    store, make_queue, tokens
):
    src, dst = make_queue(), make_queue(requires_session=True)
    await _catalog(store, dst.name)
    await store.send(src, [NewMessage(b"with"), NewMessage(b"without")])
    taken = await store.take_forwarding(src, "p:1", 10, tokens(10))
    moves = _moves(taken)
    moves[0] = dataclasses.replace(moves[0], session_id="s1")
    await store.forward(src, ForwardDestination(f"queue:{dst.name}", queue=dst), moves, hop_limit=4)
    lock = await store.accept_session(dst, "s1", "h", count=5, tokens=tokens(5))
    assert [m.blob for m in lock.messages] == [b"with"]
    (dead,) = await store.peek(dst.dead_letter_queue, 0, 10)
    assert dead.blob == b"without" and dead.dead_letter_reason == "Session ID is null."


async def test_a_session_sources_messages_are_taken_in_session_order_and_come_back(
    store, make_queue, tokens
):
    """A session-enabled source forwards: its sessions' messages are taken under the
    forwarder's own lock, which expires and puts each back in its session; a waiting
    forwarder is woken by a session message."""
    src = make_queue(requires_session=True, lock_duration_ms=300)
    woken: list[str] = []
    await store.subscribe(woken.append)
    me = f"{store.process_id}:9"
    assert await store.take_forwarding(src, me, 10, tokens(10)) == []
    await store.send(
        src,
        [
            NewMessage(b"b1", session_id="b"),
            NewMessage(b"a1", session_id="a"),
            NewMessage(b"a2", session_id="a"),
        ],
    )
    for _ in range(100):
        if woken:
            break
        await asyncio.sleep(0.01)
    assert woken == [me]
    taken = await store.take_forwarding(src, me, 10, tokens(10))
    assert [(m.blob, m.session_id) for m in taken] == [(b"a1", "a"), (b"a2", "a"), (b"b1", "b")]
    assert await store.accept_session(src, None, "rx:1") is None  # none left to lock
    await asyncio.sleep(0.4)  # the forwarder died: its locks end, the messages come back
    await store.sweep(src)
    lock = await store.accept_session(src, "a", "rx:1", count=10, tokens=tokens(10))
    assert lock is not None and [m.blob for m in lock.messages] == [b"a1", b"a2"]
    assert [m.delivery_count for m in lock.messages] == [1, 1]
