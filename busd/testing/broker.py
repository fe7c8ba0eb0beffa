"""A real busd for a test run: `BusdBroker` starts `python -m busd serve` as a child process on
free loopback ports, with its embedded Valkey in a directory of its own (or over a Redis/Valkey
the caller names, under a key prefix of its own), and stops it again.

The standard library only, and nothing of the broker: a test process imports this module and
pays for the broker in the child.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from busd.auth.sas import DEFAULT_SAS_KEY, DEFAULT_SAS_KEY_NAME

if TYPE_CHECKING:
    from busd.testing.faults import Faults
    from busd.testing.management import Management

DEFAULT_KEY = (DEFAULT_SAS_KEY_NAME, DEFAULT_SAS_KEY)
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

# The start banner's lines (busd/server/lifecycle.py `Server.banner`): the ports bound with port 0.
BANNER = re.compile(r"listening on amqp://[^:]+:(\d+)")
HTTP_BANNER = re.compile(r"http:\s+http://[^\s/]+:(\d+)/health")
TLS_BANNER = re.compile(r"amqps:\s+amqps://[^:]+:(\d+)")
WS_BANNER = re.compile(r"ws:\s+ws://[^:]+:(\d+)/")
CERT_BANNER = re.compile(r"certificate: (\S+)")
# The banner's last line: once it is there, all of the banner is.
BANNER_END = re.compile(r"^\s*connection string: ", re.M)


class BusdStartError(RuntimeError):
    """busd did not come up; the message holds its output."""


def connection_string(
    port: int, key: tuple[str, str] = DEFAULT_KEY, host: str = "localhost", emulator: bool = True
) -> str:
    """A Service Bus connection string for busd on `port` (`emulator`: plain AMQP, no TLS)."""
    flag = "UseDevelopmentEmulator=true;" if emulator else ""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key[0]};SharedAccessKey={key[1]};{flag}"
    )


def delete_prefix(url: str, prefix: str) -> None:
    """Remove every key a broker with this key prefix wrote to the store at `url` (keys are
    `{<prefix>:<queue>}:...`, and the catalog's `<prefix>:...`)."""
    import redis  # busd's own dependency; only needed for a store the caller named

    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match="{" + prefix + ":*", count=1000))
        batch += list(client.scan_iter(match=prefix + ":*", count=1000))
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


class BusdBroker:
    """One busd process for tests, on free loopback ports.

        with BusdBroker() as broker:                  # embedded Valkey in a temporary directory
            client = ServiceBusClient.from_connection_string(broker.connection_string)

    `config`: an emulator Config.json to seed the entities from. `redis_url`: a Redis/Valkey to
    keep the state in instead of the embedded one; the broker then gets a key prefix of its
    own (`key_prefix`), and its keys are deleted at stop (`keep_data=True` keeps them, and the
    data directory). `args`: more `busd serve` options; `env`: more environment for the child
    (busd's own BUSD_* variables of this process are not passed on: the broker is the one
    asked for, whatever the shell says). `faults`: faults on demand on (`--faults`, what
    `faults`, `inject_fault` and the lock-losing calls need; docs/faults.md)."""

    def __init__(
        self,
        *,
        config: str | os.PathLike[str] | None = None,
        redis_url: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        key_prefix: str | None = None,
        key: tuple[str, str] = DEFAULT_KEY,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        keep_data: bool = False,
        faults: bool = True,
        startup_timeout: float = STARTUP_TIMEOUT_S,
        python: str = sys.executable,
    ) -> None:
        self.config = Path(config).resolve() if config is not None else None
        self.redis_url = redis_url
        self.key_prefix = key_prefix or f"busd-test-{uuid.uuid4().hex[:10]}"
        self.key = key
        self.args = list(args)
        self.env = dict(env or {})
        self.keep_data = keep_data
        self.faults_on = faults
        self.startup_timeout = startup_timeout
        self.python = python
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.port = self.http_port = 0
        self.tls_port: int | None = None
        self.ws_port: int | None = None
        self.cert_path: str | None = None

    # --- what a test connects with -------------------------------------------------------

    @property
    def connection_string(self) -> str:
        """For the SDKs' clients (AMQP, with the emulator flag)."""
        return connection_string(self._started(self.port), self.key)

    @property
    def admin_connection_string(self) -> str:
        """For the SDKs' administration clients: the HTTP port, where the management API is
        (the Python and JavaScript ones speak HTTPS there: trust `cert_path`)."""
        return connection_string(self._started(self.http_port), self.key)

    @property
    def tls_connection_string(self) -> str:
        """For AMQP over TLS (no emulator flag; the SDKs need `custom_endpoint_address` for a
        port other than 5671, and `connection_verify=cert_path`)."""
        assert self.tls_port is not None, "started without a TLS port"
        return connection_string(self.tls_port, self.key, emulator=False)

    @property
    def http_url(self) -> str:
        """The HTTP port: /health, /metrics, /admin, the management API, the dashboard."""
        return f"http://127.0.0.1:{self._started(self.http_port)}"

    @property
    def management(self) -> Management:
        """Create and delete entities over the management API (busd.testing.management)."""
        from busd.testing.management import Management

        return Management(self.http_url, self.key)

    @property
    def faults(self) -> Faults:
        """Faults on demand over the admin API (busd.testing.faults, docs/faults.md)."""
        from busd.testing.faults import Faults

        return Faults(self.http_url, self.key)

    def inject_fault(self, kind: str, entity: str, **options: object) -> dict:
        """Set a fault on `entity` now (busd.testing.faults.Faults.inject): e.g.
        `inject_fault("server-busy", "orders", operations=["send"], count=2)`."""
        return self.faults.inject(kind, entity, **options)

    def lose_session_lock(self, queue: str, session_id: str) -> bool:
        """End the lock on a session of `queue` now, as its expiry would: its holder's next
        settle or renewal raises SessionLockLostError. False when nobody held it."""
        return bool(self.faults.inject("session-lock-lost", queue, session=session_id)["released"])

    def lose_message_locks(self, entity: str) -> None:
        """End the message locks receivers of `entity` hold now: their next settle raises
        MessageLockLostError, the messages come back with their delivery count raised."""
        self.faults.inject("message-lock-lost", entity)

    def _started(self, port: int) -> int:
        if not port:
            raise RuntimeError("busd is not started: call start() or use `with`")
        return port

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> BusdBroker:
        if self.proc is not None:
            return self
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="busd-test-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"busd-{self.key_prefix}.log"
        cmd = [
            self.python,
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
            "--data-dir",
            str(self.data_dir),
            "--key-prefix",
            self.key_prefix,
            "--sas-key",
            f"{self.key[0]}={self.key[1]}",
        ]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        if self.redis_url:
            cmd += ["--redis-url", self.redis_url]
        if self.faults_on:
            cmd.append("--faults")
        cmd += self.args
        env = {k: v for k, v in os.environ.items() if not k.startswith("BUSD_")}
        env.update({"PYTHONUNBUFFERED": "1", **self.env})
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.data_dir
            )
        try:
            self._wait_for_banner()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_banner(self) -> None:
        assert self.proc is not None and self.log_path is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = self.log_text()
            amqp = BANNER.search(text)
            if amqp and BANNER_END.search(text):
                http, tls = HTTP_BANNER.search(text), TLS_BANNER.search(text)
                ws, cert = WS_BANNER.search(text), CERT_BANNER.search(text)
                self.port = int(amqp.group(1))
                self.http_port = int(http.group(1)) if http else 0
                self.tls_port = int(tls.group(1)) if tls else None
                self.ws_port = int(ws.group(1)) if ws else None
                self.cert_path = cert.group(1) if cert else None
                return
            if self.proc.poll() is not None:
                raise BusdStartError(f"busd exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        raise BusdStartError(
            f"busd did not start within {self.startup_timeout} s:\n{self.log_text()}"
        )

    def log_text(self) -> str:
        """What busd printed so far (its banner, then its log)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop busd (SIGTERM: it closes its clients and stops its embedded Valkey), then
        remove what it kept unless `keep_data`."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.port = self.http_port = 0
        if self.keep_data:
            return
        if self.redis_url:
            delete_prefix(self.redis_url, self.key_prefix)
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> BusdBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
