"""A peer broker for scripts/bench --peer rabbitmq: a RabbitMQ node of its own on loopback, so
the same client load can be measured against another broker the same way (CPU of its OS
processes from /proc, per message).

The node lives in a directory of the bench's (its Mnesia database, logs, config, Erlang cookie:
HOME points there), listens on 127.0.0.1 only, on free ports, with the AMQP 1.0 plugin enabled,
and has a durable classic queue declared at boot. Its epmd is started here too, on a port of
its own, so that nothing of a RabbitMQ or Erlang already running here is used or stopped. Every
process is stopped by PID.

RabbitMQ has no sessions: the bench's receivers are plain competing consumers of that queue.

Nothing here imports busd.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

# The script that runs the node itself: /usr/sbin/rabbitmq-server is a wrapper that, run as
# root, switches to the rabbitmq user and logs to /var/log/rabbitmq.
SERVERS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
QUEUE = "bench"
# /amq/queue/<name>: a queue that exists. (/queue/<name> would declare one, not durable, and
# durable messages in a queue that is not are not kept on disk.)
ADDRESS = f"/amq/queue/{QUEUE}"
STARTED = re.compile(r"Starting broker\.\.\. completed")
START_S = 90.0


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def descendants(root: int) -> list[int]:
    """`root` and every process below it (Linux /proc), root first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def guest_definitions() -> dict:
    """What the node loads at boot: the durable queue, and the guest user with its rights
    (a node that loads definitions at boot does not create guest itself)."""
    salt = os.urandom(4)  # rabbit_password_hashing_sha256: base64(salt + sha256(salt + pw))
    digest = base64.b64encode(salt + hashlib.sha256(salt + b"guest").digest()).decode()
    return {
        "users": [
            {
                "name": "guest",
                "password_hash": digest,
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"],
            }
        ],
        "vhosts": [{"name": "/"}],
        "permissions": [
            {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
        "queues": [
            {"name": QUEUE, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        ],
    }


class RabbitMQ:
    """A RabbitMQ node started here; stopped (SIGTERM to beam.smp, then whatever is left of
    what was started here, by PID) at the end."""

    name = "rabbitmq"
    cbs = False  # clients authenticate with SASL ANONYMOUS only (the default user, guest)
    # Its CPU includes the children its processes saw end: the node runs commands now and
    # then (e.g. the disk space check) that end between two samples.
    ended_children = True

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir  # the bench's (its client processes write there too)
        self.dir = workdir / "rabbitmq"
        self.log_path = self.dir / "node.log"  # its stdout and stderr; its own log is beside
        self.proc: subprocess.Popen | None = None  # the rabbitmq-server script
        self.epmd: subprocess.Popen | None = None
        self.port = 0
        self.version = "?"
        self.beam: int | None = None

    def start(self) -> None:
        server = next((s for s in SERVERS if os.access(s, os.X_OK)), None)
        epmd = shutil.which("epmd") or shutil.which("epmd", path="/usr/lib/erlang/bin")
        if server is None or epmd is None:
            raise SystemExit(
                "bench: --peer rabbitmq needs RabbitMQ installed (its rabbitmq-server at "
                f"{' or '.join(SERVERS)}, and Erlang's epmd): "
                f"{'rabbitmq-server' if server is None else 'epmd'} not found"
            )
        self.dir.mkdir(parents=True)
        self.port, dist_port, epmd_port = free_ports(3)
        defs = self.dir / "definitions.json"
        defs.write_text(json.dumps(guest_definitions()))
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "amqp1_0.default_user = guest\n"  # SASL ANONYMOUS acts as guest (from loopback)
            f"load_definitions = {defs}\n"
        )
        (self.dir / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's
        env = dict(
            os.environ,
            HOME=str(self.dir),  # the Erlang cookie
            RABBITMQ_NODENAME=f"bench{os.getpid()}@localhost",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),  # none
            RABBITMQ_CONF_ENV_FILE=str(self.dir / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_PORT=str(epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        # Our own epmd, in the foreground: the node finds it on ERL_EPMD_PORT and starts none.
        self.epmd = subprocess.Popen(
            [epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [server],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.dir,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            text = self.log_path.read_text(errors="replace")
            if STARTED.search(text) and self._listening():
                match = re.search(r"RabbitMQ (\d+\.\d+\.\d+)", text)
                self.version = match.group(1) if match else "?"
                self.beam = next(
                    (p for p in descendants(self.proc.pid) if command_name(p) == "beam.smp"),
                    None,
                )
                if self.beam is not None:
                    return
            time.sleep(0.2)
        log_text = self.log_path.read_text(errors="replace")[-3000:]
        code = self.proc.poll()
        self.stop()
        why = f"it exited ({code})" if code is not None else f"not ready in {START_S:.0f} s"
        raise SystemExit(f"bench: RabbitMQ did not start: {why}; its output:\n{log_text}")

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to beam.smp stops the node cleanly (Erlang runs init:stop); anything of
        ours still there after that is killed."""
        # Ours, taken while they run: after the node stops, a PID still running the same
        # program is one of them (children of beam.smp outlive it, reparented).
        started = (
            {pid: command_name(pid) for pid in descendants(self.proc.pid)} if self.proc else {}
        )
        if self.beam is not None and self.beam in started:
            try:
                os.kill(self.beam, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for pid, name in started.items():
            if pid != getattr(self.proc, "pid", None) and command_name(pid) == name:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in (self.proc, self.epmd):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.proc = self.epmd = None
        self.beam = None

    def pids(self) -> list[int]:
        """beam.smp and its children (erl_child_setup, inet_gethost, ...), running now."""
        return descendants(self.beam) if self.beam is not None else []

    def label(self, pid: int) -> str:
        return command_name(pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> str:
        return (
            f"RabbitMQ {self.version} (AMQP 1.0 plugin), beam.smp pid {self.beam}, port "
            f"{self.port}; a durable classic queue ({ADDRESS}), durable messages, plain "
            f"competing consumers (RabbitMQ has no sessions)"
        )
