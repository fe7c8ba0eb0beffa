"""Fault and abuse tests: real busd processes over real TCP, bounded in count and time.

What busd shows of itself for these tests: its resident memory (`/proc/<pid>/status`) and,
on `/metrics`, how many connections are open (`busd_connections`) and how many connection
objects are still in memory (`busd_connection_objects`).
"""

from __future__ import annotations

import re
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import BusdProcess, launch_busd, queue, write_config

QUEUES = [
    queue("plain"),
    queue("sessions", RequiresSession=True, LockDuration="PT2S"),
    queue("canary"),  # what no fault may change
]


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    assert match, "no VmRSS"
    return int(match.group(1))


def metric(busd: BusdProcess, name: str) -> float:
    """One unlabelled sample of busd's /metrics."""
    with urllib.request.urlopen(f"{busd.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


@pytest.fixture(scope="module")
def start_busd(redis_url, tmp_path_factory):
    """`start_busd(queues=QUEUES, redis_url=None, **env)`: a busd process on the session's
    store (or `redis_url`), stopped at the module's end."""
    started: list[BusdProcess] = []
    workdir = tmp_path_factory.mktemp("faults")

    def start(
        queues: list[dict] | None = None,
        *,
        url: str | None = None,
        prefix: str | None = None,
        env: dict | None = None,
    ) -> BusdProcess:
        config = write_config(workdir / f"config-{uuid.uuid4().hex[:6]}.json", queues or QUEUES)
        proc = launch_busd(url or redis_url, config, workdir, prefix=prefix, extra_env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
