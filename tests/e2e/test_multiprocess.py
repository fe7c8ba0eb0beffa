"""Two busd processes over one store: the session lock is exclusive across processes, and a
process killed with SIGKILL loses nothing - its session comes back after the lock duration.

Both processes share one key prefix and the same entities, so they serve the same queues; the
clients are the official azure-servicebus SDK on real sockets.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
)

from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(120)

SESSIONS = 20
PER_SESSION = 10
RECEIVERS = 8
# Each acceptance takes at most this many messages before closing, so every session is
# accepted several times, by receivers on both processes, and resumes where it stopped.
TAKE_PER_ACCEPT = 4


def start_pair(busd_factory, queues, **options):
    """Two busd processes on one store: same key prefix, same entities (options: e.g.
    log_level="trace" to see every frame in their logs)."""
    prefix = f"e2e-mp-{uuid.uuid4().hex[:8]}"
    return (
        busd_factory(queues, prefix=prefix, **options),
        busd_factory(queues, prefix=prefix, **options),
    )


def sb_client(busd) -> ServiceBusClient:
    # retry_total=0: a next-available accept that finds nothing fails after one wait instead
    # of being retried three times by the SDK.
    return ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0)


@pytest.fixture(scope="module")
def pair(busd_factory):
    return start_pair(busd_factory, [queue("sessions", RequiresSession=True, LockDuration="PT5S")])


def test_next_available_sessions_are_exclusive_across_processes(pair):
    holds = drain_sessions_concurrently(*pair)
    # The work really was spread over both processes.
    assert {number % 2 for _, number, _, _ in holds} == {0, 1}


def drain_sessions_concurrently(a, b) -> list[tuple[str, int, float, float]]:
    """SESSIONS sessions sent through `a`, drained by RECEIVERS receivers taking turns on
    `a` and `b`: every message once, in order within its session, and no session held by
    two receivers at once. The holds: (session, receiver, start, end)."""
    with sb_client(a) as client, client.get_queue_sender("sessions") as sender:
        # Interleaved, so each session's messages are spread over the sequence numbers.
        sender.send_messages(
            [
                ServiceBusMessage(f"{s}:{i}", session_id=f"s{s:02d}")
                for i in range(PER_SESSION)
                for s in range(SESSIONS)
            ]
        )

    total = SESSIONS * PER_SESSION
    lock = threading.Lock()
    received: dict[str, list[int]] = defaultdict(list)  # session -> message indexes, in order
    holds: list[tuple[str, int, float, float]] = []  # (session, receiver, start, end)
    failures: list[BaseException] = []
    deadline = time.monotonic() + 60

    def done() -> bool:
        with lock:
            return sum(len(v) for v in received.values()) >= total

    def run(number: int, busd) -> None:
        try:
            with sb_client(busd) as client:
                while not done() and time.monotonic() < deadline:
                    receiver = client.get_queue_receiver(
                        "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                    )
                    try:
                        receiver.__enter__()
                    except OperationTimeoutError:
                        continue  # nothing available right now: others hold what is left
                    try:
                        # Held from here until close is called: the broker's lock is at least
                        # this interval (it started before and ends after).
                        start = time.monotonic()
                        session_id = receiver.session.session_id
                        taken = 0
                        while taken < TAKE_PER_ACCEPT:
                            batch = receiver.receive_messages(
                                max_message_count=TAKE_PER_ACCEPT - taken, max_wait_time=0.5
                            )
                            if not batch:
                                break
                            for message in batch:
                                assert message.session_id == session_id
                                name, index = str(message).split(":")
                                assert f"s{int(name):02d}" == session_id
                                with lock:
                                    received[session_id].append(int(index))
                                receiver.complete_message(message)
                                taken += 1
                            time.sleep(0.02)  # hold it a little longer: overlaps show up
                        end = time.monotonic()
                    finally:
                        receiver.__exit__(None, None, None)
                    with lock:
                        holds.append((session_id, number, start, end))
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(n, a if n % 2 == 0 else b), daemon=True)
        for n in range(RECEIVERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1, deadline - time.monotonic() + 15))
    assert not any(t.is_alive() for t in threads), "receivers did not finish in time"
    assert not failures, failures

    # Every message exactly once, in order within its session.
    assert sorted(received) == [f"s{s:02d}" for s in range(SESSIONS)]
    for session_id, indexes in received.items():
        assert indexes == list(range(PER_SESSION)), (session_id, indexes)

    # No session was held by two receivers at the same time.
    by_session: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for session_id, number, start, end in holds:
        by_session[session_id].append((start, end, number))
    for session_id, intervals in by_session.items():
        intervals.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in zip(intervals, intervals[1:]):
            assert e1 <= s2, f"{session_id} held by receivers {n1} and {n2} at once"

    with sb_client(b) as client:
        with pytest.raises(OperationTimeoutError):
            with client.get_queue_receiver(
                "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
            ):
                pass  # every session is drained: nothing left to accept
    return holds


@pytest.mark.timeout(90)
def test_session_of_a_killed_process_returns_after_the_lock_duration(busd_factory):
    a, b = start_pair(busd_factory, [queue("crash", RequiresSession=True, LockDuration="PT2S")])
    with sb_client(b) as client, client.get_queue_sender("crash") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", session_id="s") for i in range(3)])

    client_a = sb_client(a)
    receiver_a = client_a.get_queue_receiver("crash", session_id="s", max_wait_time=5)
    receiver_a.__enter__()
    locked_until = receiver_a.session.locked_until_utc.timestamp()
    first = []
    deadline = time.monotonic() + 10
    while len(first) < 3 and time.monotonic() < deadline:
        first.extend(receiver_a.receive_messages(max_message_count=3 - len(first), max_wait_time=2))
    assert [str(m) for m in first] == ["m0", "m1", "m2"]
    assert all(m.delivery_count == 0 for m in first)

    a.proc.kill()  # SIGKILL: no release, no goodbye; the lock stays in the store
    a.proc.wait(timeout=10)
    killed_at = time.time()

    with sb_client(b) as client:
        # Still locked by the dead process until its lock runs out.
        if time.time() < locked_until - 0.5:
            with pytest.raises(SessionCannotBeLockedError):
                with client.get_queue_receiver("crash", session_id="s", max_wait_time=1):
                    pass
        receiver_b = None
        deadline = time.monotonic() + 15
        while receiver_b is None and time.monotonic() < deadline:
            candidate = client.get_queue_receiver("crash", session_id="s", max_wait_time=5)
            try:
                candidate.__enter__()
                receiver_b = candidate
            except (SessionCannotBeLockedError, OperationTimeoutError):
                time.sleep(0.2)
        assert receiver_b is not None, "process B never got the session of the killed process"
        accepted_at = time.time()
        try:
            # Not before the dead holder's lock expired (store and test share one clock here).
            assert accepted_at >= locked_until - 0.25, (killed_at, locked_until, accepted_at)
            again = []
            deadline = time.monotonic() + 10
            while len(again) < 3 and time.monotonic() < deadline:
                again.extend(
                    receiver_b.receive_messages(max_message_count=3 - len(again), max_wait_time=2)
                )
            assert [str(m) for m in again] == ["m0", "m1", "m2"]
            assert [m.sequence_number for m in again] == [m.sequence_number for m in first]
            # The lock expired with them delivered and unsettled: delivery count + 1.
            assert [m.delivery_count for m in again] == [1, 1, 1]
            for m in again:
                receiver_b.complete_message(m)
        finally:
            receiver_b.__exit__(None, None, None)

        with pytest.raises(OperationTimeoutError):
            with client.get_queue_receiver(
                "crash", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
            ):
                pass  # completed: nothing left

    try:
        client_a.close()
    except ServiceBusError:
        pass  # its broker is gone
