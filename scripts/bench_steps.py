"""Store work per step for scripts/bench: which of a session load's store commands each step
of a message's life costs (send, hand-over, receive, settle, accept, release, renew, sweep).

INFO commandstats counts a script's inner commands under their own names, so it says what
the store ran but not for which call. The server's MONITOR stream does: it shows every
command, those a script runs marked `[<db> lua]`, right after (or, on some versions, before)
the script call that ran them. So scripts/bench runs the load a second time (the attribution
pass) against a fresh busd and store, with a process of its own per primary copying MONITOR
into a file, and afterwards gives each script call its inner commands. A call's step comes
from its script's name (EVALSHA: the hash of a script busd loads; FCALL: the function's name;
EVAL: the name its header opens with). MONITOR costs the store CPU of its own, so the pass's
times are not measured; its counts are the server's, whatever the scripts look like.

`python3 bench_steps.py copy HOST PORT OUT` is the copying process (the password, if any, in
BENCH_MONITOR_AUTH as "user:password"); it stops on SIGTERM.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT_RUNS = (b"eval", b"evalsha", b"eval_ro", b"evalsha_ro", b"fcall", b"fcall_ro")
# The steps of a session message's life, in the order they are printed; a script belongs to
# the first whose prefix its name starts with. A send that carried hand-over offers (to
# holders of its sessions waiting with credit) is the hand-over step: the send and the
# hand-over are one call.
STEPS = ("send", "hand-over", "receive", "settle", "accept", "release", "renew", "sweep")
PREFIXES = (
    ("send", "send"),
    ("receive", "receive"),
    ("settle", "settle"),
    ("accept", "accept"),
    ("release", "release"),
    ("renew", "renew"),
    ("sweep", "sweep"),
)
OTHER = "other"  # any other script
OUTSIDE = "not in a script"  # top-level commands that are no script run (publish, waitaof)
AUTH_ENV = "BENCH_MONITOR_AUTH"
LINE = re.compile(rb'^\+[\d.]+ \[\d+ ([^\]]*)\] "((?:[^"\\]|\\.)*)"(.*)$')
TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*)"')
HEADER_NAME = re.compile(rb"^(?:#!lua[^\\]*\\n)?--\[\[\\n\s*([A-Za-z]+)")
OFFERS_ARG = re.compile(r"ARGV\[c\+(\d+)\]\s+k: the number of hand-over offers")
PROBE_SCRIPT = "return redis.call('ping')"  # called with the start marker as its argument


def step_of(script: str) -> str:
    for prefix, step in PREFIXES:
        if script.startswith(prefix):
            return step
    return OTHER


@dataclass
class Scripts:
    """What busd loads: script name by SHA1, and where each script's hand-over offer count
    is among its arguments (the token's index in an EVALSHA with n keys is 2 + n + j)."""

    names: dict[bytes, str] = field(default_factory=dict)
    offers_argv: dict[str, int] = field(default_factory=dict)  # name -> j of ARGV[j]

    @classmethod
    def of_busd(cls) -> Scripts:
        """busd's scripts as its loader builds them (the code under test, on PYTHONPATH);
        none when it cannot be imported: then every call is named by its hash."""
        try:
            from busd.storage.redis.scripts import QUEUE_ARGC, load_sources
        except Exception:
            return cls()
        found = cls()
        for name, source in load_sources().items():
            found.names[hashlib.sha1(source.text.encode()).hexdigest().encode()] = name
            offers = OFFERS_ARG.search(source.text)
            if offers:
                found.offers_argv[name] = QUEUE_ARGC + int(offers.group(1))
        return found


@dataclass
class Step:
    calls: int = 0
    commands: Counter = field(default_factory=Counter)  # name -> count, the script run's too
    scripts: Counter = field(default_factory=Counter)  # script name -> calls


@dataclass
class Attribution:
    """The commands of the monitored stretch by step; `orphans`: inner commands no script call
    could be found for (none, unless MONITOR lines were lost)."""

    steps: dict[str, Step] = field(default_factory=dict)
    orphans: int = 0
    inner_first: bool = False  # the server shows a script's commands before its call

    def step(self, name: str) -> Step:
        return self.steps.setdefault(name, Step())

    @property
    def calls(self) -> int:
        return sum(s.calls for name, s in self.steps.items() if name != OUTSIDE)

    @property
    def commands(self) -> int:
        return sum(sum(s.commands.values()) for s in self.steps.values())


def classify(tokens: list[bytes], scripts: Scripts) -> tuple[str, str]:
    """(script name, step) of a top-level script run's tokens (command first)."""
    command = tokens[0].lower()
    target = tokens[1] if len(tokens) > 1 else b""
    if command.startswith(b"fcall"):
        # busd's functions are named <script>_<library version> (busd/storage/redis/scripts.py)
        name = re.sub(r"_[0-9a-f]{12}$", "", target.decode(errors="replace"))
    elif command.startswith(b"evalsha"):
        name = scripts.names.get(target.lower()) or f"sha {target[:8].decode(errors='replace')}"
    else:
        header = HEADER_NAME.match(target)
        name = header.group(1).decode() if header else "eval"
    step = step_of(name)
    j = scripts.offers_argv.get(name)
    if step == "send" and j is not None and command.startswith((b"evalsha", b"fcall")):
        try:
            index = 2 + int(tokens[2]) + j
            if int(tokens[index]) > 0:
                step = "hand-over"
        except (IndexError, ValueError):
            pass
    return name, step


def attribute(lines: list[bytes], scripts: Scripts, start: bytes, end: bytes) -> Attribution:
    """Give each script call in `lines` (one node's MONITOR) its inner commands, counting only
    what came between the probe script given `start` and the ECHO of `end`."""
    parsed = []
    for raw in lines:
        match = LINE.match(raw)
        if match:
            parsed.append((match.group(1) == b"lua", match.group(2).lower(), match.group(3)))
    # Where the probe's own inner command is, relative to its call, says the server's order.
    begin = next(
        (
            i
            for i, (lua, cmd, rest) in enumerate(parsed)
            if not lua and cmd == b"eval" and start in rest
        ),
        None,
    )
    stop = next(
        (
            i
            for i, (lua, cmd, rest) in enumerate(parsed)
            if not lua and cmd == b"echo" and end in rest
        ),
        len(parsed),
    )
    result = Attribution()
    if begin is None:
        return result
    result.inner_first = begin > 0 and parsed[begin - 1][0] and parsed[begin - 1][1] == b"ping"
    body = parsed[begin + 1 : stop]
    if not result.inner_first and body and body[0][0] and body[0][1] == b"ping":
        body = body[1:]  # the probe's own
    current: Step | None = None
    pending: Counter = Counter()
    for lua, command, rest in body:
        if lua:
            if result.inner_first:
                pending[command.decode(errors="replace")] += 1
            elif current is not None:
                current.commands[command.decode(errors="replace")] += 1
            else:
                result.orphans += 1
            continue
        if command not in SCRIPT_RUNS:
            current = None
            result.step(OUTSIDE).commands[command.decode(errors="replace")] += 1
            result.step(OUTSIDE).calls += 1
            continue
        tokens = [command, *TOKEN.findall(rest)]
        name, step_name = classify(tokens, scripts)
        current = result.step(step_name)
        current.calls += 1
        current.scripts[name] += 1
        current.commands[command.decode()] += 1
        if result.inner_first:
            current.commands.update(pending)
            pending = Counter()
    result.orphans += sum(pending.values())
    return result


def merge(parts: list[Attribution]) -> Attribution:
    total = Attribution()
    for part in parts:
        total.orphans += part.orphans
        total.inner_first = total.inner_first or part.inner_first
        for name, step in part.steps.items():
            mine = total.step(name)
            mine.calls += step.calls
            mine.commands.update(step.commands)
            mine.scripts.update(step.scripts)
    return total


class Monitor:
    """MONITOR on each primary of a store (`nodes`: bench_stores.Node), each copied to a file
    by a process of its own, from `start()` to `stop()`; `attribution()` then reads them."""

    def __init__(self, nodes: list, workdir: Path) -> None:
        self.nodes = [node for node in nodes if node.role == "primary"]
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.files: list[Path] = []
        token = uuid.uuid4().hex[:8]
        self.start_key = f"bench-steps-start-{token}".encode()
        self.end_marker = f"bench-steps-end-{token}".encode()

    def start(self, timeout: float = 10.0) -> None:
        for i, node in enumerate(self.nodes):
            kwargs = node.client.connection_pool.connection_kwargs
            out = self.workdir / f"monitor-{i}.txt"
            env = dict(os.environ)
            if kwargs.get("password"):
                env[AUTH_ENV] = f"{kwargs.get('username') or ''}:{kwargs['password']}"
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "copy",
                        str(kwargs.get("host", "127.0.0.1")),
                        str(kwargs.get("port", 6379)),
                        str(out),
                    ],
                    env=env,
                    start_new_session=True,
                )
            )
            self.files.append(out)
        for out, proc in zip(self.files, self.procs):
            if not wait_for(out, b"+OK", proc, timeout):
                self.stop()
                raise RuntimeError(f"MONITOR did not start ({out.name})")
        for node in self.nodes:
            node.client.eval(PROBE_SCRIPT, 0, self.start_key)

    def stop(self, timeout: float = 10.0) -> None:
        for node, out, proc in zip(self.nodes, self.files, self.procs):
            try:
                node.client.echo(self.end_marker)
            except Exception:
                continue
            wait_for(out, self.end_marker, proc, timeout)
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    def attribution(self, scripts: Scripts) -> Attribution:
        parts = []
        for out in self.files:
            lines = out.read_bytes().split(b"\r\n") if out.exists() else []
            parts.append(attribute(lines, scripts, self.start_key, self.end_marker))
        return merge(parts)


def wait_for(path: Path, marker: bytes, proc: subprocess.Popen, timeout: float) -> bool:
    """Until `marker` is in the last MB of `path` (False: timeout, or the process ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - (1 << 20)))
                if marker in f.read():
                    return True
        except OSError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def table(result: Attribution, messages: int) -> list[str]:
    """The per-step lines: calls and commands per message, commands per call, its scripts
    and its busiest commands per message."""
    n = max(messages, 1)
    lines = [
        f"  {'step':<16} {'calls/msg':>9} {'cmds/msg':>9} {'cmds/call':>9}  "
        "scripts; busiest commands per message (the script run itself included)"
    ]
    names = [*STEPS, *sorted(s for s in result.steps if s not in STEPS and s != OUTSIDE)]
    if OUTSIDE in result.steps:
        names.append(OUTSIDE)
    for name in names:
        step = result.steps.get(name, Step())
        commands = sum(step.commands.values())
        per_call = f"{commands / step.calls:.1f}" if step.calls else "-"
        scripts = ", ".join(f"{s} {c}" for s, c in step.scripts.most_common())
        if name == "hand-over" and scripts:
            scripts += " (with offers)"
        busiest = ", ".join(f"{c} {k / n:.2f}" for c, k in step.commands.most_common(7))
        more = len(step.commands) - 7
        if more > 0:
            rest = sum(k for _, k in step.commands.most_common()[7:])
            busiest += f", {more} more {rest / n:.2f}"
        text = "; ".join(t for t in (scripts, busiest) if t) or "did not run"
        lines.append(
            f"  {name:<16} {step.calls / n:>9.3f} {commands / n:>9.2f} {per_call:>9}  {text}"
        )
    lines.append(f"  {'all':<16} {result.calls / n:>9.3f} {result.commands / n:>9.2f}")
    return lines


def copy(host: str, port: int, out: Path) -> None:
    """MONITOR's stream into `out`, unbuffered, until SIGTERM or the server closes."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sock = socket.create_connection((host, port))
    auth = os.environ.get(AUTH_ENV)
    if auth:
        user, _, password = auth.partition(":")
        args = [b"AUTH", *([user.encode()] if user else []), password.encode()]
        sock.sendall(
            b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
        )
        reply = b""
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(4096)
        if not reply.startswith(b"+OK"):
            raise SystemExit(f"bench_steps: AUTH refused: {reply[:200]!r}")
    sock.sendall(b"MONITOR\r\n")
    with open(out, "wb", buffering=0) as f:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return
            f.write(data)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "copy":
        raise SystemExit("usage: bench_steps.py copy HOST PORT OUT")
    copy(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
