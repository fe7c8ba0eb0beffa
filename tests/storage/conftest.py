"""Fixtures for the storage tests: queue specs with short timings, lock tokens, and the stores
a test runs on.

A module marked `every_store` runs each of its tests on three stores (docs/design.md §3.9,
§3.18): `server`, one Valkey (the suite's, tests/conftest.py); `cluster`, a Cluster of three
primaries, started once per test process the first time a test needs it; and `partitioned`,
the same Cluster with every queue and topic the test makes through `make_queue` / `spread`
in PARTITIONS partitions, behind the partitioned store. A test that cannot run on one of
them says why with `pytest.mark.not_on(store, reason=...)`: it is reported as skipped with
that reason, never left out silently."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from busd.storage import keys as keyspace
from busd.storage.partitioned.router import wrap
from busd.storage.partitioned.routing import first_seq
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from busd.testing.broker import delete_prefix

STORES = ("server", "cluster", "partitioned")
PARTITIONS = 4  # more than the Cluster's three shards: two partitions share one


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "every_store: run on one server, a 3-primary Cluster and partitioned entities"
    )
    config.addinivalue_line(
        "markers", "not_on(store, reason): this test cannot run on that store, for that reason"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_kind" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "every_store"
    ):
        metafunc.parametrize("store_kind", STORES, indirect=True)


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """The store this test runs on (STORES); one server unless the module is `every_store`."""
    kind = str(getattr(request, "param", "server"))
    for mark in request.node.iter_markers("not_on"):
        assert mark.args[0] in STORES, f"not_on: no store {mark.args[0]!r} (STORES)"
        if mark.args[0] == kind:
            pytest.skip(f"not on a {kind} store: {mark.kwargs.get('reason') or mark.args[1]}")
    return kind


@pytest.fixture(scope="session")
def store_cluster(tmp_path_factory) -> Iterator[Any]:  # -> tests.faults.replicas.Cluster
    """Three primaries without replicas on loopback, shared by this process's tests (each
    keeps to a key prefix of its own)."""
    from tests.faults.replicas import Cluster

    nodes = Cluster(tmp_path_factory.mktemp("store-cluster"), primaries=3, replicas=0)
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def store_url(request: pytest.FixtureRequest, store_kind: str) -> str:
    """The URL of the store this test runs on: what a second store of the test connects to."""
    if store_kind == "server":
        return str(request.getfixturevalue("redis_url"))
    return str(request.getfixturevalue("store_cluster").url)


@pytest.fixture
def store_prefix() -> str:
    """The key prefix of the test's store."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture
async def store(
    request: pytest.FixtureRequest, store_kind: str, store_url: str, store_prefix: str
) -> AsyncIterator:
    """A connected store with a key prefix of its own, created in the test's loop; on
    `partitioned`, the partitioned store over it, as the broker uses it."""
    prefix = store_prefix
    inner = RedisStore(store_url, prefix=prefix)
    s = wrap(inner) if store_kind == "partitioned" else inner
    await s.connect()
    try:
        yield s
    finally:
        await s.close()
        if store_kind == "server":
            delete_prefix(store_url, prefix)
        else:
            delete_on_cluster(request.getfixturevalue("store_cluster"), prefix)


def delete_on_cluster(cluster: Any, prefix: str) -> None:
    """delete_prefix on each primary, a key at a time: a Cluster refuses one UNLINK of keys
    of several slots."""
    for port in cluster.primaries():
        with cluster.client(port) as node:
            names = [*node.scan_iter(match="{" + prefix + ":*", count=1000)]
            names += node.scan_iter(match=prefix + ":*", count=1000)
            with node.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.unlink(name)
                pipe.execute()


@pytest.fixture
def spread(store_kind: str) -> dict[str, int]:
    """What makes an entity partitioned on the `partitioned` store, nothing elsewhere: for a
    test's own QueueSpec(...) and TopicSpec(...)."""
    return {"partitions": PARTITIONS} if store_kind == "partitioned" else {}


@pytest.fixture
def created(store_kind: str, store_url: str, store_prefix: str) -> Callable[[Any], Any]:
    """created(spec): a queue or topic as the broker creates it: a partitioned one's
    partitions count from their own first numbers (busd.storage.partitioned.routing
    `first_seq`, set by the partitioned store's catalog_put when the broker creates the
    entity). Returns spec."""

    def create(spec: Any) -> Any:
        if store_kind != "partitioned" or not spec.partitions:
            return spec
        import redis

        with redis.RedisCluster.from_url(store_url.replace("redis+cluster", "redis")) as client:
            for part in spec.partition_specs[1:]:
                name = keyspace.key(store_prefix, part.key_scope[0], "seq")
                client.set(name, first_seq(part.partition), nx=True)
        return spec

    return create


@pytest.fixture
def make_queue(spread: dict[str, int], created: Callable[[Any], Any]) -> Callable[..., QueueSpec]:
    """A QueueSpec factory; each call gets a fresh queue name (partitioned on `partitioned`,
    and created)."""

    def make(**overrides: object) -> QueueSpec:
        name = str(overrides.pop("name", f"q-{uuid.uuid4().hex[:8]}"))
        return created(QueueSpec(name=name, **{**spread, **overrides}))  # type: ignore[arg-type]

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
    """The store server's clock in ms (the clock the scripts use; every store of these tests
    runs on this machine's clock)."""
    import redis

    def now() -> int:
        client = redis.Redis.from_url(redis_url)
        try:
            sec, usec = client.time()
        finally:
            client.close()
        return sec * 1000 + usec // 1000

    return now
