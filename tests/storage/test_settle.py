"""Settlement of peek-locked messages on a plain queue, and message lock renewal."""

from __future__ import annotations

import os

import pytest
import redis

from busd.errors import BusdError, Condition
from busd.storage import keys as keyspace
from busd.storage.messages import MessageState, NewMessage, Outcome, ReceiveMode, Settlement
from tests.storage.stores import NUMBERS, OWN_KEYS, SPLIT_RENEWAL

pytestmark = pytest.mark.every_store

OK = None  # settle: applied
LOCK_LOST = Condition.MESSAGE_LOCK_LOST


async def receive_one(store, entity, tokens):
    got = await store.receive(entity, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    assert len(got) == 1
    return got[0]


async def test_complete_deletes_message(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    assert await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE)]) == [OK]
    counts = await store.counts(q)
    assert (counts.active, counts.locked) == (0, 0)
    assert await store.peek(q, 0, 10) == []


async def test_abandon_increments_delivery_count(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    assert await store.settle(q, [Settlement(m.lock_token, Outcome.ABANDON)]) == [OK]
    again = await receive_one(store, q, tokens)
    assert (again.seq, again.delivery_count) == (m.seq, 1)


async def test_abandoned_message_is_the_next_delivered(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b"), NewMessage(b"c")])
    first, second = await store.receive(q, 2, ReceiveMode.PEEK_LOCK, tokens(2))
    await store.settle(q, [Settlement(first.lock_token, Outcome.ABANDON)])
    nxt = await receive_one(store, q, tokens)
    assert nxt.blob == b"a"


async def test_release_unlocks_without_counting(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    assert await store.settle(q, [Settlement(m.lock_token, Outcome.RELEASE)]) == [OK]
    again = await receive_one(store, q, tokens)
    assert (again.seq, again.delivery_count) == (m.seq, 0)


async def test_max_delivery_count_moves_to_dlq(store, make_queue, tokens):
    q = make_queue(max_delivery_count=3)
    await store.send(q, [NewMessage(b"poison")])
    for attempt in range(3):
        m = await receive_one(store, q, tokens)
        assert m.delivery_count == attempt
        await store.settle(q, [Settlement(m.lock_token, Outcome.ABANDON)])
    assert await store.receive(q, 1, ReceiveMode.PEEK_LOCK, tokens(1)) == []
    dead = await receive_one(store, q.dead_letter_queue, tokens)
    assert dead.blob == b"poison"
    assert dead.seq == m.seq
    assert dead.delivery_count == 3
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert (
        dead.dead_letter_description == "Message could not be consumed after 3 delivery attempts."
    )
    assert (await store.counts(q)).dead_letter == 1


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_dead_letter_keeps_reason_description_and_sequence_number(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"x"), NewMessage(b"bad")])
    await store.receive(q, 1, ReceiveMode.RECEIVE_AND_DELETE, [])
    m = await receive_one(store, q, tokens)
    s = Settlement(
        m.lock_token,
        Outcome.DEAD_LETTER,
        dead_letter_reason="Bad",
        dead_letter_description="really",
    )
    assert await store.settle(q, [s]) == [OK]
    (dead,) = await store.peek(q.dead_letter_queue, 0, 10)
    assert (dead.seq, dead.blob) == (2, b"bad")
    assert (dead.dead_letter_reason, dead.dead_letter_description) == ("Bad", "really")
    assert dead.enqueued_ms == m.enqueued_ms


async def test_dead_letter_without_reason_has_none(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"x")])
    m = await receive_one(store, q, tokens)
    await store.settle(q, [Settlement(m.lock_token, Outcome.DEAD_LETTER)])
    (dead,) = await store.peek(q.dead_letter_queue, 0, 10)
    assert dead.dead_letter_reason is None and dead.dead_letter_description is None


async def test_defer_hides_message_from_receive(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    m = await receive_one(store, q, tokens)
    assert await store.settle(q, [Settlement(m.lock_token, Outcome.DEFER)]) == [OK]
    nxt = await store.receive(q, 5, ReceiveMode.PEEK_LOCK, tokens(5))
    assert [x.blob for x in nxt] == [b"b"]
    counts = await store.counts(q)
    assert counts.deferred == 1
    (peeked,) = await store.peek(q, 1, 1)
    assert peeked.state == MessageState.DEFERRED


async def test_settle_with_unknown_token_is_lock_lost(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    unknown = Settlement(tokens(1)[0], Outcome.COMPLETE)
    assert await store.settle(q, [unknown]) == [LOCK_LOST]
    assert (await store.counts(q)).active == 1


async def test_settle_twice_is_lock_lost(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    s = Settlement(m.lock_token, Outcome.COMPLETE)
    assert await store.settle(q, [s, s]) == [OK, LOCK_LOST]


async def test_settle_batch_answers_each_item(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b"), NewMessage(b"c")])
    a, b, c = await store.receive(q, 3, ReceiveMode.PEEK_LOCK, tokens(3))
    statuses = await store.settle(
        q,
        [
            Settlement(a.lock_token, Outcome.COMPLETE),
            Settlement(tokens(1)[0], Outcome.COMPLETE),
            Settlement(b.lock_token, Outcome.ABANDON),
            Settlement(c.lock_token, Outcome.DEFER),
        ],
    )
    assert statuses == [OK, LOCK_LOST, OK, OK]
    counts = await store.counts(q)
    assert (counts.active, counts.locked, counts.deferred) == (1, 0, 1)


async def test_settle_after_lock_expiry_is_lock_lost_and_changes_nothing(store, make_queue, tokens):
    import asyncio

    q = make_queue(lock_duration_ms=100)
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    await asyncio.sleep(0.2)
    late = Settlement(m.lock_token, Outcome.COMPLETE)
    assert await store.settle(q, [late]) == [LOCK_LOST]
    again = await receive_one(store, q, tokens)
    assert (again.seq, again.delivery_count) == (m.seq, 1)


async def test_properties_patch_is_returned_on_later_deliveries(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    assert m.properties_patch is None
    patch = b"\x00patch\xff"
    abandon = Settlement(m.lock_token, Outcome.ABANDON, properties_patch=patch)
    await store.settle(q, [abandon])
    again = await receive_one(store, q, tokens)
    assert again.properties_patch == patch
    await store.settle(
        q, [Settlement(again.lock_token, Outcome.DEAD_LETTER, properties_patch=b"p2")]
    )
    (dead,) = await store.peek(q.dead_letter_queue, 0, 1)
    assert dead.properties_patch == b"p2"


async def test_renew_message_locks_extends_by_lock_duration(store, make_queue, tokens, server_now):
    import asyncio

    q = make_queue(lock_duration_ms=600)
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    got = await store.receive(q, 2, ReceiveMode.PEEK_LOCK, tokens(2))
    await asyncio.sleep(0.4)
    before = server_now()
    renewed = await store.renew_message_locks(q, [m.lock_token for m in got])
    after = server_now()
    for until, m in zip(renewed, got):
        assert before + 600 <= until <= after + 600
        assert until > m.locked_until_ms
    await asyncio.sleep(0.4)  # past the first lock, within the renewed one
    completions = [Settlement(m.lock_token, Outcome.COMPLETE) for m in got]
    statuses = await store.settle(q, completions)
    assert statuses == [OK, OK]


@pytest.mark.not_on("partitioned", reason=SPLIT_RENEWAL)
async def test_renew_unknown_lock_raises_lock_lost_and_renews_none(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    with pytest.raises(BusdError) as err:
        await store.renew_message_locks(q, [m.lock_token, tokens(1)[0]])
    assert err.value.condition == Condition.MESSAGE_LOCK_LOST
    (peeked,) = await store.peek(q, 0, 1)
    assert peeked.locked_until_ms == m.locked_until_ms


# A message as the store kept it before its metadata moved beside its body (`q.body` field
# 'm<seq>', lua/includes/metaField.lua) and lock tokens named their message: its metadata in
# `q.meta`; when locked (ARGV[2] a token), its token random and found through `q.tokens`.
AS_BEFORE = """
local field = 'm' .. ARGV[1]
local m = cmsgpack.unpack(redis.call('HGET', KEYS[1], field))
redis.call('HDEL', KEYS[1], field)
if ARGV[2] then
  m.tok = ARGV[2]
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[1], cmsgpack.pack(m))
"""


def old_keys(store, q):
    return [keyspace.key(store.prefix, q.name, n) for n in ("q.body", "q.meta", "q.tokens")]


@pytest.mark.not_on("cluster", reason=OWN_KEYS)
@pytest.mark.not_on("partitioned", reason=OWN_KEYS)
@pytest.mark.parametrize("outcome", [Outcome.COMPLETE, Outcome.ABANDON])
async def test_a_lock_taken_before_tokens_named_their_message_still_settles(
    store, make_queue, tokens, redis_url, outcome
):
    """The token names the message it locks (lua/includes/lockToken.lua): settling reads no
    token index. A lock the store took before keeps working, and its index entry goes, as
    does its metadata's old place."""
    q = make_queue(lock_duration_ms=30_000)
    await store.send(q, [NewMessage(b"a")])
    m = await receive_one(store, q, tokens)
    assert m.lock_token[:8] == m.seq.to_bytes(8, "big")
    body, meta, index = old_keys(store, q)
    client = redis.Redis.from_url(redis_url)
    old = os.urandom(16)
    client.eval(AS_BEFORE, 3, body, meta, index, m.seq, old)
    assert await store.renew_message_locks(q, [old])
    assert await store.settle(q, [Settlement(m.lock_token, outcome)]) == [LOCK_LOST]
    assert await store.settle(q, [Settlement(old, outcome)]) == [OK]
    assert client.hlen(index) == 0 and client.hlen(meta) == 0
    assert (await store.counts(q)).locked == 0
    if outcome == Outcome.ABANDON:
        again = await receive_one(store, q, tokens)
        assert (again.blob, again.delivery_count) == (b"a", 1)


@pytest.mark.not_on("cluster", reason=OWN_KEYS)
@pytest.mark.not_on("partitioned", reason=OWN_KEYS)
async def test_a_message_stored_before_its_metadata_moved_is_delivered_and_deleted(
    store, make_queue, tokens, redis_url
):
    """A message whose metadata is where the store kept it before (`q.meta`) is taken, settled
    and deleted as any other, and nothing of it is left in either place."""
    q = make_queue(lock_duration_ms=30_000)
    s1, s2 = await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    body, meta, _ = old_keys(store, q)
    client = redis.Redis.from_url(redis_url)
    for seq in (s1, s2):
        client.eval(AS_BEFORE, 3, body, meta, "unused", seq)
    assert [p.blob for p in await store.peek(q, 0, 10)] == [b"a", b"b"]
    got = await store.receive(q, 2, ReceiveMode.PEEK_LOCK, tokens(2))
    assert [g.blob for g in got] == [b"a", b"b"]
    assert client.hlen(meta) == 0  # moved beside the body by the lock
    assert await store.settle(q, [Settlement(g.lock_token, Outcome.COMPLETE) for g in got]) == [
        OK,
        OK,
    ]
    assert client.hlen(body) == 0 and client.hlen(meta) == 0
