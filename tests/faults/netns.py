"""Hosts of the test's own for partitions: network namespaces joined by one bridge, with
nftables rules in each that drop what crosses a cut (both directions or one) or a share of it
(a flapping link).

Every host is a namespace named `<run>-<host>`, `<run>` unique to the run, with one veth link
to a bridge in the run's own switch namespace and an address of 10.77.0.0/24 that exists only
there; nothing of the machine's own network is touched, and nothing is sent outside these
namespaces. Processes are started in a host (`spawn`), and code that must talk from inside a
host (the load's clients, checks of a node) runs in a thread that entered it (`inside`).
`close` ends the run's processes by PID and deletes its namespaces, whatever failed before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PREFIX = "busdpt"
SUBNET = "10.77.0"
CLONE_NEWNET = 0x40000000
TABLE = "partition"


def _ip(*args: str, netns: str | None = None, stdin: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=20)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


def _nft(netns: str, script: str) -> None:
    _ip("netns", "exec", netns, "nft", "-f", "-", stdin=script)


def unavailable() -> str | None:
    """Why partitions cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (nftables, iproute2)"
    probe = f"{PREFIX}{os.getpid()}probe{secrets.token_hex(2)}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` is not permitted: {exc}"
    try:
        _nft(probe, f"add table inet {TABLE}\n")
    except RuntimeError as exc:
        return f"nftables does not work in a network namespace: {exc}"
    finally:
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", probe)
    return None


def _forget_dead_runs() -> None:
    """Delete the namespace names left by a run whose process is gone (killed before it could
    close its network): names only, so that they do not pile up."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    for line in listing.stdout.splitlines():
        name = line.split(" ", 1)[0]
        match = re.match(rf"{PREFIX}(\d+)x", name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ip("netns", "del", name)


class Network:
    """Hosts by name, each a namespace with one address on the run's bridge."""

    def __init__(self, hosts: list[str]) -> None:
        _forget_dead_runs()
        self.run = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.switch = f"{self.run}-sw"
        self.namespaces: list[str] = []
        self.addresses: dict[str, str] = {}
        self.processes: list[subprocess.Popen] = []
        try:
            self._add(self.switch)
            _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
            _ip("link", "set", "br0", "up", netns=self.switch)
            for i, host in enumerate(hosts):
                self._host(host, i)
        except BaseException:
            self.close()
            raise

    def netns(self, host: str) -> str:
        return f"{self.run}-{host}"

    def address(self, host: str) -> str:
        return self.addresses[host]

    # --- cuts ----------------------------------------------------------------------------------
    def cut(self, a: str, b: str, *, both: bool = True, loss_percent: int = 100) -> None:
        """Drop what `a` sends to `b` (and, `both`, what `b` sends to `a`), all of it or
        `loss_percent` of the packets at random. Dropped where it leaves its sender."""
        self._drop(a, b, loss_percent)
        if both:
            self._drop(b, a, loss_percent)

    def isolate(self, host: str, others: list[str], *, both: bool = True) -> None:
        for other in others:
            self.cut(host, other, both=both)

    def heal(self) -> None:
        """Every cut of the run undone."""
        for host in self.addresses:
            _nft(self.netns(host), f"flush chain inet {TABLE} out\n")

    def _drop(self, sender: str, receiver: str, loss_percent: int) -> None:
        match = f"ip daddr {self.address(receiver)}"
        if loss_percent < 100:
            match += f" numgen random mod 100 < {loss_percent}"
        _nft(self.netns(sender), f"add rule inet {TABLE} out {match} drop\n")

    # --- processes -----------------------------------------------------------------------------
    def spawn(self, host: str, argv: list[str], log: Path, **kwargs: Any) -> subprocess.Popen:
        """`argv` run in `host` (`ip netns exec` executes it in place: the PID is its own)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns(host), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                **kwargs,
            )
        self.processes.append(proc)
        return proc

    def inside(self, host: str, fn: Callable[[], T]) -> T:
        """`fn()` run in a thread that entered `host`'s network namespace: the sockets it
        opens are that host's (127.0.0.1 is the host's own loopback)."""
        outcome: list[Any] = []

        def enter_and_run() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/var/run/netns/{self.netns(host)}", os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns failed")
                finally:
                    os.close(fd)
                outcome.append((True, fn()))
            except BaseException as exc:  # handed to the caller
                outcome.append((False, exc))

        thread = threading.Thread(target=enter_and_run, name=f"netns-{host}")
        thread.start()
        thread.join()
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    # --- setting up and down -------------------------------------------------------------------
    def _add(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("link", "set", "lo", "up", netns=name)

    def _host(self, host: str, index: int) -> None:
        name = self.netns(host)
        self._add(name)
        port = f"p{index}"
        _ip(
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            name,
            netns=self.switch,
        )
        _ip("link", "set", port, "master", "br0", "up", netns=self.switch)
        address = f"{SUBNET}.{index + 1}"
        _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=name)
        _ip("link", "set", "eth0", "up", netns=name)
        _nft(
            name,
            f"add table inet {TABLE}\n"
            f"add chain inet {TABLE} out {{ type filter hook output priority 0 ; }}\n",
        )
        self.addresses[host] = address

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)  # a paused one ends too
                    proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        self.processes.clear()
        for name in reversed(self.namespaces):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ip("netns", "del", name)
        self.namespaces.clear()
