"""SessionIdleTimeToLive (busd's own, docs/design.md §2.6) through the official SDK: a session
left with only its state and no holder for longer than the entity's idle time to live is
removed, state included, by the sweep; one with messages, or held, keeps its state."""

from __future__ import annotations

import time
import urllib.request

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)

IDLE_TTL_S = 2


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("idle", RequiresSession=True, SessionIdleTimeToLive=f"PT{IDLE_TTL_S}S"),
            queue("idle3", RequiresSession=True, SessionIdleTimeToLive="PT3S"),
            queue("kept", RequiresSession=True),  # no idle time to live: never removed
        ]
    )


def _leave_with_state(client, name: str, session_id: str, sent: int, completed: int) -> None:
    with client.get_queue_sender(name) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{i}", session_id=session_id) for i in range(sent)]
        )
    with client.get_queue_receiver(name, session_id=session_id, max_wait_time=5) as receiver:
        for message in receive(receiver, completed)[:completed]:
            receiver.complete_message(message)
        receiver.session.set_state(session_id.encode())


def _state(client, name: str, session_id: str) -> bytes | None:
    with client.get_queue_receiver(name, session_id=session_id, max_wait_time=5) as receiver:
        return receiver.session.get_state()


def _expired_total(busd, entity: str) -> float:
    text = urllib.request.urlopen(f"{busd.http_url}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'busd_sessions_expired_total{{entity="{entity}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_idle_session_state_goes_after_the_idle_time_to_live(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        _leave_with_state(client, "idle", "emptied", sent=2, completed=2)
        _leave_with_state(client, "idle", "waiting", sent=2, completed=1)  # one left in it
        _leave_with_state(client, "kept", "emptied", sent=1, completed=1)
        with client.get_queue_receiver("idle", session_id="held", max_wait_time=5) as held:
            held.session.set_state(b"held")
            # held past the idle time to live (and its own renewals) plus a few sweeps
            deadline = time.monotonic() + IDLE_TTL_S + 2
            while time.monotonic() < deadline:
                held.session.renew_lock()
                time.sleep(0.5)
            assert held.session.get_state() == b"held"
            assert _expired_total(busd, "idle") == 1  # "emptied" alone
        assert _state(client, "idle", "emptied") is None
        assert _state(client, "idle", "waiting") == b"waiting"
        assert _state(client, "kept", "emptied") == b"emptied"
        assert _expired_total(busd, "kept") == 0


def test_a_session_idle_again_counts_from_its_last_activity(busd):
    """A session that had messages or a holder again is idle from when it lost them, not from
    when it first went idle."""
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        _leave_with_state(client, "idle3", "revisited", sent=1, completed=1)
        first_idle = time.monotonic()
        time.sleep(1.5)
        _leave_with_state(client, "idle3", "revisited", sent=1, completed=1)
        last_idle = time.monotonic()
        time.sleep(max(0.0, first_idle + 3.6 - time.monotonic()))  # 3 s past the first
        assert time.monotonic() - last_idle < 2.5, "too slow to tell the two apart"
        assert _state(client, "idle3", "revisited") == b"revisited"
        time.sleep(4)
        assert _state(client, "idle3", "revisited") is None
