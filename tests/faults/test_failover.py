"""The store's primary is killed under session load and Sentinel promotes a replica
(docs/design.md §3.9), its replicas lagging: busd, given the Sentinels and
`--durability replicated`, keeps its
connections, refuses what cannot complete with server-busy meanwhile and serves again by
itself once the promoted replica answers. Afterwards every acknowledged send was delivered,
no message was delivered after its complete was confirmed, each session kept its order and
no session had two holders (tests/faults/load.py counts all of these).

A primary, two replicas and three Sentinels of the test's own, on loopback.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from tests.faults import load
from tests.faults.replicas import ReplicaSet

pytestmark = pytest.mark.timeout(120)

SESSIONS = int(os.environ.get("BUSD_FAULTS_SESSIONS", "12"))
PER_SESSION = int(os.environ.get("BUSD_FAULTS_PER_SESSION", "30"))
KILL_AFTER_S = 1.0
LAG_S = 0.5
RESUME_WITHIN_S = 10.0


@pytest.fixture
def replica_set(tmp_path):
    nodes = ReplicaSet(tmp_path, replicas=2, sentinels=3)
    yield nodes
    nodes.stop()


def test_primary_killed_under_load_loses_nothing_acknowledged(replica_set, start_busd, capsys):
    busd = start_busd(url=replica_set.url, env={"BUSD_DURABILITY": "replicated"})
    killed: list[float] = []
    old = replica_set.primary_port

    async def chaos() -> None:
        # The replicas lag (paused) when the primary dies: what it acknowledged meanwhile
        # without --durability replicated would be lost with it.
        await asyncio.sleep(KILL_AFTER_S)
        for port in replica_set.replica_ports:
            replica_set.pause(port)
        await asyncio.to_thread(replica_set.cut_replication, old)
        await asyncio.sleep(LAG_S)
        await asyncio.to_thread(replica_set.kill, old)
        killed.append(time.monotonic())
        for port in replica_set.replica_ports:
            replica_set.resume(port)

    record, seconds = asyncio.run(
        load.run(
            load.plan(SESSIONS, PER_SESSION),
            busd.port,
            [busd.port],
            consumers=6,
            deadline_s=45,
            chaos=chaos,
            rate_per_s=120,
        )
    )
    primary = replica_set.current_primary()
    assert killed and primary not in (None, old)
    verdict = load.check(record, load.stored(f"redis://127.0.0.1:{primary}", busd.prefix))
    # Served again: the first send acknowledged after the kill, and the first delivery of a
    # message sent after it (the killed primary answers nothing: the promoted replica did).
    with capsys.disabled():
        sent_again, received_again = load.recovered("failover", record, verdict, killed[0], seconds)
    assert busd.proc.poll() is None  # the same busd process throughout
    assert sent_again is not None and sent_again < RESUME_WITHIN_S
    assert received_again is not None and received_again < RESUME_WITHIN_S
    assert verdict.sent >= SESSIONS * PER_SESSION * 0.8
    assert verdict.violations == 0, verdict.summary()
