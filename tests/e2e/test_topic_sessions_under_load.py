"""Fan-out with sessions under load: three session subscriptions of one topic, served by two
busd processes over one store, with next-available session receivers on both while the
sender keeps sending. Every subscription gets every message; per subscription and session,
delivery is in order with no gap or repeat, and no two receivers hold a session at once."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

from tests.e2e.conftest import subscription, topic

pytestmark = pytest.mark.timeout(150)

SUBSCRIPTIONS = ("s1", "s2", "s3")
SESSIONS = 12
PER_SESSION = 8  # half sent before the receivers start, half while they run
RECEIVERS_PER_PROCESS = 2  # per subscription
DEADLINE_S = 90


@pytest.fixture(scope="module")
def pair(busd_factory):
    prefix = f"e2e-topic-load-{uuid.uuid4().hex[:8]}"
    topics = [
        topic(
            "load",
            [subscription(s, RequiresSession=True, LockDuration="PT30S") for s in SUBSCRIPTIONS],
        )
    ]
    return (
        busd_factory([], topics=topics, prefix=prefix),
        busd_factory([], topics=topics, prefix=prefix),
    )


def send(busd, first: int, last: int) -> None:
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_topic_sender("load") as sender:
            for i in range(first, last):
                sender.send_messages(
                    [
                        ServiceBusMessage(
                            f"{s}:{i}", session_id=f"k{s:02d}", application_properties={"i": i}
                        )
                        for s in range(SESSIONS)
                    ]
                )


def test_session_subscriptions_keep_order_and_exclusivity_on_two_processes(pair):
    half = PER_SESSION // 2
    send(pair[0], 0, half)
    total = len(SUBSCRIPTIONS) * SESSIONS * PER_SESSION
    got: dict[tuple[str, str], list[int]] = defaultdict(list)
    holds: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + DEADLINE_S

    def done() -> bool:
        with lock:
            return sum(len(v) for v in got.values()) >= total or time.monotonic() > stop_at

    def work(busd, sub: str, name: str) -> None:
        try:
            with ServiceBusClient.from_connection_string(busd.connection_string) as client:
                while not done():
                    try:
                        rx = client.get_subscription_receiver(
                            "load", sub, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
                        )
                        rx.__enter__()
                    except (OperationTimeoutError, ServiceBusError):
                        continue  # nothing free right now
                    try:
                        session = rx.session.session_id
                        start = time.monotonic()
                        while True:
                            batch = rx.receive_messages(max_message_count=10, max_wait_time=1)
                            if not batch:
                                break
                            for m in batch:
                                with lock:
                                    got[(sub, session)].append(m.application_properties[b"i"])
                                rx.complete_message(m)
                        end = time.monotonic()
                        with lock:
                            holds[(sub, session)].append((start, end, name))
                    finally:
                        rx.__exit__(None, None, None)
        except Exception as exc:  # reported below, with what was received
            errors.append(f"{name}: {exc!r}")

    threads = [
        threading.Thread(target=work, args=(pair[p], sub, f"{sub}-p{p}-{n}"))
        for sub in SUBSCRIPTIONS
        for p in (0, 1)
        for n in range(RECEIVERS_PER_PROCESS)
    ]
    for t in threads:
        t.start()
    send(pair[1], half, PER_SESSION)  # while the receivers run, through the other process
    for t in threads:
        t.join(DEADLINE_S + 30)

    assert not errors, errors
    expected = list(range(PER_SESSION))
    wrong = {key: seq for key, seq in got.items() if seq != expected}
    assert not wrong, f"out of order, lost or repeated: {wrong}"
    assert len(got) == len(SUBSCRIPTIONS) * SESSIONS
    for key, intervals in holds.items():
        intervals.sort()
        for (_, e1, n1), (s2, _, n2) in zip(intervals, intervals[1:]):
            assert s2 >= e1, f"{key}: held by {n1} and {n2} at once"
