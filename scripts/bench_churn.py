"""Session churn for scripts/bench: the load a Service Bus session processor puts on a broker,
and the checks that what its receivers saw was correct.

Receiver loops run in client processes of their own (`python3 bench_churn.py worker`), several
links per connection, several connections per process. Each loop attaches a next-available
session receiver (source filter `com.microsoft:session-filter` = null, link property
`com.microsoft:timeout`), completes every message the moment it arrives (settled `accepted`:
the client settles first), closes the link once no message came for `idle_ms` and at once
attaches for the next session. A refusal with `com.microsoft:timeout` (no session free) just
attaches again. A steady run (`scripts/bench --mode steady`) runs the same loops; its messages
carry the time they were sent (`stamp`) and each delivery's send-to-delivery latency is kept.
Against a broker without sessions (`sessions` false: scripts/bench --peer) each loop is a plain
consumer of the queue instead: it attaches once and takes whatever comes, completing it.

The parent (`Clients`) talks to each worker over its pipes: a config line, then `go`, then
`stop` on stdin; progress lines (JSON) on stdout; at the end the worker writes every event it
recorded to a file. Times are time.monotonic(), one clock for every process on Linux, so the
parent merges the events of all workers and `check` looks for violations: order, a delivery
after the message was completed, a message never completed, two holders of one session.

Nothing here imports busd.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_clients as bc  # noqa: E402
from proton import Delivery, Endpoint, Handler, Link, Message, Terminus, uint  # noqa: E402
from proton.reactor import Container, Filter  # noqa: E402

# Where a message says which session it belongs to and its index there: "<marker><sid>/<i>;"
# at the start of its body, found in the raw payload without decoding the message. A steady
# run's messages hold "<marker><sid>/<i>@<send time>;", the time written as the message goes
# out (time.monotonic_ns(): one clock for every process here), over a placeholder of the same
# length, so the pre-encoded message stays valid.
MARKER = b"\x00churn:"
STAMP = b"@" + b"0" * 19
TIMEOUT_CONDITION = "com.microsoft:timeout"
TICK_S = 0.05  # how often a worker reads its orders and reports progress
EXAMPLES = 3  # violations described per kind


# --- what is sent --------------------------------------------------------------------------------
def parse_range(text: str) -> tuple[int, int]:
    """`--per-session`: "3" (exactly 3) or "1-5" (1 to 5)."""
    lo, _, hi = text.partition("-")
    low, high = int(lo), int(hi or lo)
    if low < 1 or high < low:
        raise ValueError(f"bad range {text!r}: want N or LOW-HIGH with 1 <= LOW <= HIGH")
    return low, high


def make_plan(sessions: int, messages: int, per_session: str | None, seed: int) -> dict[str, int]:
    """Session id -> how many messages it gets: `messages` spread evenly, or a seeded random
    count in the `per_session` range for each session (then `messages` is not used)."""
    ids = [f"s{i:06d}" for i in range(sessions)]
    if per_session is None:
        counts = [
            messages // sessions + (1 if i < messages % sessions else 0) for i in range(sessions)
        ]
    else:
        low, high = parse_range(per_session)
        rng = random.Random(seed)
        counts = [rng.randint(low, high) for _ in ids]
    return {sid: n for sid, n in zip(ids, counts) if n}


def encode(sid: str, index: int, body_size: int, stamped: bool = False) -> bytes:
    head = MARKER + f"{sid}/{index}".encode() + (STAMP if stamped else b"") + b";"
    body = head + b"x" * max(0, body_size - len(head))
    return Message(body=body, group_id=sid, durable=True).encode()


def parse(payload: bytes) -> tuple[str, int] | None:
    at = payload.find(MARKER)
    end = payload.find(b";", at)
    if at < 0 or end < 0:
        return None
    sid, _, index = payload[at + len(MARKER) : end].partition(b"/")
    try:
        return sid.decode(), int(index.partition(b"@")[0])
    except ValueError:
        return None


def stamp(payload: bytes) -> bytes:
    """`payload` (encoded with stamped=True) with the time now written into it."""
    return payload.replace(STAMP, b"@%019d" % time.monotonic_ns(), 1)


def sent_at(payload: bytes) -> float | None:
    """The time.monotonic() `stamp` wrote into the payload (None: not a stamped message)."""
    at = payload.find(b"@", payload.find(MARKER))
    digits = payload[at + 1 : at + len(STAMP)]
    if at < 0 or not digits.isdigit() or not int(digits):
        return None
    return int(digits) / 1e9


def sender_payloads(
    plan: dict[str, int], body_size: int, senders: int, stamped: bool = False, burst: int = 1
) -> list[list[bytes]]:
    """One list per sender connection. A session is sent by one sender only, its messages in
    index order, so the order the broker stores them in is the order they are checked in;
    each sender goes round its sessions (first messages first), as many producers would,
    `burst` messages of a session in a row before the next session (more than one: at a
    steady rate a session is quiet between its bursts, long enough for its receiver to let
    it go and take the next). `stamped`: with room for the send time (`stamp`)."""
    shares: list[list[str]] = [[] for _ in range(senders)]
    for k, sid in enumerate(plan):
        shares[k % senders].append(sid)
    out = []
    for sids in shares:
        payloads = []
        for start in range(0, max((plan[s] for s in sids), default=0), burst):
            for s in sids:
                payloads.extend(
                    encode(s, index, body_size, stamped)
                    for index in range(start, min(start + burst, plan[s]))
                )
        out.append(payloads)
    return [p for p in out if p]


# --- the worker: receiver loops in one client process ------------------------------------------
class Recorder:
    """Everything one worker saw, in the shape the parent merges."""

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.links = 0
        self.deliveries: list[tuple[float, int, str, int]] = []  # (t, link, sid, index)
        self.intervals: list[list] = []  # [link, sid, t answered, t let go], per held session
        self.latencies: list[float] = []  # attach sent -> answered with a session, seconds
        # answered -> its first message: longer than idle_ms and the receiver lets go first
        self.first_latencies: list[float] = []
        self.delivery_latencies: list[float] = []  # stamped send -> delivered here, seconds
        # the same for the first message of each held session: its receiver was waiting
        self.first_delivery_latencies: list[float] = []
        self.accept_timeouts = 0
        self.late = 0  # arrived on a link already closed here: not taken, the broker releases it
        self.errors = 0
        self.error_texts: list[str] = []
        self.done: set[tuple[str, int]] = set()
        self.new_done: list[tuple[str, int]] = []
        self.last_done_t = 0.0

    def link_number(self) -> int:
        self.links += 1
        return self.worker * 100_000_000 + self.links  # unique over every worker

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_texts) < 5:
            self.error_texts.append(text)

    def completed(self, key: tuple[str, int], t: float) -> None:
        if key not in self.done:
            self.done.add(key)
            self.new_done.append(key)
            self.last_done_t = t

    def dump(self) -> dict:
        return {
            "deliveries": self.deliveries,
            "intervals": self.intervals,
            "latencies": self.latencies,
            "first_latencies": self.first_latencies,
            "delivery_latencies": self.delivery_latencies,
            "first_delivery_latencies": self.first_delivery_latencies,
            "accept_timeouts": self.accept_timeouts,
            "late": self.late,
            "errors": self.errors,
            "error_texts": self.error_texts,
            "attaches": self.links,
        }


class Loop(Handler):
    """One receiver loop of a processor: take the next session, complete what comes, let it go
    after `idle_ms` without a message, take the next."""

    def __init__(self, conn: ChurnConnection, cfg: dict) -> None:
        super().__init__()
        self.conn = conn
        self.rec: Recorder = conn.rec
        self.window = cfg["window"]
        self.idle_s = cfg["idle_ms"] / 1000
        self.timeout_ms = cfg["timeout_ms"]
        self.sessions = cfg["sessions"]
        self.link = None  # the current link, None between a refusal and the next attach
        self.number = 0
        self.interval: list | None = None  # while a session is held
        self.sent_at = 0.0
        self.last = 0.0
        self.got = 0  # messages on the current link
        self.timer = None
        self.stopped = False

    def attach(self) -> None:
        if self.stopped or self.conn.closed:
            return
        self.number = self.rec.link_number()
        self.sent_at = time.monotonic()
        # settled accepted from the client, nothing answered: the processor's mode
        options = [bc.Settle(Link.SND_UNSETTLED, Link.RCV_FIRST)]
        if self.sessions:
            options += [
                Filter({bc.SESSION_FILTER: None}),
                bc.Properties({bc.TIMEOUT: uint(self.timeout_ms)}),
            ]
        self.link = self.conn.container.create_receiver(
            self.conn.conn,
            self.conn.entity,
            name=f"churn-{self.number}-{os.urandom(4).hex()}",
            options=options,
        )
        self.conn.loops[self.link.name] = self

    def opened(self, link) -> None:
        if link != self.link or link.remote_source.type == Terminus.UNSPECIFIED:
            return  # refused: the detach with the reason follows
        now = time.monotonic()
        self.rec.latencies.append(now - self.sent_at)
        data = link.remote_source.filter
        data.rewind()
        filters = data.get_object() if data.next() is not None else {}
        sid = filters.get(bc.SESSION_FILTER)
        self.interval = [self.number, sid, now, None]
        self.rec.intervals.append(self.interval)
        self.last = now
        self.got = 0
        link.flow(self.window)
        if self.sessions:  # a plain consumer keeps its link
            self.timer = self.conn.container.schedule(self.idle_s, self)

    def transfer(self, delivery) -> None:
        link = delivery.link
        payload = link.recv(delivery.pending)
        link.advance()
        if link != self.link or self.interval is None:
            self.rec.late += 1  # not ours any more: left unsettled, released with the session
            return
        now = time.monotonic()
        if self.got == 0:
            self.rec.first_latencies.append(now - self.interval[2])
        self.got += 1
        self.last = now
        key = parse(payload)
        if key is None:
            self.rec.error(f"a message without a churn marker on {link.name}")
        else:
            self.rec.deliveries.append((now, self.number, key[0], key[1]))
        sent = sent_at(payload)
        if sent is not None:
            self.rec.delivery_latencies.append(now - sent)
            if self.got == 1:
                self.rec.first_delivery_latencies.append(now - sent)
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()  # first: the disposition goes out settled
        if key is not None:
            self.rec.completed(key, now)
        if link.credit <= self.window // 2:
            link.flow(self.window - link.credit)

    def on_timer_task(self, event) -> None:
        self.timer = None
        if self.interval is None or self.link is None:
            return
        idle = time.monotonic() - self.last
        if idle < self.idle_s:
            self.timer = self.conn.container.schedule(self.idle_s - idle, self)
            return
        self.let_go()
        self.attach()  # the next session at once, as a processor does

    def let_go(self) -> None:
        """Close the link (detach closed=true): the session is free for another receiver."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.interval is not None:
            self.interval[3] = time.monotonic()  # from here on another receiver may hold it
            self.interval = None
        if self.link is not None:
            self.link.close()
            self.link = None

    def detached(self, link, condition) -> None:
        """The broker detached `link`: a refused attach, or it ended a session we held."""
        if link != self.link:
            return  # the answer to a close of ours
        if self.interval is not None:
            # Ended by the broker: it let go some time before we heard of it, so all we know
            # for sure is that we held the session until our last delivery.
            self.interval[3] = max(self.interval[2], self.last)
            self.interval = None
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
        self.link = None
        if condition is not None and condition.name == TIMEOUT_CONDITION:
            self.rec.accept_timeouts += 1
            self.attach()
            return
        self.rec.error(f"session link detached: {condition}")
        # An error may repeat at once (e.g. the store refusing): do not spin on it.
        self.conn.container.schedule(0.1, _Later(self.attach))

    def waiting(self) -> bool:
        """Ready for what is sent: a session receiver's attach is out, not answered yet (it
        waits for a session); a plain consumer is attached, its credit given."""
        if self.sessions:
            return self.link is not None and self.interval is None
        return self.interval is not None

    def stop(self, now: float) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.interval is not None:
            self.interval[3] = now
            self.interval = None


class _Later(Handler):
    def __init__(self, call) -> None:
        super().__init__()
        self.call = call

    def on_timer_task(self, event) -> None:
        self.call()


class ChurnConnection(bc.Client):
    """One connection carrying `count` receiver loops."""

    def __init__(self, worker: Worker, count: int) -> None:
        self.rec = worker.rec
        self.worker = worker
        self.loops: dict[str, Loop] = {}  # link name -> its loop (until the link is gone)
        self.members: list[Loop] = []
        self.ready = False
        cfg = worker.cfg
        target = bc.Target(cfg["host"], cfg["port"], cfg["key_name"], cfg["key"], cfg["cbs"])
        super().__init__(
            worker.container, target, cfg["entity"], bc.Stats(expected=1 << 62), worker
        )
        self.members = [Loop(self, cfg) for _ in range(count)]

    def start(self) -> None:  # authenticated
        self.ready = True

    def begin(self) -> None:
        for loop in self.members:
            loop.attach()

    def on_link_remote_open(self, event) -> None:
        loop = self.loops.get(event.link.name)
        if loop is not None:
            loop.opened(event.link)

    def on_transfer(self, delivery) -> None:
        loop = self.loops.get(delivery.link.name)
        if loop is not None:
            loop.transfer(delivery)
        else:
            delivery.link.recv(delivery.pending)
            delivery.link.advance()

    def on_detached(self, link, condition) -> None:
        loop = self.loops.pop(link.name, None)
        if loop is not None:
            loop.detached(link, condition)

    def on_link_remote_detach(self, event) -> None:
        self.on_link_remote_close(event)

    def fail(self, text: str) -> None:
        # The connection is gone (its loops with it); the others carry on, and the phase
        # fails on the error count (and on whatever this leaves undone).
        self.rec.error(text)
        now = time.monotonic()
        for loop in self.members:
            loop.stop(now)
        self.finish()

    def stop(self, now: float) -> None:
        for loop in self.members:
            loop.stop(now)
        self.finish()


class Worker(Handler):
    """One client process: its connections and loops, orders from stdin, progress to stdout."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        self.rec = Recorder(cfg["index"])
        self.container = Container()
        self.conns: list[ChurnConnection] = []
        self.go = self.stopping = self.started = False
        self.reported: tuple | None = None
        self.stopped_at: float | None = None

    def client_done(self, client) -> None:  # bc.Client's phase callback
        pass

    def run(self) -> None:
        threading.Thread(target=self._orders, daemon=True).start()
        self.conns = [ChurnConnection(self, n) for n in self.cfg["loops"]]
        self.container.schedule(TICK_S, self)
        self.container.run()

    def _orders(self) -> None:
        for line in sys.stdin:
            order = line.strip()
            if order == "go":
                self.go = True
            elif order == "stop":
                break
        self.stopping = True  # "stop", or the parent is gone

    def on_timer_task(self, event) -> None:
        now = time.monotonic()
        if self.stopped_at is not None:  # closing: wait a little for the broker's answers
            answered = all(
                c.conn.state & Endpoint.REMOTE_CLOSED or c.conn.transport is None
                for c in self.conns
            )
            if answered or now - self.stopped_at > 2.0:
                self.container.stop()
                return
        elif self.stopping or now >= self.cfg["deadline"]:
            self.stopped_at = now
            for conn in self.conns:
                conn.stop(now)
        elif self.go and not self.started:
            self.started = True
            for conn in self.conns:
                if not conn.closed:
                    conn.begin()
        self._report()
        self.container.schedule(TICK_S, self)

    def _report(self) -> None:
        ready = all(c.ready or c.closed for c in self.conns)
        # The idle and steady scenarios wait for every receiver to be waiting.
        waiting = sum(1 for c in self.conns for loop in c.members if loop.waiting())
        state = (ready, waiting, self.rec.errors)
        if self.rec.new_done or state != self.reported:
            self.reported = state
            line = {
                "ready": ready,
                "done": self.rec.new_done,
                "t": self.rec.last_done_t,
                "errors": self.rec.errors,
                "waiting": waiting,
            }
            self.rec.new_done = []
            print(json.dumps(line), flush=True)


def worker_main() -> int:
    cfg = json.loads(sys.stdin.readline())
    worker = Worker(cfg)
    try:
        worker.run()
    finally:
        Path(cfg["out"]).write_text(json.dumps(worker.rec.dump()))
    return 0


# --- the parent: start the workers, follow them, stop them ---------------------------------------
class Clients:
    """The client processes of one phase, started here and stopped by PID."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        target: bc.Target,
        entity: str,
        *,
        receivers: int,
        procs: int,
        per_connection: int,
        window: int,
        idle_ms: int,
        timeout_ms: int,
        plan: dict[str, int],
        deadline: float,
        sessions: bool = True,
        command: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        # what runs a worker: this script's, or another client speaking its protocol (the Go
        # load generator, scripts/loadgen)
        self.command = command or [sys.executable, str(Path(__file__).resolve()), "worker"]
        self.name = name
        self.target = target
        self.entity = entity
        self.plan = plan
        self.deadline = deadline
        self.settings = {
            "window": window,
            "idle_ms": idle_ms,
            "timeout_ms": timeout_ms,
            "sessions": sessions,
        }
        self.shares = [n for n in split(receivers, min(procs, receivers)) if n]
        self.per_connection = per_connection
        self.procs: list[subprocess.Popen] = []
        self.outs: list[Path] = []
        self.lock = threading.Condition()
        self.done: set[tuple[str, int]] = set()
        self.last_done_t = 0.0
        self.ready: dict[int, bool] = {}
        self.waiting: dict[int, int] = {}
        self.errors: dict[int, int] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i, share in enumerate(self.shares):
            out = self.workdir / f"{self.name}-worker{i}.json"
            cfg = dict(
                self.settings,
                index=i + 1,
                host=self.target.host,
                port=self.target.port,
                key_name=self.target.key_name,
                key=self.target.key,
                cbs=self.target.cbs,
                entity=self.entity,
                loops=[n for n in split(share, -(-share // self.per_connection)) if n],
                deadline=self.deadline,
                out=str(out),
            )
            with open(self.workdir / f"{self.name}-worker{i}.log", "wb") as log:
                proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    bufsize=1,
                )
            proc.stdin.write(json.dumps(cfg) + "\n")
            proc.stdin.flush()
            self.procs.append(proc)
            self.outs.append(out)
            thread = threading.Thread(target=self._follow, args=(i, proc), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _follow(self, i: int, proc: subprocess.Popen) -> None:
        """Read a worker's progress as it comes (a full pipe would stall it)."""
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                for sid, index in msg["done"]:
                    if 0 <= index < self.plan.get(sid, 0):
                        self.done.add((sid, index))
                self.last_done_t = max(self.last_done_t, msg["t"])
                self.ready[i] = msg["ready"]
                self.waiting[i] = msg["waiting"]
                self.errors[i] = msg["errors"]
                self.lock.notify_all()
        with self.lock:
            self.lock.notify_all()

    def _wait(self, until, deadline: float, *, every_process: bool = False) -> bool:
        """Wait for `until()` while the workers live (`every_process`: all of them, else at
        least one) and the deadline is not past."""
        gone = any if every_process else all
        with self.lock:
            while not until():
                left = deadline - time.monotonic()
                if left <= 0 or gone(p.poll() is not None for p in self.procs):
                    return until()
                self.lock.wait(min(left, 0.2))
            return True

    def wait_ready(self) -> bool:
        """Every connection of every worker open and authenticated."""
        return self._wait(
            lambda: len(self.ready) == len(self.procs) and all(self.ready.values()),
            min(self.deadline, time.monotonic() + 60),
            every_process=True,
        )

    def wait_waiting(self, receivers: int, deadline: float) -> bool:
        return self._wait(lambda: sum(self.waiting.values()) >= receivers, deadline)

    def wait_done(self, expected: int, until: float) -> bool:
        return self._wait(lambda: len(self.done) >= expected, min(until, self.deadline))

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def order(self, word: str) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write(word + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # that worker is gone; its log says why

    def stop(self) -> list[dict]:
        """Stop every worker (stdin closed: they close their connections and write their
        events), kill by PID any that does not stop, and return what each recorded."""
        self.order("stop")
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=15)  # they stop within a few seconds of the order
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for thread in self._threads:
            thread.join(timeout=5)
        results = []
        for i, out in enumerate(self.outs):
            try:
                results.append(json.loads(out.read_text()))
            except (OSError, ValueError):
                log = self.workdir / f"{self.name}-worker{i}.log"
                tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
                results.append(
                    {
                        "errors": 1,
                        "error_texts": [
                            f"client process {i} wrote no events "
                            f"(exit {self.procs[i].returncode}): {tail.strip()}"
                        ],
                    }
                )
        return results


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(max(1, parts))]


# --- the checks ---------------------------------------------------------------------------------
@dataclass
class Verdict:
    # a message first delivered before the one ahead of it, or out of order on a link
    order: int = 0
    after_complete: int = 0  # a delivery of a message some receiver had already completed
    lost: int = 0  # sent, never completed
    two_holders: int = 0  # two receivers holding one session at the same time
    wrong_session: int = 0  # delivered on a link holding another session, or not sent by us
    deliveries: int = 0
    completed: int = 0
    sessions_accepted: int = 0
    accept_timeouts: int = 0
    late: int = 0
    attaches: int = 0
    sessions: bool = True  # False: plain consumers, no order or holders to check
    errors: int = 0
    error_texts: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    first_latencies: list[float] = field(default_factory=list)
    delivery_latencies: list[float] = field(default_factory=list)
    first_delivery_latencies: list[float] = field(default_factory=list)
    # (session, index) -> when it was first delivered (and completed)
    first_delivered: dict[tuple[str, int], float] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.order + self.after_complete + self.lost + self.two_holders + self.wrong_session

    def summary(self) -> str:
        if not self.sessions:
            return (
                f"{self.violations} violations (delivered after complete {self.after_complete}, "
                f"lost {self.lost}, not sent by us {self.wrong_session}); order and two holders "
                f"not checked: no sessions, the receivers are competing consumers of one queue"
            )
        return (
            f"{self.violations} violations (order {self.order}, delivered after complete "
            f"{self.after_complete}, lost {self.lost}, two holders {self.two_holders}, "
            f"wrong session {self.wrong_session})"
        )

    def example(self, kinds: dict, kind: str, text: str) -> None:
        kinds[kind] = kinds.get(kind, 0) + 1
        if kinds[kind] <= EXAMPLES:
            self.examples.append(f"{kind}: {text}")


def check(plan: dict[str, int], results: list[dict], sessions: bool = True) -> Verdict:
    """Merge what the workers recorded and count each kind of violation. Without `sessions`
    (plain consumers of one queue) order and holders mean nothing: only what was delivered
    after its complete, lost, or not sent by us is counted."""
    v = Verdict(sessions=sessions)
    kinds: dict[str, int] = {}
    deliveries = [tuple(d) for r in results for d in r.get("deliveries", [])]
    intervals = [i for r in results for i in r.get("intervals", [])]
    for r in results:
        v.accept_timeouts += r.get("accept_timeouts", 0)
        v.late += r.get("late", 0)
        v.attaches += r.get("attaches", 0)
        v.errors += r.get("errors", 0)
        v.error_texts += r.get("error_texts", [])[: 5 - len(v.error_texts)]
        v.latencies += r.get("latencies", [])
        v.first_latencies += r.get("first_latencies", [])
        v.delivery_latencies += r.get("delivery_latencies", [])
        v.first_delivery_latencies += r.get("first_delivery_latencies", [])
    v.deliveries = len(deliveries)
    v.sessions_accepted = len(intervals)
    holding = {link: sid for link, sid, _, _ in intervals}

    # Every message is completed the moment it arrives: its first delivery is its complete.
    first: dict[tuple[str, int], float] = {}
    for t, _link, sid, index in deliveries:
        if t < first.get((sid, index), float("inf")):
            first[(sid, index)] = t
    for t, link, sid, index in deliveries:
        if index >= plan.get(sid, 0) or (sessions and holding.get(link) != sid):
            v.wrong_session += 1
            v.example(
                kinds,
                "wrong session" if sessions else "not sent by us",
                f"{sid}/{index} on link {link} holding {holding.get(link)!r}",
            )
        if t > first[(sid, index)]:
            v.after_complete += 1
            v.example(
                kinds,
                "after complete",
                f"{sid}/{index} again {t - first[(sid, index)]:.3f}"
                f" s after its complete (link {link})",
            )

    v.first_delivered = first
    completed = {k for k in first if k[1] < plan.get(k[0], 0)}
    v.completed = len(completed)
    v.lost = sum(plan.values()) - v.completed
    if v.lost:
        missing = [
            f"{sid}/{i}" for sid, n in plan.items() for i in range(n) if (sid, i) not in completed
        ][:EXAMPLES]
        v.examples.append(f"lost: {v.lost}, e.g. {', '.join(missing)}")
    if not sessions:
        return v

    # Order, across receivers: the first delivery of i comes after the first of i - 1.
    for sid, count in plan.items():
        for index in range(1, count):
            t = first.get((sid, index))
            before = first.get((sid, index - 1))
            if t is not None and (before is None or before > t):
                v.order += 1
                v.example(kinds, "order", f"{sid}/{index} first delivered before {sid}/{index - 1}")
    # ... and within one link, each delivery comes after the one before it (a message of
    # another session on the link is counted as such, not here).
    last_on_link: dict[tuple[int, str], int] = {}
    for _t, link, sid, index in sorted(deliveries):
        previous = last_on_link.get((link, sid))
        if previous is not None and index <= previous:
            v.order += 1
            v.example(kinds, "order", f"{sid}/{index} after {sid}/{previous} on link {link}")
        last_on_link[(link, sid)] = index

    # Never two holders: per session, [answered, let go] of different links never overlap.
    by_session: dict[str, list] = defaultdict(list)
    for link, sid, start, end in intervals:
        by_session[sid].append((start, end if end is not None else float("inf"), link))
    for sid, spans in by_session.items():
        spans.sort()
        held_until, holder = float("-inf"), None
        for start, end, link in spans:
            if start < held_until:
                v.two_holders += 1
                v.example(
                    kinds,
                    "two holders",
                    f"{sid}: link {link} got it "
                    f"{held_until - start:.3f} s before link "
                    f"{holder} let go",
                )
            if end > held_until:
                held_until, holder = end, link
    return v


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker_main())
    sys.exit("usage: bench_churn.py worker   (started by scripts/bench --mode churn)")
