"""The busd process as an operator meets it: restarts, shutdown, the embedded store, tracing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from tests.e2e.conftest import queue, receive, write_config

pytestmark = pytest.mark.timeout(120)

QUEUES = [queue("jobs"), queue("sessions", RequiresSession=True)]


def test_messages_survive_a_restart_of_the_embedded_store(busd_factory, tmp_path):
    data_dir = tmp_path / "data"
    first = busd_factory(QUEUES, embedded=True, data_dir=data_dir, prefix="restart")
    with ServiceBusClient.from_connection_string(first.connection_string) as client:
        with client.get_queue_sender("jobs") as sender:
            sender.send_messages([ServiceBusMessage("kept-1"), ServiceBusMessage("kept-2")])
    first.stop(signal.SIGTERM)
    assert first.proc.returncode == 0, first.log_text()
    second = busd_factory(QUEUES, embedded=True, data_dir=data_dir, prefix="restart")
    with ServiceBusClient.from_connection_string(second.connection_string) as client:
        with client.get_queue_receiver(
            "jobs", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=3
        ) as receiver:
            # one receive call may return fewer than are on their way: ask until both came
            bodies = [str(m) for m in receive(receiver, 2)]
    assert bodies == ["kept-1", "kept-2"]


@pytest.mark.parametrize("embedded", [False, True], ids=["redis-url", "embedded"])
def test_graceful_shutdown_releases_session_locks(busd_factory, tmp_path, embedded):
    """SIGTERM with a session receiver attached lets go of the session while the store still
    runs (the embedded one included): free at once for the next process, and no warning that
    releasing it failed."""
    prefix = f"shutdown-{uuid.uuid4().hex[:8]}"  # both processes share one store namespace
    where = {"embedded": True, "data_dir": tmp_path / "data"} if embedded else {}
    first = busd_factory(QUEUES, prefix=prefix, **where)
    with ServiceBusClient.from_connection_string(first.connection_string, retry_total=0) as client:
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages(ServiceBusMessage("held", session_id="s"))
        receiver = client.get_queue_receiver("sessions", session_id="s")
        receiver.__enter__()
        assert [str(m) for m in receiver.receive_messages(max_wait_time=3)] == ["held"]
        first.stop(signal.SIGTERM)  # the lock (60 s) must not outlive the process
        assert first.proc.returncode == 0, first.log_text()
    assert warnings_in(first.log_text()) == [], first.log_text()
    second = busd_factory(QUEUES, prefix=prefix, **where)
    with ServiceBusClient.from_connection_string(second.connection_string, retry_total=0) as client:
        with client.get_queue_receiver("sessions", session_id="s") as again:
            (message,) = again.receive_messages(max_wait_time=3)
            assert str(message) == "held" and message.delivery_count == 0
            again.complete_message(message)


def test_trace_level_logs_every_frame(busd_factory):
    busd = busd_factory(QUEUES, log_level="trace")
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("jobs") as sender:
            sender.send_messages(ServiceBusMessage("traced"))
    text = busd.log_text()
    for frame in ("@sasl-init", "@open", "@begin", "@attach", "@transfer", "@disposition"):
        assert frame in text, frame


def warnings_in(text: str, allowed: str | None = None) -> list[str]:
    """The WARNING (and worse) lines of a log, but for those containing `allowed`."""
    return [
        line
        for line in text.splitlines()
        if any(level in line for level in ("WARNING", "ERROR", "CRITICAL", "Traceback"))
        and (allowed is None or allowed not in line)
    ]


def sigterm_answered(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (/proc's SigCgt mask)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def start_then_sigterm(cmd: list[str], log_path, after: float, ready: str | None = None) -> int:
    """Start `cmd`, send SIGTERM `after` s past the moment it answers SIGTERM (or once its log
    shows `ready`), and return its exit code (a stop must take less than 10 s)."""
    out = open(log_path, "wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not sigterm_answered(proc.pid) or (ready and ready not in log_path.read_text()):
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.01)
        time.sleep(after)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()


def serve_command(tmp_path, *args: str) -> list[str]:
    config = write_config(tmp_path / "config.json", QUEUES)
    return [
        sys.executable, "-m", "busd", "serve", "--host", "127.0.0.1", "--port", "0",
        "--http-port", "0", "--tls-port", "off", "--ws-port", "off", "--config", str(config),
        "--data-dir", str(tmp_path / "data"), *args,
    ]  # fmt: skip


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_while_waiting_for_the_store_exits_0(tmp_path, workers):
    """Nothing listens at --redis-url: busd waits for it, and SIGTERM ends the wait at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        unused = sock.getsockname()[1]
    cmd = serve_command(
        tmp_path,
        *("--redis-url", f"redis://127.0.0.1:{unused}", "--store-wait", "60"),
        *("--workers", workers),
    )
    log_path = tmp_path / "busd.log"
    code = start_then_sigterm(cmd, log_path, 0.1, ready="waiting for the store")
    text = log_path.read_text()
    assert code == 0, text
    assert warnings_in(text, allowed="waiting for the store") == [], text


@pytest.mark.parametrize("after", [0.0, 0.3, 0.8, 2.0])
@pytest.mark.parametrize("layout", ["single", "workers"])
def test_sigterm_at_any_moment_of_start_up_exits_0(tmp_path, after, layout):
    """From the moment busd answers SIGTERM (its first lines of Python) to serving, with the
    embedded store (one server, or 3 shards under 2 workers): exit 0, nothing left running on
    the data directory, no warning."""
    log_path = tmp_path / "busd.log"
    args = ("--workers", "2", "--store-shards", "3") if layout == "workers" else ()
    code = start_then_sigterm(serve_command(tmp_path, *args), log_path, after)
    text = log_path.read_text()
    assert code == 0, text
    assert warnings_in(text) == [], text
    assert not list((tmp_path / "data").glob("**/valkey.pid")), text  # the store stopped
