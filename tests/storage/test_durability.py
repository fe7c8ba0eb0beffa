"""--durability fsync and replicated (docs/design.md §3.9): a call is answered only after the
server confirmed the write (WAITAOF; and WAIT for a replica), with one wait per pipelined
batch, never one per call; replicated writes with no replica to confirm them are refused."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from busd.storage.api import StoreUnavailable
from busd.storage.messages import NewMessage, ReceiveMode
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import start_valkey

AOF = {"appendonly": "yes", "appendfsync": "everysec"}
CALLS = 300


def waitaof_calls(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0))
    finally:
        client.close()


@pytest.fixture
def aof_server(tmp_path):
    server = start_valkey(data_dir=tmp_path, config=AOF)
    yield server
    server.stop()


async def test_fsync_waits_once_per_batch_of_calls(aof_server):
    url = aof_server.connection_url
    store = RedisStore(url, prefix=f"dur-{uuid.uuid4().hex[:8]}", durability="fsync")
    await store.connect()
    try:
        q = QueueSpec("q")
        before = waitaof_calls(url)
        seqs = await asyncio.gather(*(store.send(q, [NewMessage(b"m")]) for _ in range(CALLS)))
        waits = waitaof_calls(url) - before
        assert sorted(s for (s,) in seqs) == list(range(1, CALLS + 1))
        # at most 64 calls are in flight, written in batches, one wait each: never one per call
        assert 1 <= waits <= CALLS // 10, waits
        got = await store.receive(q, CALLS, ReceiveMode.RECEIVE_AND_DELETE, [])
        assert len(got) == CALLS
    finally:
        await store.close()


async def test_fsync_needs_the_append_only_file(tmp_path):
    server = start_valkey(data_dir=tmp_path)  # no appendonly
    store = RedisStore(server.connection_url, prefix="dur-none", durability="fsync")
    try:
        with pytest.raises(RuntimeError, match="appendonly"):
            await store.connect()
    finally:
        await store.close()
        server.stop()


async def test_replicated_refuses_writes_no_replica_confirms(aof_server):
    store = RedisStore(
        aof_server.connection_url, prefix=f"dur-{uuid.uuid4().hex[:8]}", durability="replicated"
    )
    await store.connect()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="durable"):
            await store.send(QueueSpec("q"), [NewMessage(b"unconfirmed")])
        assert time.monotonic() - started < 3  # refused, not hanging
    finally:
        await store.close()
