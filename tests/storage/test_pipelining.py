"""Store calls share one pipelined connection: each caller gets its own answer, whatever the
others do (many at once, one that timed out, a connection the server dropped)."""

from __future__ import annotations

import asyncio
import os

import pytest
import redis.asyncio as redis
from redis.exceptions import TimeoutError as StoreTimeoutError

from busd.storage.api import StoreUnavailable
from busd.storage.forwarding import ForwardDestination, ForwardedMessage
from busd.storage.messages import LockTokens, NewMessage, ReceiveMode
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import start_valkey
from tests.storage.conftest import named


async def test_calls_in_flight_together_each_get_their_own_answer(store, make_queue):
    """Sends of different sizes at once: each call's answer is its own batch's sequence
    numbers, and together they are every number once."""
    q = make_queue()
    sizes = [1 + (i * 7) % 13 for i in range(120)]
    results = await asyncio.gather(*(store.send(q, [NewMessage(b"m")] * n) for n in sizes))
    assert [len(r) for r in results] == sizes
    for r in results:
        assert r == list(range(r[0], r[0] + len(r)))  # one script run: consecutive numbers
    assert sorted(s for r in results for s in r) == list(range(1, sum(sizes) + 1))


async def test_a_call_that_timed_out_does_not_shift_the_answers_of_later_calls(tmp_path):
    """The server answers late (paused): the call times out, and its answer, when it comes,
    goes to no one; the next call gets its own."""
    server = start_valkey(data_dir=tmp_path)
    try:
        store = RedisStore(
            server.connection_url + "?socket_timeout=0.3", prefix="late-" + os.urandom(4).hex()
        )
        await store.connect()
        admin = redis.Redis.from_url(server.connection_url)
        try:
            q, other = QueueSpec("q"), QueueSpec("other")
            await store.send(other, [NewMessage(b"x")] * 5)
            await admin.execute_command("CLIENT", "PAUSE", 800, "ALL")
            with pytest.raises(StoreUnavailable) as refused:  # server-busy for clients
                await store.send(q, [NewMessage(b"late")])
            assert isinstance(refused.value.__cause__, StoreTimeoutError)
            await asyncio.sleep(0.8)  # the pause ends; the late answer arrives
            assert await store.send(other, [NewMessage(b"y")] * 2) == [6, 7]
            got = await store.receive(q, 5, ReceiveMode.RECEIVE_AND_DELETE, [])
            assert [m.blob for m in got] == [b"late"]  # it ran; its caller was told it may not
        finally:
            await admin.aclose()
            await store.close()
    finally:
        server.stop()


async def test_a_move_and_a_commit_report_a_stopped_store_as_unavailable(tmp_path):
    """Forwarding and transaction commits call their scripts like every other call: a store
    that is gone is StoreUnavailable (server-busy for clients, docs/design.md §2.11), not a
    raw connection error."""
    server = start_valkey(data_dir=tmp_path)
    store = RedisStore(server.connection_url, prefix="gone-" + os.urandom(4).hex())
    try:
        await store.connect()
        src, dst = QueueSpec("src"), QueueSpec("dst")
        await store.send(src, [NewMessage(b"m")])
    except BaseException:
        server.stop()
        raise
    server.stop()
    try:
        with pytest.raises(StoreUnavailable):
            await store.forward(
                src,
                ForwardDestination("queue:dst", queue=dst),
                [ForwardedMessage(token=os.urandom(16), seq=1)],
                hop_limit=4,
            )
        with pytest.raises(StoreUnavailable):
            await store.commit_transaction(src, [dst], b"txn")
    finally:
        await store.close()


async def test_a_dropped_connection_fails_only_calls_in_flight_and_is_made_again(store, make_queue):
    q = make_queue()
    assert await store.send(q, [NewMessage(b"a")]) == [1]
    admin = redis.Redis.from_url(store.url)
    try:
        ours = [c for c in await admin.client_list() if c["name"] == f"busd:{store.prefix}"]
        assert ours
        for c in ours:
            await admin.client_kill_filter(_id=c["id"])
    finally:
        await admin.aclose()
    await asyncio.sleep(0.2)  # the store notices the connection went
    assert await store.send(q, [NewMessage(b"b")]) == [2]


def test_lock_tokens_read_like_a_list_of_16_byte_tokens():
    tokens = LockTokens(5)
    assert len(tokens) == 5 and len(tokens.packed) == 80
    as_list = list(tokens)
    assert all(len(t) == 16 for t in as_list) and len(set(as_list)) == 5
    assert tokens[-1] == as_list[4] and tokens[1:3] == as_list[1:3]
    assert b"".join(as_list) == tokens.packed
    with pytest.raises(IndexError):
        tokens[5]


async def test_lock_tokens_are_the_tokens_of_the_messages_taken(store, make_queue):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    tokens = LockTokens(10)  # more than there are messages, as a receive with credit asks
    got = await store.receive(q, 10, ReceiveMode.PEEK_LOCK, tokens)
    assert [m.lock_token for m in got] == [named(t, m.seq) for t, m in zip(tokens, got)]
