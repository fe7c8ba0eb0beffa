"""A crash needs no person (docs/operating.md, "Crashes and restarts"): busd killed with
SIGKILL, however it runs (one process, `--store-shards 3`, `--workers 2`), takes its
embedded store's servers with it, and the same start command serves again on the same data
directory with every message kept. Servers left running on the data directory by a busd that
did not take them along (an older version) are stopped, their data written, and replaced.

Real processes throughout: busd as `python -m busd serve`, its valkey-servers, the SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.e2e.conftest import BusdProcess, launch_busd, queue, receive, write_config

pytestmark = pytest.mark.timeout(240)

SESSIONS, PER_SESSION = 10, 10  # 100 messages
LAYOUTS = {
    "single": {},
    "store-shards-3": {"BUSD_STORE_SHARDS": "3"},
    "workers-2": {"BUSD_WORKERS": "2", "BUSD_STORE_SHARDS": "1"},
}


def pid_files(data_dir: Path) -> list[Path]:
    return sorted([*data_dir.glob("valkey.pid"), *data_dir.glob("shard-*/valkey.pid")])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(autouse=True)
def no_server_left(tmp_path):
    """Whatever the outcome, stop the servers still running on the test's data directory (by
    their pid files, checked against /proc)."""
    yield
    data_dir = (tmp_path / "data").resolve()
    for path in pid_files(data_dir):
        try:
            pid = int(path.read_text())
            if alive(pid) and Path(os.readlink(f"/proc/{pid}/cwd")) == path.parent:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


def start(tmp_path: Path, env: dict[str, str]) -> BusdProcess:
    config = write_config(
        tmp_path / "Config.json", [queue("orders", RequiresSession=True, LockDuration="PT30S")]
    )
    return launch_busd(None, config, tmp_path, data_dir=tmp_path / "data", prefix="crash",
                       extra_env=env)  # fmt: skip


def send(busd: BusdProcess) -> list[str]:
    bodies = [f"s{s}-{i}" for s in range(SESSIONS) for i in range(PER_SESSION)]
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("orders") as sender:
            for s in range(SESSIONS):
                sender.send_messages(
                    [ServiceBusMessage(f"s{s}-{i}", session_id=f"s{s}") for i in range(PER_SESSION)]
                )
    return bodies


def receive_all(busd: BusdProcess) -> list[str]:
    got: list[str] = []
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        for s in range(SESSIONS):
            with client.get_queue_receiver("orders", session_id=f"s{s}") as receiver:
                messages = receive(receiver, PER_SESSION)
                for message in messages:
                    receiver.complete_message(message)
                got.extend(str(m) for m in messages)
    return got


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kill_9_then_the_same_start_command_serves_with_every_message(tmp_path, layout):
    env = LAYOUTS[layout]
    first = start(tmp_path, env)
    sent = send(first)
    servers = [int(p.read_text()) for p in pid_files(tmp_path / "data")]
    assert len(servers) == (3 if layout == "store-shards-3" else 1)
    first.proc.kill()  # SIGKILL: busd can do nothing about it
    first.proc.wait(timeout=10)
    killed = time.monotonic()
    second = start(tmp_path, env)  # what a supervisor's restart does: the same command
    try:
        print(f"{layout}: serving again {time.monotonic() - killed:.2f} s after the kill")
        assert second.proc.poll() is None
        assert not any(alive(pid) for pid in servers), "the old store servers still run"
        assert sorted(receive_all(second)) == sorted(sent)
    finally:
        second.stop()
    assert second.proc.returncode == 0, second.log_text()


ORPHAN_MAKER = """
import os, sys
from busd.storage.redis import embedded
embedded.ending_with_us = lambda: None  # as a busd whose servers did not end with it
data_dir, shards = sys.argv[1], int(sys.argv[2])
store = embedded.embedded_store(data_dir, shards)
store.start()
os._exit(0)  # no clean-up: the servers stay, adopted by init
"""


@pytest.mark.parametrize("shards", [1, 3])
def test_servers_left_running_by_a_gone_busd_are_replaced(tmp_path, shards):
    env = {"BUSD_STORE_SHARDS": str(shards)}
    first = start(tmp_path, env)
    sent = send(first)
    first.stop()
    data_dir = tmp_path / "data"
    made = subprocess.run([sys.executable, "-c", ORPHAN_MAKER, str(data_dir), str(shards)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    orphans = [int(p.read_text()) for p in pid_files(data_dir)]
    assert len(orphans) == shards and all(alive(pid) for pid in orphans)
    second = start(tmp_path, env)
    try:
        text = second.log_text()
        assert text.count("left running on") == shards, text  # one line per server replaced
        assert not any(alive(pid) for pid in orphans)
        assert sorted(receive_all(second)) == sorted(sent)
    finally:
        second.stop()
    assert second.proc.returncode == 0, second.log_text()
