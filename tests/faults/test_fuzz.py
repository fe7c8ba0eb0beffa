"""Mutated real client sessions replayed at busd (tests/faults/fuzz.py): busd answers or
closes each connection, keeps serving, frees what they held, and no stored message changes.

BUSD_FAULTS_FUZZ connections (default 400) from seed BUSD_FAULTS_SEED (default 1);
`scripts/faults` runs many more.
"""

from __future__ import annotations

import asyncio
import os
import time

from proton import Delivery, Message

from tests.faults import fuzz
from tests.faults.conftest import metric, rss_kib
from tests.faults.tcp import tcp_client
from tests.protocol.harness import SEQUENCE_NUMBER

COUNT = int(os.environ.get("BUSD_FAULTS_FUZZ", "400"))
SEED = int(os.environ.get("BUSD_FAULTS_SEED", "1"))
CANARY = [f"canary {i}" for i in range(3)]


async def _fill_canary(port: int) -> None:
    client = await tcp_client(port)
    await client.authorize("canary")
    await client.send_to("canary", *(Message(body=b) for b in CANARY))
    await client.close()


async def _read_canary(port: int) -> list[tuple[str, int, int]]:
    client = await tcp_client(port)
    await client.authorize("canary")
    receiver = await client.attach_receiver("canary", credit=10)
    items = await receiver.wait_for(len(CANARY))
    await client.settle_down(0.2)
    found = [
        (i.message.body, i.annotations[SEQUENCE_NUMBER], i.message.delivery_count)
        for i in receiver.received
    ]
    for item in items:
        await client.dispose(item, Delivery.ACCEPTED)
    await client.close()
    return found


def _quiet(busd, patience: float = 10) -> None:
    deadline = time.monotonic() + patience
    while metric(busd, "busd_connections") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)


def test_fuzzed_client_sessions_are_answered_and_change_nothing(start_busd, capsys):
    busd = start_busd()
    asyncio.run(_fill_canary(busd.port))
    asyncio.run(fuzz.fuzz(busd.port, 20, SEED + 1))  # warm-up
    _quiet(busd)
    rss_before = rss_kib(busd.proc.pid)
    objects_before = metric(busd, "busd_connection_objects")

    started = time.monotonic()
    stats = asyncio.run(fuzz.fuzz(busd.port, COUNT, SEED))
    seconds = time.monotonic() - started
    _quiet(busd)
    rss_after = rss_kib(busd.proc.pid)
    objects_after = metric(busd, "busd_connection_objects")
    failures = busd.log_text().count("Traceback")
    canary = asyncio.run(_read_canary(busd.port))
    with capsys.disabled():
        print(
            f"\nfuzz: seed {SEED}, {stats['connections']} connections, {stats['frames']} "
            f"frames in {seconds:.1f} s, {stats['closed_by_busd']} closed by busd; "
            f"handler failures logged {failures}; RSS {rss_before // 1024} -> "
            f"{rss_after // 1024} MB; connection objects {objects_before:.0f} -> "
            f"{objects_after:.0f}; open {metric(busd, 'busd_connections'):.0f}"
        )
    assert busd.proc.poll() is None, "busd died"
    assert metric(busd, "busd_connections") == 0
    assert metric(busd, "busd_links") == 0  # the gauges stay right whatever failed
    assert objects_after <= objects_before + 2
    assert rss_after - rss_before < 20 * 1024
    assert canary == [(body, n + 1, 0) for n, body in enumerate(CANARY)]
    assert failures == 0, "a handler failed: see the busd log"
