"""Send, peek-lock and receive-and-delete on a plain queue."""

from __future__ import annotations

import pytest

from busd.storage.messages import MessageState, NewMessage, ReceiveMode
from tests.storage.conftest import named
from tests.storage.stores import NUMBERS

pytestmark = pytest.mark.every_store


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_sequence_numbers_start_at_one_and_increase(store, make_queue):
    q = make_queue()
    assert await store.send(q, [NewMessage(b"a"), NewMessage(b"b")]) == [1, 2]
    assert await store.send(q, [NewMessage(b"c")]) == [3]


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_sequence_numbers_are_per_queue(store, make_queue):
    q1, q2 = make_queue(), make_queue()
    assert await store.send(q1, [NewMessage(b"a")]) == [1]
    assert await store.send(q2, [NewMessage(b"a")]) == [1]


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_peek_lock_delivers_oldest_first_with_lock(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=30_000)
    await store.send(q, [NewMessage(b"one"), NewMessage(b"two"), NewMessage(b"three")])
    toks = tokens(2)
    got = await store.receive(q, 2, ReceiveMode.PEEK_LOCK, toks)
    assert [m.blob for m in got] == [b"one", b"two"]
    assert [m.seq for m in got] == [1, 2]
    assert [m.lock_token for m in got] == [named(t, m.seq) for t, m in zip(toks, got)]
    for m in got:
        assert m.delivery_count == 0
        assert m.state == MessageState.ACTIVE
        assert m.locked_until_ms - m.enqueued_ms >= 30_000 - 1000
    rest = await store.receive(q, 5, ReceiveMode.PEEK_LOCK, tokens(5))
    assert [m.blob for m in rest] == [b"three"]
    assert await store.receive(q, 5, ReceiveMode.PEEK_LOCK, tokens(5)) == []


async def test_receive_and_delete_removes_message(store, make_queue):
    q = make_queue()
    await store.send(q, [NewMessage(b"x"), NewMessage(b"y")])
    got = await store.receive(q, 1, ReceiveMode.RECEIVE_AND_DELETE, [])
    assert [m.blob for m in got] == [b"x"]
    assert got[0].lock_token is None and got[0].locked_until_ms is None
    counts = await store.counts(q)
    assert (counts.active, counts.locked) == (1, 0)
    got = await store.receive(q, 5, ReceiveMode.RECEIVE_AND_DELETE, [])
    assert [m.blob for m in got] == [b"y"]
    assert await store.receive(q, 5, ReceiveMode.RECEIVE_AND_DELETE, []) == []


async def test_blob_is_returned_byte_for_byte(store, make_queue, tokens):
    q = make_queue()
    blob = bytes(range(256)) * 5 + b"\x00\xff\x00"
    await store.send(q, [NewMessage(blob)])
    (m,) = await store.receive(q, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    assert m.blob == blob


async def test_enqueued_time_is_store_time_at_send(store, make_queue, tokens, server_now):
    q = make_queue()
    before = server_now()
    await store.send(q, [NewMessage(b"x")])
    after = server_now()
    (m,) = await store.receive(q, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    assert before <= m.enqueued_ms <= after


async def test_send_of_empty_batch_is_a_no_op(store, make_queue):
    q = make_queue()
    assert await store.send(q, []) == []
    assert await store.send(q, [NewMessage(b"a")]) == [1]
