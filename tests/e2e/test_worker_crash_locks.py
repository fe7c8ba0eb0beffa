"""`busd serve --workers 2`: a worker killed with SIGKILL while a client holds a session
through it. Its parent ends the dead worker's session locks at once (docs/design.md §3.10),
so a new receiver accepts the same session within about a second, not after LockDuration,
with the messages the dead worker had delivered first again, in order, their attempt counted
as when a lock expires, and nothing lost. The clients are the official azure-servicebus SDK
on real sockets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    SessionCannotBeLockedError,
)

from tests.e2e.conftest import queue, receive
from tests.e2e.test_workers import WORKERS, alive, health

pytestmark = pytest.mark.timeout(120)

LOCK_S = 30  # far longer than the test waits: only the parent's release frees the session
WITHIN_S = 3.0


def sb_client(busd) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0)


def serving_worker(busd) -> int:
    """The pid of the one worker with an AMQP connection open (the test's only client)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = [w["pid"] for w in health(busd)["workers"] if w["connections"] > 0]
        if len(busy) == 1:
            return busy[0]
        time.sleep(0.1)
    raise AssertionError(f"not one worker holds the connection: {health(busd)}")


def test_a_killed_worker_s_session_is_accepted_again_at_once(busd_factory):
    busd = busd_factory(
        [queue("sessions", RequiresSession=True, LockDuration=f"PT{LOCK_S}S")],
        extra_env=WORKERS,
    )
    with sb_client(busd) as client, client.get_queue_sender("sessions") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", session_id="s") for i in range(5)])

    holder = sb_client(busd)
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
        client = sb_client(busd)
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
            assert accepted_s < WITHIN_S, f"accepted only after {accepted_s:.1f} s"
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
    (ended,) = [line for line in busd.log_text().splitlines() if "session locks of worker" in line]
    print(ended)
    assert "ended the 1 session locks of worker" in ended
    with contextlib.suppress(Exception):  # its connection died with the worker
        holder.close()
