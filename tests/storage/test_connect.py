"""Connecting checks the server; a store survives a server that forgot its scripts."""

from __future__ import annotations

import logging
import os

import pytest

from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.redis.store import RedisStore
from tests.conftest import start_valkey


async def test_connect_warns_when_the_server_may_evict_keys(tmp_path, caplog):
    server = start_valkey(data_dir=tmp_path, config={"maxmemory-policy": "allkeys-lru"})
    try:
        store = RedisStore(server.connection_url, prefix="evict")
        with caplog.at_level(logging.WARNING, logger="busd.storage"):
            await store.connect()
        assert await store.ping()
        await store.close()
    finally:
        server.stop()
    assert any("noeviction" in r.getMessage() for r in caplog.records)


async def test_connect_to_a_noeviction_server_does_not_warn(tmp_path, caplog):
    server = start_valkey(data_dir=tmp_path, config={"maxmemory-policy": "noeviction"})
    try:
        store = RedisStore(server.connection_url, prefix="noevict")
        with caplog.at_level(logging.WARNING, logger="busd.storage"):
            await store.connect()
        await store.close()
    finally:
        server.stop()
    assert not [r for r in caplog.records if r.name == "busd.storage"]


async def test_scripts_are_reloaded_after_function_flush(store, make_queue, redis_url):
    """A server without busd's library (flushed, or restarted without its data) gets it
    again on the first call, which then runs once."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(redis_url)
    try:
        await client.function_flush()
    finally:
        await client.aclose()
    q = make_queue()
    assert await store.send(q, [NewMessage(b"a")]) == [1]
    got = await store.receive(q, 1, ReceiveMode.RECEIVE_AND_DELETE, [])
    assert got[0].blob == b"a"


async def test_ping_is_false_when_closed(store):
    await store.close()
    assert not await store.ping()


def test_prefix_with_hash_tag_braces_is_refused():
    with pytest.raises(ValueError):
        RedisStore("redis://127.0.0.1:1", prefix="a{b}")


async def test_many_concurrent_calls_wait_for_a_connection_instead_of_failing(redis_url):
    """Far more calls at once than the store may run: each waits its turn, none fails (redis-py's
    own asyncio pool fails at its limit, which is why the store bounds its calls itself)."""
    import asyncio

    from busd.storage.specs import QueueSpec

    store = RedisStore(redis_url, prefix="concurrency-" + os.urandom(4).hex(), max_calls=4)
    await store.connect()
    try:
        q = QueueSpec("burst")
        results = await asyncio.gather(
            *(store.send(q, [NewMessage(b"m%d" % i)]) for i in range(400))
        )
        assert sorted(seq for (seq,) in results) == list(range(1, 401))
        clients = await store._client.client_list()
        ours = [c for c in clients if c["name"] == f"busd:{store.prefix}"]
        assert len(ours) <= 4 + 1  # the calls' connections, plus the one that listed them
    finally:
        await store.close()


async def test_a_call_that_waits_too_long_for_its_turn_is_server_busy(redis_url, monkeypatch):

    import busd.storage.redis.store as rs
    from busd.errors import BusdError, Condition
    from busd.storage.specs import QueueSpec

    monkeypatch.setattr(rs, "CALL_WAIT_S", 0.2)
    store = RedisStore(redis_url, prefix="busy-" + os.urandom(4).hex(), max_calls=1)
    await store.connect()
    try:
        await store._slots.acquire()  # the only turn is taken (a call that hangs)
        with pytest.raises(BusdError) as refused:
            await store.send(QueueSpec("q"), [NewMessage(b"x")])
        assert refused.value.condition == Condition.SERVER_BUSY
        store._slots.release()
        assert await store.send(QueueSpec("q"), [NewMessage(b"x")]) == [1]
    finally:
        await store.close()


async def test_a_process_loads_the_scripts_library_only_where_it_is_missing(redis_url):
    """FUNCTION LOAD is appended to the AOF and sent to replicas (0.15 MB each time): a
    process that finds its library's version on the server does not load it again, and one
    that finds it missing does."""
    import redis.asyncio as redis

    def loads(stats: dict) -> int:
        return int(stats.get("cmdstat_function|load", {}).get("calls", 0))

    client = redis.Redis.from_url(redis_url)
    first = RedisStore(redis_url, prefix="libload")
    await first.connect()
    await first.close()
    try:
        before = loads(await client.info("commandstats"))
        again = RedisStore(redis_url, prefix="libload")
        await again.connect()
        await again.close()
        assert loads(await client.info("commandstats")) == before
        await client.function_flush()
        flushed = RedisStore(redis_url, prefix="libload")
        await flushed.connect()
        await flushed.close()
        assert loads(await client.info("commandstats")) == before + 1
    finally:
        await client.aclose()
