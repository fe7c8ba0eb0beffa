"""`busd serve --workers 2`: two worker processes behind the same ports (docs/design.md §3.10).

Connections land on both workers, sessions stay exclusive across them, a worker killed with
SIGKILL is started again by the parent, `/metrics` and `/health/detail` answer for the host
whichever worker takes the scrape, and SIGTERM stops every process. The clients are the official
azure-servicebus SDK and python-qpid-proton on real sockets.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue, receive
from tests.e2e.test_multiprocess import drain_sessions_concurrently

pytestmark = pytest.mark.timeout(120)

WORKERS = {"BUSD_WORKERS": "2"}
CONNECTIONS = 16  # all on one worker by chance: 2**-15


def health(busd) -> dict:
    with urllib.request.urlopen(f"{busd.http_url}/health/detail", timeout=10) as response:
        return json.loads(response.read())


def metric(busd, name: str) -> float:
    with urllib.request.urlopen(f"{busd.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def worker_pids(busd) -> set[int]:
    return {w["pid"] for w in health(busd)["workers"]}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [queue("plain"), queue("sessions", RequiresSession=True, LockDuration="PT5S")],
        extra_env=WORKERS,
    )


def test_connections_land_on_both_workers_and_scrapes_answer_for_the_host(busd):
    assert len(worker_pids(busd)) == 2
    opened_before = metric(busd, "busd_connections_opened_total")
    clients = [ProtonCbsClient(busd.port) for _ in range(CONNECTIONS)]
    try:
        workers = health(busd)["workers"]
        assert len(workers) == 2
        assert all(w["connections"] > 0 for w in workers), workers
        assert sum(w["connections"] for w in workers) == CONNECTIONS
        for _ in range(6):  # each scrape lands on either worker: every one counts the host
            assert metric(busd, "busd_connections") == CONNECTIONS
            # the version once for the host, not once per worker
            assert metric(busd, f'busd_build_info{{version="{version("busd")}"}}') == 1
            assert metric(busd, "busd_connections_opened_total") == opened_before + CONNECTIONS
    finally:
        for client in clients:
            client.close()


def test_sdk_sessions_are_exclusive_across_workers(busd):
    drain_sessions_concurrently(busd, busd)


def comm(pid: int) -> str:
    """The process's name as `ps`, `top` and `pgrep` show it."""
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_workers_are_named_in_ps(busd):
    assert sorted(comm(pid) for pid in worker_pids(busd)) == ["busd-worker-0", "busd-worker-1"]


def test_a_killed_worker_is_started_again(busd):
    before = worker_pids(busd)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            now = worker_pids(busd)
        except OSError:  # the scrape landed on the dying worker
            now = set()
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the parent did not start a worker in place of {victim}: {busd.log_text()}")
    assert busd.proc.poll() is None
    assert "restarting it" in busd.log_text()
    # the new one takes its place's name
    assert sorted(comm(pid) for pid in now) == ["busd-worker-0", "busd-worker-1"]
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages([ServiceBusMessage(f"after-{i}") for i in range(10)])
        with client.get_queue_receiver("plain", max_wait_time=2) as receiver:
            got = receive(receiver, 10)
            for message in got:
                receiver.complete_message(message)
    assert sorted(str(m) for m in got) == sorted(f"after-{i}" for i in range(10))


def test_sigterm_stops_every_process_and_the_embedded_store_once(busd_factory, tmp_path):
    busd = busd_factory(
        [queue("plain")], embedded=True, data_dir=tmp_path / "data", extra_env=WORKERS
    )
    pids = worker_pids(busd)
    assert len(pids) == 2 and busd.proc.pid not in pids
    assert busd.log_text().count("embedded Valkey at") == 1  # the parent's, not one per worker
    valkey = int((tmp_path / "data" / "valkey.pid").read_text())
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages(ServiceBusMessage("kept"))
    busd.proc.send_signal(signal.SIGTERM)
    assert busd.proc.wait(timeout=30) == 0
    for pid in (*pids, valkey):
        assert not alive(pid), f"process {pid} still runs after the parent stopped"
    assert busd.log_text().count("shutting down") == 2  # each worker stopped gracefully


def test_workers_stop_when_their_parent_is_killed(busd_factory):
    busd = busd_factory([queue("plain")], extra_env=WORKERS)
    pids = worker_pids(busd)
    busd.proc.kill()  # SIGKILL: the parent cannot stop anyone
    busd.proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "workers outlived their parent"
        time.sleep(0.1)
