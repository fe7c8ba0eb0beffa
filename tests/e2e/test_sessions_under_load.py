"""Session receivers that settle and leave at once, while the store is busy.

The contract: what a client does on one link reaches the store in the order it was sent. The
completions a client sends before (or together with) a detach are applied before the session
is released; the detach is answered only once the release is stored, so the session can be
accepted again at once, by any busd process sharing the store; a completed message is never
delivered again. The same holds when the connection is closed instead of the link.

The clients here are `EngineClient`s (tests/e2e/burst_client.py): proton's engine over a
plain socket, pumped by hand, so that the dispositions and the detach (or close) go out in
one TCP write; each test checks from the client's frame trace that they did. Two busd
processes share one store; in tests 1-3 other connections keep sending and consuming other
sessions of the same queue on both of them meanwhile (load processes running
burst_client.py), so the store and both brokers are busy; in test 4 the churn of eight
receivers is the load. No test sleeps: every wait is for an answer from the broker (test 4's
receivers leave after IDLE_S without a message).
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import pytest
from proton import Message

from busd.auth.sas import generate_sas_token
from tests.e2e.burst_client import (
    CANNOT_BE_LOCKED,
    NEXT_AVAILABLE,
    NO_SESSION,
    EngineClient,
    Refused,
    SessionReceiver,
    complete,
)
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(90)

BURST_ROUNDS = 50  # accept, receive, complete + detach: rounds per test
PER_ROUND = 20  # messages (credit) per round
LOAD_WORKERS = 3  # load processes, spread over both busd processes
REACCEPT_ROUNDS = 120
# How long a re-accept that was wrongly refused is retried, so the test can go on and report
# how often it happened (the first refusal is already the failure).
RETRY_S = 5.0

QUEUES = ("burst-detach", "burst-close", "reaccept", "churn")


@pytest.fixture(scope="module")
def pair(busd_factory):
    """Two busd processes over one store (same key prefix, same queues)."""
    prefix = f"e2e-load-{uuid.uuid4().hex[:8]}"
    queues = [
        queue(name, RequiresSession=True, LockDuration="PT30S", MaxDeliveryCount=100)
        for name in QUEUES
    ]
    return busd_factory(queues, prefix=prefix), busd_factory(queues, prefix=prefix)


# --- helpers ----------------------------------------------------------------------------------
@contextmanager
def load(pair, queue_name: str, workers: int = LOAD_WORKERS):
    """Load processes on `queue_name` (sessions of their own), alternating busd processes;
    yields a list that holds each worker's statistics once the block is left."""
    script = Path(__file__).with_name("burst_client.py")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                "load",
                "--port",
                str(pair[n % 2].port),
                "--queue",
                queue_name,
                "--worker",
                f"w{n}",
                "--deadline",
                "80",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(workers)
    ]
    stats: list[dict] = []
    try:
        yield stats
    finally:
        for proc in procs:
            proc.stdin.close()  # the signal to stop
            proc.stdin = None  # (communicate() below would flush it otherwise)
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            lines = out.decode().strip().splitlines()
            stats.append(json.loads(lines[-1]) if lines else {"error": err.decode()[-500:]})


def wait_for_load(client: EngineClient, queue_name: str, pair) -> None:
    """Return once the load is running: its sessions show up in the store."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        sessions = admin(pair[0], f"/admin/queues/{queue_name}/sessions")
        if any(str(s.get("session_id", "")).startswith("load-") for s in sessions):
            return
        client.pump(0.05)
    raise AssertionError("the load processes did not start")


def admin(busd, path: str):
    token = generate_sas_token(
        "sb://localhost/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", int(time.time()) + 300
    )
    request = urllib.request.Request(busd.http_url + path)
    request.add_header("Authorization", token)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def peek_session(busd, queue_name: str, session_id: str) -> list[str]:
    """Bodies of every message still in the session (any state), in order."""
    query = urllib.parse.urlencode({"session": session_id, "from": 0, "count": 1000})
    return [m["body"] for m in admin(busd, f"/admin/queues/{queue_name}/messages?{query}")]


def fill(port: int, queue_name: str, session_id: str, count: int) -> None:
    feeder = EngineClient(port)
    try:
        feeder.send(queue_name, [Message(body=str(i), group_id=session_id) for i in range(count)])
    finally:
        feeder.close()


def accept_at_once(
    client: EngineClient, queue_name: str, session_id: str, credit: int, refusals: list[str]
) -> SessionReceiver:
    """Accept the session. A refusal goes into `refusals` (the caller decides whether it was
    allowed) and the accept is tried again, for at most RETRY_S."""
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            return client.accept(queue_name, session_id, credit=credit)
        except Refused as refused:
            refusals.append(refused.condition)
            if refused.condition != CANNOT_BE_LOCKED or time.monotonic() > deadline:
                raise
            client.pump(0.005)


def went_out_together(client: EngineClient, ending: str) -> bool:
    """Whether the last write carried both the dispositions and the `ending` frame."""
    frames = client.frames_of_write(client.writes)
    return any(f.startswith("@disposition") for f in frames) and any(
        f.startswith(f"@{ending}") for f in frames
    )


def summary(problems: list[str], rounds: int, load_stats: list[dict] | None = None) -> str:
    lines = [f"{len(problems)} problem(s) in {rounds} rounds:"] + problems[:15]
    if len(problems) > 15:
        lines.append(f"... {len(problems) - 15} more")
    if load_stats is not None:
        lines.append(f"load: {load_stats}")
    return "\n".join(lines)


class Ledger:
    """Which messages of the target session were completed, and in which round."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.completed: dict[int, int] = {}  # body index -> round that completed it
        self.problems: list[str] = []

    def check_delivery(self, round_no: int, where: str, indexes: list[int]) -> None:
        again = [i for i in indexes if i in self.completed]
        if again:
            rounds = sorted({self.completed[i] for i in again})
            self.problems.append(
                f"round {round_no} ({where}): {len(again)} message(s) completed before were "
                f"delivered again: {again} (completed in round(s) {rounds})"
            )
        first_open = next((i for i in range(self.total) if i not in self.completed), None)
        if not again and indexes and (indexes != sorted(indexes) or indexes[0] != first_open):
            self.problems.append(
                f"round {round_no} ({where}): delivered {indexes}, expected the session's "
                f"oldest open messages from {first_open} on, in order"
            )

    def completed_now(self, round_no: int, indexes: list[int]) -> None:
        for i in indexes:
            self.completed.setdefault(i, round_no)

    def check_store(self, busd, queue_name: str, session_id: str) -> None:
        left = sorted(int(body) for body in peek_session(busd, queue_name, session_id))
        gone = [i for i in left if i in self.completed]
        expected = [i for i in range(self.total) if i not in self.completed]
        if gone:
            self.problems.append(f"completed messages still in the store: {gone}")
        if left != expected:
            self.problems.append(f"the store holds {left}, expected {expected}")


# --- 1. dispositions and detach in one write --------------------------------------------------
def test_completions_sent_with_the_detach_stick(pair):
    """Round after round, a receiver accepts the target session by id, receives PER_ROUND
    messages, then in one TCP write completes them all (settled `accepted` dispositions) and
    detaches. The next round's receiver accepts the session right away on the other busd
    process: it must be granted at once and must get only messages never completed. In odd
    rounds the first half of the completions goes out in a write of its own just before, so
    one batch of completions may still be on its way to the store when the rest and the
    detach arrive."""
    a, b = pair
    name, target = "burst-detach", "target"
    total = BURST_ROUNDS * PER_ROUND + PER_ROUND  # one round's worth stays in the session
    fill(a.port, name, target, total)
    ledger = Ledger(total)
    probes = [EngineClient(a.port, trace=True), EngineClient(b.port, trace=True)]
    for probe in probes:
        probe.authorize(name)
    with load(pair, name) as load_stats:
        wait_for_load(probes[0], name, pair)
        for round_no in range(BURST_ROUNDS):
            client = probes[round_no % 2]
            where = "busd A" if client is probes[0] else "busd B"
            refusals: list[str] = []
            receiver = accept_at_once(client, name, target, PER_ROUND, refusals)
            if refusals and round_no > 0:
                ledger.problems.append(
                    f"round {round_no} ({where}): accepting the session right after the "
                    f"previous receiver's detach was answered was refused {len(refusals)} "
                    f"time(s) with {refusals[0]}"
                )
            items = receiver.wait_for(PER_ROUND)
            indexes = [int(item.body) for item in items]
            ledger.check_delivery(round_no, where, indexes)
            split = round_no % 2 == 1
            if split:
                complete(items[: PER_ROUND // 2])
                client.flush()
            complete(items[PER_ROUND // 2 if split else 0 :])
            client.close_link(receiver)  # the rest of the completions and the detach: one write
            assert went_out_together(client, "detach"), client.frames_of_write(client.writes)
            ledger.completed_now(round_no, indexes)
            client.wait(lambda r=receiver: r.gone, what="the detach answer")
    for probe in probes:
        probe.close()
    ledger.check_store(b, name, target)
    assert not ledger.problems, summary(ledger.problems, BURST_ROUNDS, load_stats)
    assert all(s.get("rounds", 0) > 0 for s in load_stats), load_stats


# --- 2. dispositions and connection close in one write ----------------------------------------
def test_completions_sent_with_the_connection_close_stick(pair):
    """As above, but each round's connection is closed instead of the link: the completions
    and the close frame go out in one TCP write. Rounds cycle through three endings:
    - close: wait for the broker's close, then the next receiver (a connection opened
      beforehand, on the other busd process) must be granted the session at once;
    - close, split: the same, with the first half of the completions in a write just before;
    - close + EOF: the socket is shut for writing right after that write, without waiting
      for anything; the next accept may find the session still held for a moment (retried),
      but the completions must stick all the same.
    No round may see a message completed in an earlier one."""
    a, b = pair
    name, target = "burst-close", "target"
    total = BURST_ROUNDS * PER_ROUND + PER_ROUND
    fill(b.port, name, target, total)
    ledger = Ledger(total)

    def connect(round_no: int) -> EngineClient:
        client = EngineClient(pair[round_no % 2].port, trace=True)
        client.authorize(name)
        return client

    endings = ("close", "close, split", "close + EOF")
    previous_ending = None
    shut: EngineClient | None = None
    upcoming = connect(0)
    with load(pair, name) as load_stats:
        wait_for_load(upcoming, name, pair)
        for round_no in range(BURST_ROUNDS):
            client = upcoming
            where = "busd A" if round_no % 2 == 0 else "busd B"
            refusals: list[str] = []
            receiver = accept_at_once(client, name, target, PER_ROUND, refusals)
            if refusals and previous_ending not in (None, "close + EOF"):
                ledger.problems.append(
                    f"round {round_no} ({where}): accepting the session right after the "
                    f"previous connection's close was answered ({previous_ending}) was refused "
                    f"{len(refusals)} time(s) with {refusals[0]}"
                )
            if shut is not None:
                shut.drain_and_close()
                shut = None
            items = receiver.wait_for(PER_ROUND)
            indexes = [int(item.body) for item in items]
            ledger.check_delivery(round_no, where, indexes)
            upcoming = connect(round_no + 1)  # ready before this one goes
            ending = endings[round_no % 3]
            split = ending == "close, split"
            if split:
                complete(items[: PER_ROUND // 2])
                client.flush()
            complete(items[PER_ROUND // 2 if split else 0 :])
            client.conn.close()
            client.flush()  # the rest of the completions and the close frame: one write
            assert went_out_together(client, "close"), client.frames_of_write(client.writes)
            ledger.completed_now(round_no, indexes)
            if ending == "close + EOF":
                client.sock.shutdown(socket.SHUT_WR)
                shut = client
            else:
                client.wait(
                    lambda c=client: bool(c.conn.state & c.conn.REMOTE_CLOSED) or c.eof,
                    what="the close answer",
                )
                client.sock.close()
            previous_ending = ending
    if shut is not None:
        shut.drain_and_close()
    upcoming.close()
    ledger.check_store(a, name, target)
    assert not ledger.problems, summary(ledger.problems, BURST_ROUNDS, load_stats)
    assert all(s.get("rounds", 0) > 0 for s in load_stats), load_stats


# --- 3. re-accept right after a detach --------------------------------------------------------
def test_reaccept_right_after_detach(pair):
    """A receiver holding the session (with messages delivered, not settled) closes its link
    and waits for the detach answer; at once another connection accepts the same session. It
    must be granted every time, and get the released messages again, in order. The holder
    moves round robin over three connections: busd A, busd B, and A again on another
    connection, so the re-accept is on the other process two rounds out of three and on
    the same process in the third. Load processes keep the store and both busd processes
    busy meanwhile."""
    a, b = pair
    name, target, held = "reaccept", "target", 5
    fill(a.port, name, target, held)
    clients = [EngineClient(p.port) for p in (a, b, a)]
    labels = ["A#1", "B", "A#2"]
    for client in clients:
        client.authorize(name)
    problems: list[str] = []
    with load(pair, name) as load_stats:
        wait_for_load(clients[0], name, pair)
        receiver = clients[0].accept(name, target, credit=held)
        for round_no in range(REACCEPT_ROUNDS):
            holder, nxt = round_no % 3, (round_no + 1) % 3
            got = [item.body for item in receiver.wait_for(held)]
            if got != [str(i) for i in range(held)]:
                problems.append(f"round {round_no}: receiver on {labels[holder]} got {got}")
            clients[holder].detach(receiver)  # returns once the broker's detach is in
            refusals: list[str] = []
            receiver = accept_at_once(clients[nxt], name, target, held, refusals)
            if refusals:
                problems.append(
                    f"round {round_no}: {labels[holder]} -> {labels[nxt]}: accepting the "
                    f"session right after the holder's detach was answered was refused "
                    f"{len(refusals)} time(s) with {refusals[0]}"
                )
        clients[REACCEPT_ROUNDS % 3].detach(receiver)
    for client in clients:
        client.close()
    assert not problems, summary(problems, REACCEPT_ROUNDS, load_stats)
    assert all(s.get("rounds", 0) > 0 for s in load_stats), load_stats


# --- 4. next-available receivers under churn --------------------------------------------------
CHURN_SESSIONS = 30
CHURN_PER_SESSION = 10
CHURN_RECEIVERS = 8
TAKE_PER_ACCEPT = 3  # each acceptance takes at most this many, so sessions change hands
IDLE_S = 0.05  # a receiver with no new message for this long leaves
CHURN_S = 40  # at most this long for all of it


class ChurnReceiver:
    """One next-available session receiver on a connection of its own, stepped by the test's
    loop: accept the next session, take up to TAKE_PER_ACCEPT messages (less once idle for
    IDLE_S), complete all but the last in one write and the last together with the detach in
    the next, wait for the detach answer, accept again."""

    def __init__(self, number: int, busd, queue_name: str, log: ChurnLog) -> None:
        self.number = number
        self.queue_name = queue_name
        self.log = log
        self.client = EngineClient(busd.port)
        self.client.authorize(queue_name)
        self.receiver: SessionReceiver | None = None
        self.state = "idle"
        self.last_count = 0
        self.last_change = 0.0
        self.done = False

    def step(self) -> None:
        now = time.monotonic()
        if self.state == "idle":
            if self.log.finished():
                self.done = True
                return
            self.receiver = self.client.attach(
                self.queue_name, NEXT_AVAILABLE, credit=TAKE_PER_ACCEPT, timeout_ms=300
            )
            self.client.flush()
            self.state = "accepting"
        elif self.state == "accepting":
            receiver = self.receiver
            if receiver.locked:
                receiver.mark_locked()
                self.state, self.last_count, self.last_change = "receiving", 0, now
            elif receiver.gone:
                refused = receiver.refusal()
                self.client.flush()
                if refused.condition != NO_SESSION:
                    self.log.problems.append(f"receiver {self.number}: accept refused: {refused}")
                self.state = "idle"
        elif self.state == "receiving":
            receiver = self.receiver
            count = len(receiver.received)
            if count != self.last_count:
                self.log.delivered(self.number, receiver, receiver.received[self.last_count :])
                self.last_count, self.last_change = count, now
            if count >= TAKE_PER_ACCEPT or receiver.gone or now - self.last_change > IDLE_S:
                items = receiver.received
                if len(items) > 1:
                    complete(items[:-1])
                    self.client.flush()
                complete(items[-1:])
                end = self.client.close_link(receiver)  # the last completion with the detach
                self.log.left(self.number, receiver, end)
                self.state = "detaching"
        elif self.state == "detaching":
            if self.receiver.gone:
                self.state = "idle"
                self.step()


class ChurnLog:
    """What the churn receivers saw, in the order the test's loop saw it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.deliveries: dict[tuple[str, int], int] = defaultdict(int)
        self.completions: dict[tuple[str, int], int] = defaultdict(int)
        self.first_order: dict[str, list[int]] = defaultdict(list)
        self.holds: list[tuple[str, int, float, float]] = []  # (session, receiver, start, end)
        self.problems: list[str] = []

    def finished(self) -> bool:
        return len(self.completions) >= self.total

    @staticmethod
    def key(item) -> tuple[str, int]:
        session, index = item.body.split(":")
        return f"s{int(session):02d}", int(index)

    def delivered(self, number: int, receiver: SessionReceiver, items) -> None:
        for item in items:
            key = self.key(item)
            if key[0] != receiver.session_id or item.message.group_id != receiver.session_id:
                self.problems.append(f"receiver {number} holding {receiver.session_id} got {key}")
            if self.completions.get(key):
                self.problems.append(f"{key} delivered to receiver {number} after it was completed")
            if not self.deliveries[key]:
                self.first_order[key[0]].append(key[1])
            self.deliveries[key] += 1

    def left(self, number: int, receiver: SessionReceiver, end: float) -> None:
        for item in receiver.received:
            self.completions[self.key(item)] += 1
        self.holds.append((receiver.session_id, number, receiver.attached_at, end))


def test_next_available_receivers_under_churn(pair):
    """8 next-available session receivers, half on each busd process, share 30 sessions of 10
    messages; each leaves after TAKE_PER_ACCEPT messages or IDLE_S without one, completing
    what it took with the detach (see ChurnReceiver), and accepts again. One thread steps
    them all, so that each receiver's writes follow each other at once. Checks: every
    message is completed, and never delivered after its completion; in each session, first
    deliveries come in order; no session is held by two receivers at once (the client's
    [attach answered, detach sent] intervals of one session never overlap); nothing is left
    or lost."""
    a, b = pair
    name = "churn"
    feeder = EngineClient(a.port)
    feeder.send(
        name,
        [
            Message(body=f"{s}:{i}", group_id=f"s{s:02d}")
            for i in range(CHURN_PER_SESSION)
            for s in range(CHURN_SESSIONS)
        ],
    )
    feeder.close()
    log = ChurnLog(CHURN_SESSIONS * CHURN_PER_SESSION)
    receivers = [ChurnReceiver(n, pair[n % 2], name, log) for n in range(CHURN_RECEIVERS)]
    deadline = time.monotonic() + CHURN_S
    while not all(r.done for r in receivers):
        assert time.monotonic() < deadline, (
            f"not done in {CHURN_S} s: {len(log.completions)} of {log.total} completed; "
            f"states {[r.state for r in receivers]}"
        )
        busy = [r for r in receivers if not r.done]
        for r in busy:
            r.client.flush()
        readable, _, _ = select.select([r.client for r in busy], [], [], 0.01)
        for client in readable:
            client.read()
        for r in busy:
            r.step()
    for r in receivers:
        r.client.close()

    expected = {(f"s{s:02d}", i) for s in range(CHURN_SESSIONS) for i in range(CHURN_PER_SESSION)}
    problems = log.problems
    assert set(log.completions) == expected, (
        f"never completed: {sorted(expected - set(log.completions))}"
    )
    twice = sorted(key for key, n in log.completions.items() if n > 1)
    if twice:
        problems.append(
            f"{len(twice)} message(s) completed more than once (delivered again "
            f"after their completion): {twice[:10]}"
        )
    for session_id, order in sorted(log.first_order.items()):
        if order != list(range(CHURN_PER_SESSION)):
            problems.append(f"{session_id}: first deliveries in the order {order}")
    by_session: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for session_id, number, start, end in log.holds:
        by_session[session_id].append((start, end, number))
    for session_id, intervals in sorted(by_session.items()):
        intervals.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in zip(intervals, intervals[1:]):
            if s2 < e1:
                problems.append(f"{session_id} held by receivers {n1} and {n2} at once")
    assert {number % 2 for _, number, _, _ in log.holds} == {0, 1}, "one busd did all the work"
    left = admin(a, f"/admin/queues/{name}/messages?count=1000")
    if left:
        problems.append(
            f"{len(left)} message(s) left in the queue: {[m.get('body') for m in left][:10]}"
        )
    counts = admin(b, f"/admin/queues/{name}")["counts"]
    if any(counts[k] for k in ("active", "locked", "deferred", "dead_letter", "locked_sessions")):
        problems.append(f"after every receiver left, the queue counts {counts}")
    assert not problems, summary(problems, len(log.holds))
