"""Faults on demand (busd/broker/faults.py) over the session's real Valkey: records left in
the store act only in a busd started with faults on, and end with their window, a count alone
included, whatever busd restarted meanwhile (docs/faults.md)."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict

import pytest_asyncio

from busd.broker import faults
from busd.broker.broker import Broker
from busd.broker.settings import BrokerSettings
from busd.storage.redis.store import RedisStore
from tests.conftest import delete_prefix
from tests.protocol.harness import SAS_KEYS


@pytest_asyncio.fixture
async def prefix(redis_url):
    prefix = f"proto-faults-{uuid.uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        delete_prefix(redis_url, prefix)


async def _broker(redis_url: str, prefix: str, *, on: bool) -> Broker:
    broker = Broker(
        RedisStore(redis_url, prefix=prefix),
        sas_keys=dict(SAS_KEYS),
        settings=BrokerSettings(faults=on),
    )
    await broker.start()
    return broker


def _record(fault_id: str, *, set_ago_ms: int, until_ms: int | None) -> dict:
    now = int(time.time() * 1000)
    fault = faults.Fault(
        id=fault_id,
        kind="server-busy",
        entity="orders",
        operations=["send"],
        count=3,
        created_ms=now - set_ago_ms,
        until_ms=until_ms,
    )
    return asdict(fault)


async def _stored(broker: Broker) -> set[str]:
    records = await broker.store.catalog_all()
    return {name.partition(":")[2] for name in records if name.startswith("fault:")}


async def test_a_count_alone_ends_with_its_window_across_restarts(redis_url, prefix):
    first = await _broker(redis_url, prefix, on=True)
    try:
        made = faults.parse(
            {"kind": "server-busy", "entity": "orders", "count": 3},
            "orders",
            int(time.time() * 1000),
        )
        assert made.until_ms == made.created_ms + faults.DEFAULT_WINDOW_MS
        await first.faults.add(made)
        # a count-only record an earlier busd wrote without a window, set two hours ago
        await first.store.catalog_put(
            faults.RECORD_KIND, "older", _record("older", set_ago_ms=7_200_000, until_ms=None)
        )
    finally:
        await first.stop()
    again = await _broker(redis_url, prefix, on=True)  # a restart
    try:
        assert [f["id"] for f in await again.faults.listed()] == [made.id]
        assert await again.faults.refusal("send", "orders") is not None  # still counting
        await again.faults.sweep()
        assert await _stored(again) == {made.id}  # the one past its window is gone
    finally:
        await again.stop()


async def test_records_left_in_the_store_are_inert_when_faults_are_off(redis_url, prefix):
    on = await _broker(redis_url, prefix, on=True)
    try:
        await on.faults.add(
            faults.parse(
                {"kind": "server-busy", "entity": "orders", "duration_ms": 60_000},
                "orders",
                int(time.time() * 1000),
            )
        )
        assert on.faults.active
    finally:
        await on.stop()
    off = await _broker(redis_url, prefix, on=False)
    try:
        assert not off.faults.active and await off.faults.listed() == []
        assert await off.faults.refusal("send", "orders") is None
    finally:
        await off.stop()
