"""--mode failover of scripts/bench: session load (tests/faults/load.py's producer and
session consumers, which survive a store going away) while the store's primary, or one
Cluster shard's primary, is killed with SIGKILL; then the checks of tests/faults/load.py:
an acknowledged send lost or stuck, a message delivered after its complete was confirmed,
a session's order broken, two holders of a session. The store is one the bench started
(bench_stores.start), so that it may kill a node of it."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.faults.load

from tests.faults import load  # noqa: E402

ENTITY = load.ENTITY  # the session queue the load uses (the bench's entities declare it)


@dataclass
class Outcome:
    killed: str  # which node, said for a reader
    verdict: load.Verdict
    record: load.Record
    seconds: float
    sent_again_s: float | None  # after the kill, to the first acknowledged send (None: never)
    received_again_s: float | None  # ... and to the first delivery of such a message


def victim(store: Any, prefix: str, partitions: int) -> int:
    """The port of the primary to kill: Sentinel's primary, or the Cluster shard holding
    the session queue (its partition 0 when it is partitioned)."""
    if hasattr(store, "current_primary"):
        return store.current_primary()
    from busd.storage.keys import key, partition_scope

    scope = partition_scope(ENTITY, 0, partitions) if partitions else ENTITY
    return store.first_owner(key(prefix, scope, "q.body"))


def survivor_url(store: Any) -> str:
    if hasattr(store, "current_primary"):
        return f"redis://127.0.0.1:{store.current_primary()}"
    return f"redis+cluster://127.0.0.1:{store.primaries()[0]}"


def on_shard(
    store: Any, prefix: str, plan: dict[str, int], partitions: int, old: int
) -> set[str] | None:
    """The sessions the killed Cluster shard held (None: every session, as with Sentinel or
    an unpartitioned queue): how soon they are served again is the failover's figure."""
    if hasattr(store, "current_primary") or not partitions:
        return None
    from busd.storage.keys import key, partition_scope
    from busd.storage.partitioned.routing import partition_of_key

    return {
        sid
        for sid in plan
        if store.first_owner(
            key(
                prefix,
                partition_scope(ENTITY, partition_of_key(sid, partitions), partitions),
                "q.body",
            )
        )
        == old
    }


def run(
    store: Any,
    port: int,
    prefix: str,
    *,
    sessions: int,
    per_session: int,
    consumers: int,
    partitions: int,
    kill_after_s: float,
    rate_per_s: float,
    deadline_s: float,
) -> Outcome:
    old = victim(store, prefix, partitions)
    killed: list[float] = []

    async def chaos() -> None:
        await asyncio.sleep(kill_after_s)
        await asyncio.to_thread(store.kill, old)
        killed.append(time.monotonic())

    plan = load.plan(sessions, per_session)
    record, seconds = asyncio.run(
        load.run(
            plan,
            port,
            [port],
            consumers=consumers,
            deadline_s=deadline_s,
            chaos=chaos,
            rate_per_s=rate_per_s,
        )
    )
    if not killed:  # the load ended first: the run proves nothing
        killed.append(time.monotonic())
    # Wait for the store to name a new primary (the load may have ended before it did).
    limit = time.monotonic() + 15
    while time.monotonic() < limit:
        try:
            left = load.stored(survivor_url(store), prefix, partitions or None)
            break
        except Exception:
            time.sleep(0.2)
    else:
        left = set()
    verdict = load.check(record, left)
    sent_s, received_s = load.recovered(
        "failover",
        record,
        verdict,
        killed[0],
        seconds,
        on_shard(store, prefix, plan, partitions, old),
    )
    return Outcome(f"primary :{old}", verdict, record, seconds, sent_s, received_s)
