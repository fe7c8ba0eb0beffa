"""Fixtures for the storage tests: queue specs with short timings, lock tokens."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest

from busd.storage.api import QueueSpec


@pytest.fixture
def make_queue() -> Callable[..., QueueSpec]:
    """A QueueSpec factory; each call gets a fresh queue name."""

    def make(**overrides: object) -> QueueSpec:
        name = str(overrides.pop("name", f"q-{uuid.uuid4().hex[:8]}"))
        return QueueSpec(name=name, **overrides)  # type: ignore[arg-type]

    return make


def named(token: bytes, seq: int) -> bytes:
    """The lock token a message locked under the broker's `token` gets: its first 8 bytes name
    the message (its sequence number), the rest are the broker's (lua/includes/lockToken.lua)."""
    return seq.to_bytes(8, "big") + token[8:]


@pytest.fixture
def tokens() -> Callable[[int], list[bytes]]:
    """n fresh lock tokens (16 random bytes each, as the broker chooses them)."""
    return lambda n: [os.urandom(16) for _ in range(n)]


@pytest.fixture
def server_now(redis_url: str) -> Callable[[], int]:
    """The store server's clock in ms (the clock the scripts use)."""
    import redis

    def now() -> int:
        client = redis.Redis.from_url(redis_url)
        try:
            sec, usec = client.time()
        finally:
            client.close()
        return sec * 1000 + usec // 1000

    return now
