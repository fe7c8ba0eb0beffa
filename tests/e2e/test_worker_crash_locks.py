"""`busd serve --workers 2`: a worker killed with SIGKILL while a client holds a session
through it. Its parent ends the dead worker's session locks at once (docs/design.md §3.10),
so a new receiver accepts the same session within about a second, not after LockDuration,
with the messages the dead worker had delivered first again, in order, their attempt counted
as when a lock expires, and nothing lost. So are the peek-locked messages of a queue without
sessions that the dead worker had delivered. The clients are the official azure-servicebus
SDK on real sockets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    SessionCannotBeLockedError,
)
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.e2e.conftest import queue, receive
from tests.e2e.test_workers import WORKERS, alive, health

pytestmark = pytest.mark.timeout(120)

LOCK_S = 30  # far longer than the test waits: only the parent's release frees the session


ROOT = "RootManageSharedAccessKey"


def connection_string(busd, namespace: str | None) -> str:
    """The default namespace's string, or a namespace's (chosen by the key name)."""
    if namespace is None:
        return busd.connection_string
    return busd.connection_string.replace(f"={ROOT};", f"={namespace}/{ROOT};")


def sb_client(busd, namespace: str | None = None) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(
        connection_string(busd, namespace), retry_total=0
    )


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("sessions", RequiresSession=True, LockDuration=f"PT{LOCK_S}S"),
            queue("plain", LockDuration=f"PT{LOCK_S}S"),
        ],
        extra_env=WORKERS,
    )


def serving_worker(busd) -> int:
    """The pid of the one worker with an AMQP connection open (the test's only client)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = [w["pid"] for w in health(busd)["workers"] if w["connections"] > 0]
        if len(busy) == 1:
            return busy[0]
        time.sleep(0.1)
    raise AssertionError(f"not one worker holds the connection: {health(busd)}")


def test_a_killed_worker_s_session_is_accepted_again_at_once(busd):
    killed_holding_a_session(busd, None)


def test_so_is_a_session_of_a_namespace_the_worker_served(busd):
    namespace = f"team-{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient.from_connection_string(
        connection_string(busd, namespace), connection_verify=busd.cert_path
    )
    with admin:
        admin.create_queue(
            "sessions", requires_session=True, lock_duration=timedelta(seconds=LOCK_S)
        )
    killed_holding_a_session(busd, namespace)


def killed_holding_a_session(busd, namespace: str | None) -> None:
    """A client holds a session (three of its five messages delivered) through one worker,
    which is killed: the session is accepted again long before its lock would run out (the
    tries stop at half of it), so the parent released it."""
    with sb_client(busd, namespace) as client, client.get_queue_sender("sessions") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", session_id="s") for i in range(5)])

    holder = sb_client(busd, namespace)
    receiver = holder.get_queue_receiver("sessions", session_id="s", max_wait_time=5)
    receiver.__enter__()
    held = receive(receiver, 3)
    assert [(str(m), m.delivery_count) for m in held] == [("m0", 0), ("m1", 0), ("m2", 0)]
    pid = serving_worker(busd)

    os.kill(pid, signal.SIGKILL)  # no release, no goodbye
    killed = time.monotonic()
    while alive(pid):
        time.sleep(0.01)

    # Each try on a connection of its own: one may land on the dying worker and be reset.
    again = client = None
    while again is None and time.monotonic() - killed < LOCK_S / 2:
        client = sb_client(busd, namespace)
        candidate = client.get_queue_receiver("sessions", session_id="s", max_wait_time=3)
        try:
            candidate.__enter__()
            again = candidate
        except (SessionCannotBeLockedError, OperationTimeoutError, ServiceBusConnectionError):
            client.close()
            time.sleep(0.05)
    accepted_s = time.monotonic() - killed
    print(f"\nsession accepted again {accepted_s:.2f} s after the worker's SIGKILL")
    assert again is not None and client is not None
    with client:
        try:
            messages = receive(again, 5)
            # The delivered three first again, in order, their attempt counted; the two the
            # dead worker never delivered uncounted; nothing lost.
            assert [(str(m), m.delivery_count) for m in messages] == [
                ("m0", 1),
                ("m1", 1),
                ("m2", 1),
                ("m3", 0),
                ("m4", 0),
            ]
            for message in messages:
                again.complete_message(message)
        finally:
            again.__exit__(None, None, None)
        with client.get_queue_receiver("sessions", session_id="s", max_wait_time=1) as empty:
            assert empty.receive_messages(max_wait_time=1) == []
    (ended,) = [line for line in busd.log_text().splitlines() if f"(pid {pid}) in" in line]
    print(ended)
    assert "ended the 1 session locks and 0 message locks of worker" in ended
    with contextlib.suppress(Exception):  # its connection died with the worker
        holder.close()


def test_a_killed_worker_s_message_locks_end_at_once(busd):
    """A client holds three of five messages of a queue without sessions (peek-lock) through
    one worker, which is killed: the three are received again well before LockDuration runs
    out, their attempt counted as when a lock expires; nothing is lost."""
    with sb_client(busd) as client, client.get_queue_sender("plain") as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(5)])
    holder = sb_client(busd)
    receiver = holder.get_queue_receiver("plain", max_wait_time=5)
    receiver.__enter__()
    held = receive(receiver, 3)
    assert [(str(m), m.delivery_count) for m in held] == [("p0", 0), ("p1", 0), ("p2", 0)]
    pid = serving_worker(busd)

    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while alive(pid):
        time.sleep(0.01)

    got: dict[str, int] = {}
    back_s = None
    while back_s is None and time.monotonic() - killed < LOCK_S / 2:
        # a connection of its own each try: one may land on the dying worker and be reset
        try:
            with (
                sb_client(busd) as client,
                client.get_queue_receiver("plain", max_wait_time=1) as again,
            ):
                for message in again.receive_messages(max_message_count=5, max_wait_time=1):
                    got[str(message)] = message.delivery_count
                    again.complete_message(message)
        except (OperationTimeoutError, ServiceBusConnectionError):
            time.sleep(0.05)
        if {"p0", "p1", "p2"} <= got.keys():
            back_s = time.monotonic() - killed
    # (without the parent's release they would come back only after LockDuration, LOCK_S)
    assert back_s is not None, f"not received again within {LOCK_S / 2} s"
    print(f"\nmessages received again {back_s:.2f} s after the worker's SIGKILL")
    got.update((str(m), m.delivery_count) for m in receive_all_left(busd, 5 - len(got)))
    assert got == {"p0": 1, "p1": 1, "p2": 1, "p3": 0, "p4": 0}
    (ended,) = [line for line in busd.log_text().splitlines() if f"(pid {pid}) in" in line]
    print(ended)
    assert "ended the 0 session locks and 3 message locks of worker" in ended
    with contextlib.suppress(Exception):  # its connection died with the worker
        holder.close()


def receive_all_left(busd, count: int) -> list:
    """The queue's remaining messages, completed."""
    if count <= 0:
        return []
    with sb_client(busd) as client, client.get_queue_receiver("plain", max_wait_time=3) as rest:
        messages = receive(rest, count)
        for message in messages:
            rest.complete_message(message)
        return messages
