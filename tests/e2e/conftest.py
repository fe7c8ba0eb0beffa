"""End-to-end fixtures: real busd processes on real TCP over the session's real store.

`start_busd(queues)` writes an emulator-format Config.json, starts `python -m busd serve` on a
free port with a unique key prefix, waits for its banner and stops it by PID afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from busd.testing.broker import (  # the start banner's lines
    BANNER,
    CERT_BANNER,
    HTTP_BANNER,
    TLS_BANNER,
    WS_BANNER,
)


@dataclass
class BusdProcess:
    proc: subprocess.Popen
    port: int
    prefix: str
    log_path: Path
    lines: list[str] = field(default_factory=list)
    http_port: int | None = None  # None when started without an HTTP port
    tls_port: int | None = None  # AMQP over TLS
    ws_port: int | None = None  # AMQP over WebSockets (ws and wss)
    cert_path: str | None = None  # the certificate TLS clients must trust

    @property
    def http_url(self) -> str:
        assert self.http_port is not None, "this busd has no HTTP port"
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin_connection_string(self) -> str:
        """The emulator's management port (5300) as an administration client's string (they
        speak HTTPS); `connection_string`, the AMQP port's, serves them as well."""
        assert self.http_port is not None, "this busd has no HTTP port"
        return self.connection_string.replace(f":{self.port};", f":{self.http_port};")

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def queue(name: str, **props) -> dict:
    """One queue entry of an emulator Config.json; props use the emulator's property names."""
    defaults = {
        "DeadLetteringOnMessageExpiration": False,
        "DefaultMessageTimeToLive": "PT1H",
        "DuplicateDetectionHistoryTimeWindow": "PT20S",
        "ForwardDeadLetteredMessagesTo": "",
        "ForwardTo": "",
        "LockDuration": "PT1M",
        "MaxDeliveryCount": 10,
        "RequiresDuplicateDetection": False,
        "RequiresSession": False,
    }
    defaults.update(props)
    return {"Name": name, "Properties": defaults}


def subscription(name: str, rules: list[dict] | None = None, **props) -> dict:
    """One subscription entry of a topic in an emulator Config.json."""
    defaults = {
        "DeadLetteringOnMessageExpiration": False,
        "DefaultMessageTimeToLive": "PT1H",
        "LockDuration": "PT1M",
        "MaxDeliveryCount": 10,
        "ForwardDeadLetteredMessagesTo": "",
        "ForwardTo": "",
        "RequiresSession": False,
    }
    defaults.update(props)
    entry: dict = {"Name": name, "Properties": defaults}
    if rules is not None:
        entry["Rules"] = rules
    return entry


def topic(name: str, subscriptions: list[dict], **props) -> dict:
    """One topic entry of an emulator Config.json."""
    defaults = {
        "DefaultMessageTimeToLive": "PT1H",
        "DuplicateDetectionHistoryTimeWindow": "PT20S",
        "RequiresDuplicateDetection": False,
    }
    defaults.update(props)
    return {"Name": name, "Properties": defaults, "Subscriptions": subscriptions}


def write_config(path: Path, queues: list[dict], topics: list[dict] | None = None) -> Path:
    document = {
        "UserConfig": {
            "Namespaces": [{"Name": "sbemulatorns", "Queues": queues, "Topics": topics or []}],
            "Logging": {"Type": "File"},
        }
    }
    path.write_text(json.dumps(document, indent=2))
    return path


def serve_command(config: Path, *more: str) -> list[str]:
    """`busd serve` on 127.0.0.1, every port chosen by the system, with `config`."""
    return [
        sys.executable,
        "-m",
        "busd",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--http-port",
        "0",
        "--tls-port",
        "0",
        "--ws-port",
        "0",
        "--config",
        str(config),
        *more,
    ]


def launch_busd(
    redis_url: str | None,
    config: Path,
    workdir: Path,
    *,
    prefix: str | None = None,
    extra_env: dict | None = None,
    log_level: str = "info",
    data_dir: Path | None = None,
    command_prefix: list[str] | None = None,
) -> BusdProcess:
    """Start busd; with redis_url None it runs its embedded Valkey in `data_dir`.
    `command_prefix` runs it through another command that executes it in place (its PID is
    busd's), e.g. `ip netns exec NAME`."""
    prefix = prefix or f"e2e-{uuid.uuid4().hex[:10]}"
    log_path = workdir / f"busd-{uuid.uuid4().hex[:6]}.log"
    env = dict(os.environ)
    env.update(
        {
            "BUSD_KEY_PREFIX": prefix,
            "BUSD_SWEEP_INTERVAL": "0.2",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    cmd = [*(command_prefix or []), *serve_command(config, "--log-level", log_level)]
    if redis_url is not None:
        cmd += ["--redis-url", redis_url]
    else:
        cmd += ["--data-dir", str(data_dir or workdir / "data")]
    out = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        match = BANNER.search(text)
        if match and "connection string:" in text:  # the banner's last line: all of it is there
            http = HTTP_BANNER.search(text)
            tls = TLS_BANNER.search(text)
            ws = WS_BANNER.search(text)
            cert = CERT_BANNER.search(text)
            return BusdProcess(
                proc,
                int(match.group(1)),
                prefix,
                log_path,
                http_port=int(http.group(1)) if http else None,
                tls_port=int(tls.group(1)) if tls else None,
                ws_port=int(ws.group(1)) if ws else None,
                cert_path=cert.group(1) if cert else None,
            )
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"busd did not start:\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def busd_factory(redis_url, tmp_path_factory):
    """Start busd processes for a module; all are stopped at the module's end."""
    started: list[BusdProcess] = []
    workdir = tmp_path_factory.mktemp("busd")

    def start(
        queues: list[dict], *, embedded: bool = False, topics: list[dict] | None = None, **kwargs
    ) -> BusdProcess:
        config = write_config(workdir / f"config-{uuid.uuid4().hex[:6]}.json", queues, topics)
        proc = launch_busd(None if embedded else redis_url, config, workdir, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def own_redis_url():
    """A store of the module's own (a module takes it as its `redis_url`): Valkey's
    `INFO commandstats` then count that module's brokers alone."""
    from tests.conftest import start_valkey

    server = start_valkey()
    try:
        yield server.connection_url
    finally:
        server.stop()


def command_calls(store) -> dict[str, int]:
    """Valkey's calls per command so far (`cmdstat_<name>`), commands inside scripts included."""
    return {name: row["calls"] for name, row in store.info("commandstats").items()}


def cbs_refusal(error) -> tuple[int, str]:
    """The put-token answer behind the SDK's ServiceBusAuthenticationError (its own message is
    generic)."""
    inner = error.inner_exception
    description = inner.status_description
    if isinstance(description, bytes):
        description = description.decode()
    return inner.status_code, description


def receive(receiver, count: int, wait: float = 3, patience: float = 15) -> list:
    """Up to `count` messages from an SDK receiver, asking again until `patience` runs out
    (one receive_messages call may return fewer than are on their way)."""
    got: list = []
    deadline = time.monotonic() + patience
    while len(got) < count and time.monotonic() < deadline:
        got.extend(
            receiver.receive_messages(max_message_count=count - len(got), max_wait_time=wait)
        )
    return got


def amqp_header_over_tls(port: int, cert_path: str, header: bytes) -> bytes:
    """Send an AMQP protocol header over TLS (trusting busd's certificate) to 127.0.0.1:port;
    the first 8 bytes of the answer (busd's SASL layer answers with its own header)."""
    context = ssl.create_default_context(cafile=cert_path)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(header)
            return s.recv(8)


JS_DIR = Path(__file__).parent / "js"


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """The JavaScript SDK installed in tests/e2e/js (npm, once); skips where node or npm is
    missing (.ci/run installs them)."""
    npm = shutil.which("npm")
    if not (shutil.which("node") and npm):
        pytest.skip("needs node and npm (.ci/run installs them)")
    if not (JS_DIR / "node_modules" / "@azure" / "service-bus").is_dir():
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=JS_DIR,
            capture_output=True,
            text=True,
            timeout=280,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return JS_DIR / "node_modules"


def run_node(script: str, *args: str, cert_path: str | None) -> dict:
    """Run a node script of tests/e2e/js (trusting busd's certificate); the steps it printed,
    one JSON line `{"step", "value"}` each, by step. Fails unless it ends with `done`."""
    node = shutil.which("node")
    assert node, "needs node"
    env = dict(os.environ)
    if cert_path:
        env["NODE_EXTRA_CA_CERTS"] = str(cert_path)
    done = subprocess.run(
        [node, script, *args], cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    steps = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            steps[item["step"]] = item["value"]
    assert done.returncode == 0 and steps.get("done"), done.stdout + done.stderr
    return steps
