"""The Go tier: Microsoft's Go SDK (`azservicebus`, its version pinned in go.mod), unchanged,
against a real busd. One `go test` run covers every scenario (*_test.go here; the quick start
of docs/quickstart.md in quickstart/); each Go test is then one pytest case, so a failure names
its scenario. The broker goes to Go in the environment (helpers_test.go lists the variables);
the module cache is Go's own (GOMODCACHE), so the SDK is downloaded once per machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import launch_busd, queue, write_config

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).parent
DOCS = HERE.parent.parent / "docs"
GO = shutil.which("go")

# Every Go test of the tier, by package ("." the scenarios, "quickstart" the page's example).
GO_TESTS = [
    "quickstart/TestQuickStart",
    "TestSessionsNamedAndNext",
    "TestSessionStateAndRenewLock",
    "TestSessionLockLost",
    "TestSessionSettlement",
    "TestScheduledAndCancelled",
    "TestPeek",
    "TestReceiveAndDelete",
    "TestBatches",
    "TestRequestReply",
    "TestSessionProcessorLoop",
    "TestTopicFilters",
    "TestAdminCRUD",
    "TestWebSockets",
    "TestTLS",
]


def entities() -> list[dict]:
    """The queues the Go tests use, each its own (the tests run in parallel)."""
    sessions = {"RequiresSession": True}
    return [
        queue("session-queue", **sessions, DefaultMessageTimeToLive="P14D"),
        queue("go-sessions", **sessions, LockDuration="PT30S"),
        queue("go-state", **sessions, LockDuration="PT30S"),
        queue("go-lock-lost", **sessions),
        queue("go-settle", **sessions),
        queue("go-schedule", **sessions),
        queue("go-peek", **sessions),
        queue("go-receive-delete", **sessions),
        queue("go-batches", **sessions),
        queue("go-requests"),
        queue("go-replies", **sessions),
        queue("go-processor", **sessions, LockDuration="PT30S", MaxDeliveryCount=100),
        queue("go-websocket", **sessions),
    ]


@pytest.fixture(scope="module")
def go_run(redis_url, tmp_path_factory):
    """Start busd, run `go test` over the whole tier once; its events by test."""
    if GO is None:
        pytest.skip("needs the Go toolchain (`go`, 1.25 or later) on PATH")
    workdir = tmp_path_factory.mktemp("busd-go")
    config = write_config(workdir / "config.json", entities())
    # faults on demand on (docs/faults.md): TestSessionLockLost loses a session lock
    busd = launch_busd(redis_url, config, workdir, extra_env={"BUSD_FAULTS": "1"})
    try:
        env = dict(os.environ)
        env.update(
            SERVICEBUS_CONNECTION_STRING=busd.connection_string,
            BUSD_TLS_PORT=str(busd.tls_port),
            BUSD_WS_PORT=str(busd.ws_port),
            BUSD_HTTP_PORT=str(busd.http_port),
            BUSD_CA_FILE=str(busd.cert_path),
            SSL_CERT_FILE=str(busd.cert_path),
        )
        done = subprocess.run(
            [GO, "test", "-count=1", "-json", "-timeout", "480s", "./..."],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=570,
        )
    finally:
        busd.stop()
    return GoRun(done, busd.log_text())


class GoRun:
    def __init__(self, done: subprocess.CompletedProcess, busd_log: str) -> None:
        self.returncode = done.returncode
        self.stderr = done.stderr
        self.busd_log = busd_log
        self.outcome: dict[str, str] = {}
        self.output: dict[str, list[str]] = {}
        for line in done.stdout.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                self.stderr += line + "\n"
                continue
            test = event.get("Test")
            if not test:
                if event.get("Action") == "output":
                    self.stderr += event.get("Output", "")
                continue
            package = event["Package"].removeprefix("busd.dev/sdkgo").lstrip("/")
            name = f"{package}/{test}" if package else test
            if event["Action"] == "output":
                self.output.setdefault(name, []).append(event["Output"])
            elif event["Action"] in ("pass", "fail", "skip"):
                self.outcome[name] = event["Action"]

    def report(self, name: str) -> str:
        lines = [
            text
            for test, out in self.output.items()
            if test == name or test.startswith(name + "/")
            for text in out
        ]
        return "".join(lines) + self.stderr[-4000:]


@pytest.mark.parametrize("name", GO_TESTS)
def test_go_sdk_scenario(go_run, name):
    assert go_run.outcome.get(name) == "pass", go_run.report(name)


def test_go_tier_runs_every_test_listed(go_run):
    """`go test` passed as a whole, and ran exactly the tests listed here (a new Go test is
    listed, so that its outcome is reported)."""
    top = sorted(n for n in go_run.outcome if "/" not in n.removeprefix("quickstart/"))
    assert top == sorted(GO_TESTS), go_run.stderr[-4000:]
    assert go_run.returncode == 0, go_run.stderr[-4000:]


def test_quick_start_page_shows_the_program_the_tier_runs():
    """docs/quickstart.md's Go example is quickstart/main.go, verbatim."""
    page = (DOCS / "quickstart.md").read_text()
    blocks = re.findall(r"```go\n(.*?)```", page, re.S)
    assert blocks, "docs/quickstart.md has no Go example"
    assert (HERE / "quickstart" / "main.go").read_text() in blocks
