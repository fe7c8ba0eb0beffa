"""Lock expiry, the dead-letter sub-queue, and message time to live."""

from __future__ import annotations

import asyncio

from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement


async def receive(store, entity, n, tokens):
    return await store.receive(entity, n, ReceiveMode.PEEK_LOCK, tokens(n))


async def test_expired_lock_is_redelivered_with_count_plus_one(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=300)
    await store.send(q, [NewMessage(b"a")])
    (m,) = await receive(store, q, 1, tokens)
    assert await receive(store, q, 1, tokens) == []  # still locked
    await asyncio.sleep(0.35)
    (again,) = await receive(store, q, 1, tokens)
    assert (again.seq, again.delivery_count) == (m.seq, 1)
    assert again.lock_token != m.lock_token


async def test_sweep_expires_message_locks(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=100)
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    await receive(store, q, 2, tokens)
    await asyncio.sleep(0.2)
    result = await store.sweep(q)
    assert result.expired_message_locks == 2
    counts = await store.counts(q)
    assert (counts.active, counts.locked) == (2, 0)
    assert (await store.sweep(q)).expired_message_locks == 0  # idempotent


async def test_expired_lock_at_max_delivery_count_moves_to_dlq(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=50, max_delivery_count=2)
    await store.send(q, [NewMessage(b"a")])
    for _ in range(2):
        assert len(await receive(store, q, 1, tokens)) == 1
        await asyncio.sleep(0.1)
    await store.sweep(q)
    (dead,) = await store.peek(q.dead_letter_queue, 0, 5)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.delivery_count == 2


async def test_dlq_is_receivable_like_a_plain_queue(store, make_queue, tokens):
    q = make_queue(max_delivery_count=1)
    dlq = q.dead_letter_queue
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b"), NewMessage(b"c")])
    got = await receive(store, q, 3, tokens)
    await store.settle(q, [Settlement(m.lock_token, Outcome.DEAD_LETTER) for m in got])
    a, b, c = await receive(store, dlq, 3, tokens)
    assert [a.seq, b.seq, c.seq] == [1, 2, 3]
    statuses = await store.settle(
        dlq,
        [
            Settlement(a.lock_token, Outcome.COMPLETE),
            Settlement(b.lock_token, Outcome.ABANDON),
            Settlement(c.lock_token, Outcome.DEFER),
        ],
    )
    assert statuses == [None] * 3
    # abandon in the DLQ counts but never dead-letters again (no MaxDeliveryCount there)
    (b2,) = await receive(store, dlq, 5, tokens)
    assert (b2.seq, b2.delivery_count) == (2, 1)
    await store.settle(dlq, [Settlement(b2.lock_token, Outcome.ABANDON)])
    counts = await store.counts(dlq)
    assert (counts.active, counts.deferred, counts.dead_letter) == (1, 1, 2)
    (c2,) = await store.receive_deferred(dlq, [3], ReceiveMode.RECEIVE_AND_DELETE, [])
    assert c2.blob == b"c"
    assert await store.purge(dlq) == 1
    assert (await store.counts(dlq)).dead_letter == 0


async def test_dlq_lock_expiry_makes_message_available_again(store, make_queue, tokens):
    q = make_queue(lock_duration_ms=300, max_delivery_count=1)
    dlq = q.dead_letter_queue
    await store.send(q, [NewMessage(b"a")])
    (m,) = await receive(store, q, 1, tokens)
    await store.settle(q, [Settlement(m.lock_token, Outcome.DEAD_LETTER)])
    (d,) = await receive(store, dlq, 1, tokens)
    await asyncio.sleep(0.35)
    (d2,) = await receive(store, dlq, 1, tokens)
    assert (d2.seq, d2.delivery_count) == (d.seq, d.delivery_count + 1)


async def test_message_past_ttl_is_dropped(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"short", ttl_ms=50), NewMessage(b"long")])
    await asyncio.sleep(0.1)
    got = await receive(store, q, 5, tokens)
    assert [m.blob for m in got] == [b"long"]
    assert (await store.counts(q)).dead_letter == 0


async def test_expires_time_is_enqueued_plus_capped_ttl(store, make_queue, tokens):
    q = make_queue(default_ttl_ms=60_000)
    await store.send(
        q, [NewMessage(b"a", ttl_ms=3_600_000), NewMessage(b"b", ttl_ms=1000), NewMessage(b"c")]
    )
    a, b, c = await receive(store, q, 3, tokens)
    assert a.expires_ms == a.enqueued_ms + 60_000
    assert b.expires_ms == b.enqueued_ms + 1000
    assert c.expires_ms == c.enqueued_ms + 60_000
    unbounded = make_queue()
    await store.send(unbounded, [NewMessage(b"d")])
    (d,) = await receive(store, unbounded, 1, tokens)
    assert d.expires_ms is None


async def test_expired_message_is_dead_lettered_when_queue_says_so(store, make_queue, tokens):
    q = make_queue(dead_letter_on_expiration=True, default_ttl_ms=50)
    await store.send(q, [NewMessage(b"a")])
    await asyncio.sleep(0.1)
    assert await receive(store, q, 1, tokens) == []
    (dead,) = await receive(store, q.dead_letter_queue, 1, tokens)
    assert dead.blob == b"a"
    assert dead.dead_letter_reason == "TTLExpiredException"
    assert dead.dead_letter_description == "The message expired and was dead lettered."
    assert dead.expires_ms is None  # no TTL in the DLQ


async def test_sweep_expires_messages(store, make_queue):
    q = make_queue(default_ttl_ms=50)
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    await asyncio.sleep(0.1)
    result = await store.sweep(q)
    assert result.expired_messages == 2
    assert (await store.counts(q)).active == 0


async def test_locked_message_does_not_expire_until_unlocked(store, make_queue, tokens):
    q = make_queue(default_ttl_ms=300)
    await store.send(q, [NewMessage(b"a")])
    (m,) = await receive(store, q, 1, tokens)
    await asyncio.sleep(0.35)
    await store.sweep(q)
    # still locked: completing it works
    statuses = await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE)])
    assert statuses == [None]


async def test_abandoned_message_past_ttl_expires(store, make_queue, tokens):
    q = make_queue(default_ttl_ms=300, dead_letter_on_expiration=True)
    await store.send(q, [NewMessage(b"a")])
    (m,) = await receive(store, q, 1, tokens)
    await asyncio.sleep(0.35)
    await store.settle(q, [Settlement(m.lock_token, Outcome.ABANDON)])
    assert await receive(store, q, 1, tokens) == []
    (dead,) = await store.peek(q.dead_letter_queue, 0, 1)
    assert dead.dead_letter_reason == "TTLExpiredException"


async def test_concurrent_sweeps_expire_each_lock_once(store, make_queue, tokens, redis_url):
    from busd.storage.redis.store import RedisStore

    q = make_queue(lock_duration_ms=50)
    await store.send(q, [NewMessage(b"m%d" % i) for i in range(30)])
    await receive(store, q, 30, tokens)
    await asyncio.sleep(0.1)
    others = [RedisStore(redis_url, prefix=store.prefix) for _ in range(3)]
    for o in others:
        await o.connect()
    try:
        results = await asyncio.gather(*(s.sweep(q) for s in [store, *others]))
    finally:
        for o in others:
            await o.close()
    assert sum(r.expired_message_locks for r in results) == 30
    got = await receive(store, q, 30, tokens)
    assert sorted(m.delivery_count for m in got) == [1] * 30
