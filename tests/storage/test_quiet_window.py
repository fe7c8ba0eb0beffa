"""Lazy housekeeping's quiet window (includes/housekeeping.lua): a look that found nothing of a
queue due lets the queue's scripts skip theirs for a few milliseconds, a look that met its
budget does not, and neither the sweep nor a dead-letter sub-queue's locks wait for it.

The window is made long by hand here (the scripts set it for 10 ms) so that what a script
skips inside it is seen, not raced; that a script set it is seen through the store's keyspace
notifications, which outlast the key."""

from __future__ import annotations

import asyncio

import pytest
import redis

from busd.errors import Condition
from busd.storage import keys as keyspace
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def quiet_key(store, queue) -> str:
    return keyspace.key(store.prefix, queue.name, "quiet")


@pytest.fixture
def windows_set(client):
    """How many times scripts have set a key since the test began: `windows_set(key)`."""
    was = client.config_get("notify-keyspace-events")["notify-keyspace-events"]
    client.config_set("notify-keyspace-events", "K$")  # keyspace events of string commands
    pubsub = client.pubsub()
    pubsub.psubscribe("__keyspace@*__:*")
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    seen: dict[str, int] = {}

    def count(key: str) -> int:
        while (event := pubsub.get_message(timeout=0.2)) is not None:
            name = event["channel"].decode().split(":", 1)[1]
            if event["data"] == b"set":
                seen[name] = seen.get(name, 0) + 1
        return seen.get(key, 0)

    yield count
    pubsub.close()
    client.config_set("notify-keyspace-events", was)


async def receive(store, entity, n, tokens):
    return await store.receive(entity, n, ReceiveMode.PEEK_LOCK, tokens(n))


async def test_a_look_that_found_nothing_due_quiets_the_queue_for_milliseconds(
    store, make_queue, tokens, client, windows_set
):
    q = make_queue()
    assert await receive(store, q, 1, tokens) == []
    assert windows_set(quiet_key(store, q)) == 1
    ttl = client.pttl(quiet_key(store, q))
    assert ttl == -2 or 0 <= ttl <= 10  # for 10 ms (already gone on a slow machine)


async def test_inside_the_window_an_expired_lock_waits_and_after_it_is_found(
    store, make_queue, tokens, client
):
    q = make_queue(lock_duration_ms=50)
    await store.send(q, [NewMessage(b"a")])
    (m,) = await receive(store, q, 1, tokens)
    await asyncio.sleep(0.1)  # the lock has ended
    client.set(quiet_key(store, q), "1", px=60_000)
    assert await receive(store, q, 1, tokens) == []  # not looked for
    # the settlement checks its own lock's end, window or not
    assert await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE)]) == [
        Condition.MESSAGE_LOCK_LOST
    ]
    client.delete(quiet_key(store, q))
    (again,) = await receive(store, q, 1, tokens)
    assert (again.seq, again.delivery_count) == (m.seq, 1)


async def test_the_sweep_looks_inside_the_window(store, make_queue, tokens, client):
    q = make_queue(lock_duration_ms=50)
    await store.send(q, [NewMessage(b"a")])
    await receive(store, q, 1, tokens)
    await asyncio.sleep(0.1)
    client.set(quiet_key(store, q), "1", px=60_000)
    assert (await store.sweep(q)).expired_message_locks == 1
    assert (await store.counts(q)).active == 1


async def test_a_look_that_met_its_budget_leaves_the_next_script_looking(
    store, make_queue, tokens, client, windows_set
):
    q = make_queue(lock_duration_ms=50)
    await store.send(q, [NewMessage(b"m%d" % i) for i in range(150)])
    assert len(await receive(store, q, 150, tokens)) == 150
    await asyncio.sleep(0.1)  # 150 locks ended: more than one look's budget (100)
    client.delete(quiet_key(store, q))
    before = windows_set(quiet_key(store, q))  # the receive's look found nothing: one window
    await store.peek(q, 0, 1)  # a look: 100 of the 150 expire
    assert client.exists(quiet_key(store, q)) == 0  # there may be more: no window
    assert windows_set(quiet_key(store, q)) == before
    await store.peek(q, 0, 1)  # the next script looks, finds the other 50
    assert (await store.counts(q)).active == 150
    assert windows_set(quiet_key(store, q)) == before + 1  # all found: a window


async def test_a_dead_letter_sub_queue_looks_at_its_locks_inside_the_window(
    store, make_queue, tokens, client
):
    q = make_queue(lock_duration_ms=50, max_delivery_count=1)
    await store.send(q, [NewMessage(b"a")])
    (m,) = await receive(store, q, 1, tokens)
    await store.settle(q, [Settlement(m.lock_token, Outcome.DEAD_LETTER)])
    (dead,) = await receive(store, q.dead_letter_queue, 1, tokens)
    await asyncio.sleep(0.1)
    client.set(quiet_key(store, q), "1", px=60_000)
    (again,) = await receive(store, q.dead_letter_queue, 1, tokens)
    assert again.seq == dead.seq
