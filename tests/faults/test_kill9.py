"""kill -9 of a busd process under load, over two processes sharing one store: no
acknowledged message is lost, none is delivered again after its complete was confirmed,
sessions keep their order and never have two holders (docs/design.md §2.11).

Process A is killed with SIGKILL and started again, over and over, while a producer sends
through process B and consumers take sessions from both. Sizes come from the environment
(BUSD_FAULTS_SESSIONS, BUSD_FAULTS_PER_SESSION, BUSD_FAULTS_KILLS); `scripts/faults` runs a
longer version.
"""

from __future__ import annotations

import asyncio
import os
import signal

from tests.faults import load
from tests.faults.conftest import rss_kib

SESSIONS = int(os.environ.get("BUSD_FAULTS_SESSIONS", "12"))
PER_SESSION = int(os.environ.get("BUSD_FAULTS_PER_SESSION", "8"))
KILLS = int(os.environ.get("BUSD_FAULTS_KILLS", "2"))
EVERY_S = 2.5


def test_kill_9_of_one_process_under_load_loses_nothing(start_busd, redis_url, capsys):
    a = start_busd()
    b = start_busd(prefix=a.prefix)
    ports = [a.port, b.port]
    rss_before = rss_kib(b.proc.pid)
    killed: list[int] = []

    async def chaos() -> None:
        nonlocal a
        for _ in range(KILLS):
            await asyncio.sleep(EVERY_S)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait()
            killed.append(a.proc.pid)
            a = await asyncio.to_thread(start_busd, prefix=a.prefix)
            ports[0] = a.port

    plan = load.plan(SESSIONS, PER_SESSION)
    record, seconds = asyncio.run(
        load.run(
            plan, b.port, ports, consumers=6, deadline_s=15 + KILLS * (EVERY_S + 3), chaos=chaos
        )
    )
    verdict = load.check(record, load.stored(redis_url, a.prefix))
    rss_after = rss_kib(b.proc.pid)
    with capsys.disabled():
        print(
            f"\nkill -9: {len(killed)} kills in {seconds:.1f} s; {verdict.summary()}; "
            f"refusals {dict(record.refusals)}; reconnects {record.reconnects}; "
            f"send failures {record.send_failures}; RSS of the surviving process "
            f"{rss_before // 1024} -> {rss_after // 1024} MB"
        )
        for example in verdict.examples:
            print("  ", example)
    assert len(killed) == KILLS
    assert verdict.sent >= SESSIONS * PER_SESSION * 0.9
    assert verdict.violations == 0, verdict.summary()
