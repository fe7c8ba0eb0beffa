"""Sessions through the official azure-servicebus SDK (sync): exclusive locks, order, delivery
counts, state, session-wide TTL, request-reply, listing and peeking."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("sessions", RequiresSession=True),
            queue("plain"),
            queue("short", RequiresSession=True, LockDuration="PT2S", MaxDeliveryCount=3),
            queue("ttl", RequiresSession=True, DeadLetteringOnMessageExpiration=True),
            queue("requests", RequiresSession=True),
            queue("replies", RequiresSession=True),
            queue("small", RequiresSession=True, MaxMessageSizeInKilobytes=16),
        ]
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


def send(client, queue_name, session_id, bodies, **kwargs):
    with client.get_queue_sender(queue_name) as sender:
        sender.send_messages(
            [ServiceBusMessage(b, session_id=session_id, **kwargs) for b in bodies]
        )


def drain_session(client, queue_name, session_id):
    with client.get_queue_receiver(
        queue_name, session_id=session_id, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as r:
        while r.receive_messages(max_message_count=50, max_wait_time=0.5):
            pass


def test_message_without_session_id_is_refused_on_a_session_queue(client):
    with client.get_queue_sender("sessions") as sender:
        with pytest.raises(ServiceBusError, match="SessionId"):
            sender.send_messages(ServiceBusMessage("no session"))
    with pytest.raises(OperationTimeoutError):  # nothing was stored: no session to grant
        with client.get_queue_receiver(
            "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
        ) as receiver:
            receiver.receive_messages(max_wait_time=1)


def test_session_mismatched_receivers_are_refused(client):
    with pytest.raises(ServiceBusError):
        with client.get_queue_receiver("sessions", max_wait_time=1) as receiver:
            receiver.receive_messages(max_wait_time=1)
    with pytest.raises(ServiceBusError):
        with client.get_queue_receiver("plain", session_id="s1", max_wait_time=1) as receiver:
            receiver.receive_messages(max_wait_time=1)


def test_a_session_id_that_is_not_a_string_is_refused(client):
    """The SDK sends session_id=1 as an int: refused (its own test_sessions.py expects
    ServiceBusError), and the session "1" is left as it was (docs/wire.md §6.5)."""
    send(client, "sessions", "1", ["one"])
    with pytest.raises(ServiceBusError) as refused:
        with client.get_queue_receiver("sessions", session_id=1, max_wait_time=5) as receiver:
            receiver.receive_messages(max_wait_time=5)
    assert "amqp:invalid-field" in str(refused.value)
    with client.get_queue_receiver("sessions", session_id="1", max_wait_time=5) as receiver:
        (message,) = receive(receiver, 1)
        assert (str(message), message.delivery_count) == ("one", 0)
        receiver.complete_message(message)


def test_specific_session_is_delivered_in_order_with_many_in_flight(client):
    send(client, "sessions", "ordered", [f"m{i}" for i in range(10)])
    send(client, "sessions", "other", ["x"])
    with client.get_queue_receiver("sessions", session_id="ordered") as receiver:
        assert receiver.session.session_id == "ordered"
        locked_until = receiver.session.locked_until_utc
        assert locked_until is not None and locked_until.timestamp() > time.time() + 30
        messages = receive(receiver, 10)
        assert [str(m) for m in messages] == [f"m{i}" for i in range(10)]
        assert all(m.session_id == "ordered" for m in messages)
        for m in messages:
            receiver.complete_message(m)
    drain_session(client, "sessions", "other")


def test_next_available_session_is_granted_and_echoed(client):
    send(client, "sessions", "next-1", ["a"])
    with client.get_queue_receiver(
        "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == "next-1"
        (message,) = receive(receiver, 1)
        assert str(message) == "a"
        receiver.complete_message(message)


def test_accepting_a_session_with_no_messages_succeeds(client):
    with client.get_queue_receiver("sessions", session_id="empty-session") as receiver:
        assert receiver.session.session_id == "empty-session"
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []


def test_next_available_waits_and_is_woken_by_a_send(client):
    sender = threading.Timer(1.0, send, (client, "sessions", "late", ["late"]))
    sender.start()
    try:
        with client.get_queue_receiver(
            "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=10
        ) as receiver:
            assert receiver.session.session_id == "late"
            (message,) = receive(receiver, 1)
            receiver.complete_message(message)
    finally:
        sender.join()


def test_next_available_times_out_when_no_session_is_free(client):
    with pytest.raises(OperationTimeoutError):
        with client.get_queue_receiver(
            "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
        ) as receiver:
            receiver.receive_messages(max_wait_time=1)


def test_held_session_cannot_be_locked_by_another_receiver(client):
    send(client, "sessions", "held", ["h"])
    with client.get_queue_receiver("sessions", session_id="held") as holder:
        with pytest.raises(SessionCannotBeLockedError):
            with client.get_queue_receiver("sessions", session_id="held") as other:
                other.receive_messages(max_wait_time=1)
        (message,) = receive(holder, 1)
        holder.complete_message(message)


def test_abandoned_message_is_next_with_count_plus_one(client):
    send(client, "sessions", "abandon", ["first", "second"])
    with client.get_queue_receiver("sessions", session_id="abandon") as receiver:
        (first,) = receive(receiver, 1)
        receiver.abandon_message(first)
        (again,) = receive(receiver, 1)
        assert str(again) == "first" and again.delivery_count == 1
        receiver.complete_message(again)
        (second,) = receive(receiver, 1)
        assert str(second) == "second" and second.delivery_count == 0
        receiver.complete_message(second)


def test_closed_receiver_returns_unsettled_messages_without_count(client):
    send(client, "sessions", "closed", ["c0", "c1"])
    with client.get_queue_receiver("sessions", session_id="closed") as receiver:
        assert len(receive(receiver, 2)) == 2  # not settled
    with client.get_queue_receiver("sessions", session_id="closed") as receiver:
        messages = receive(receiver, 2)
        assert [(str(m), m.delivery_count) for m in messages] == [("c0", 0), ("c1", 0)]
        for m in messages:
            receiver.complete_message(m)


def test_expired_session_lock_raises_count_and_loses_the_lock(client):
    send(client, "short", "expiring", ["e0"])
    with client.get_queue_receiver("short", session_id="expiring") as receiver:
        (message,) = receive(receiver, 1)
        time.sleep(2.5)  # LockDuration 2 s, not renewed
        with pytest.raises(SessionLockLostError):
            receiver.complete_message(message)
    with client.get_queue_receiver("short", session_id="expiring") as receiver:
        (again,) = receive(receiver, 1)
        assert str(again) == "e0" and again.delivery_count == 1
        receiver.complete_message(again)


def test_auto_lock_renewer_keeps_the_session(client):
    send(client, "short", "renewed", ["r0", "r1"])
    renewer = AutoLockRenewer(max_lock_renewal_duration=20)
    with client.get_queue_receiver(
        "short", session_id="renewed", auto_lock_renewer=renewer
    ) as receiver:
        (first,) = receive(receiver, 1)
        time.sleep(4)  # twice the lock duration
        receiver.complete_message(first)
        (second,) = receive(receiver, 1)
        assert second.delivery_count == 0
        receiver.complete_message(second)
    renewer.close()


def test_renew_lock_extends_locked_until(client):
    send(client, "short", "renew", ["x"])
    with client.get_queue_receiver("short", session_id="renew") as receiver:
        before = receiver.session.locked_until_utc
        time.sleep(1)
        after = receiver.session.renew_lock()
        assert after > before
        assert receiver.session.locked_until_utc == after
        time.sleep(1.5)  # past the first expiry, within the renewed one
        (message,) = receive(receiver, 1)
        receiver.complete_message(message)


def test_session_state_is_null_until_set_and_survives_the_messages(client):
    send(client, "sessions", "stateful", ["only"])
    with client.get_queue_receiver("sessions", session_id="stateful") as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state(b"\x00\x01binary-state")
        (message,) = receive(receiver, 1)
        receiver.complete_message(message)
    with client.get_queue_receiver("sessions", session_id="stateful") as receiver:
        assert receiver.session.get_state() == b"\x00\x01binary-state"
        receiver.session.set_state(None)
        assert receiver.session.get_state() is None


def test_session_state_larger_than_max_message_size_is_refused(client):
    with client.get_queue_receiver("small", session_id="big-state") as receiver:
        with pytest.raises(ServiceBusError):
            receiver.session.set_state(b"x" * (17 * 1024))
    with client.get_queue_receiver("small", session_id="big-state") as receiver:
        assert receiver.session.get_state() is None


def test_one_expired_message_expires_its_whole_session(client):
    with client.get_queue_sender("ttl") as sender:
        sender.send_messages(
            ServiceBusMessage("short", session_id="doomed", time_to_live=timedelta(seconds=1))
        )
        sender.send_messages(ServiceBusMessage("long", session_id="doomed"))
        sender.send_messages(ServiceBusMessage("other", session_id="fine"))
    time.sleep(1.5)
    with client.get_queue_receiver("ttl", session_id="doomed") as receiver:
        assert receiver.receive_messages(max_message_count=2, max_wait_time=1) == []
    with client.get_queue_receiver("ttl", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        dead = receive(dlq, 2)
        assert sorted(str(m) for m in dead) == ["long", "short"]
        assert {m.dead_letter_reason for m in dead} == {"TTLExpiredException"}
        for m in dead:
            dlq.complete_message(m)
    with client.get_queue_receiver("ttl", session_id="fine") as receiver:
        (message,) = receive(receiver, 1)
        assert str(message) == "other"
        receiver.complete_message(message)


def test_request_reply_over_two_queues(client):
    def responder():
        with client.get_queue_receiver(
            "requests", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=10
        ) as receiver:
            (request,) = receive(receiver, 1)
            with client.get_queue_sender("replies") as sender:
                sender.send_messages(
                    ServiceBusMessage(
                        f"re: {request}",
                        session_id=request.reply_to_session_id,
                        correlation_id=request.message_id,
                    )
                )
            receiver.complete_message(request)

    worker = threading.Thread(target=responder)
    worker.start()
    with client.get_queue_sender("requests") as sender:
        sender.send_messages(
            ServiceBusMessage(
                "ping", session_id="job-1", message_id="req-1", reply_to_session_id="caller-7"
            )
        )
    with client.get_queue_receiver("replies", session_id="caller-7") as replies:
        (reply,) = receive(replies, 1, wait=10)
        assert str(reply) == "re: ping"
        assert reply.correlation_id == "req-1"
        assert reply.session_id == "caller-7"
        replies.complete_message(reply)
    worker.join(timeout=20)


def test_list_sessions_returns_sessions_with_messages_or_state(client):
    send(client, "sessions", "listed-a", ["1"])
    send(client, "sessions", "listed-b", ["2"])
    with client.get_queue_receiver("sessions", session_id="listed-c") as receiver:
        receiver.session.set_state(b"kept")
    ids = (
        set(client.list_queue_sessions("sessions"))
        if hasattr(client, "list_queue_sessions")
        else None
    )
    if ids is None:
        from azure.servicebus.management import ServiceBusAdministrationClient  # noqa: F401
    assert {"listed-a", "listed-b", "listed-c"} <= ids
    for sid in ("listed-a", "listed-b"):
        drain_session(client, "sessions", sid)
    with client.get_queue_receiver("sessions", session_id="listed-c") as receiver:
        receiver.session.set_state(None)
    ids = set(client.list_queue_sessions("sessions"))
    assert not {"listed-a", "listed-b", "listed-c"} & ids


def test_peek_inside_a_session_does_not_lock(client):
    send(client, "sessions", "peeked", ["p0", "p1", "p2"])
    with client.get_queue_receiver("sessions", session_id="peeked") as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in peeked] == ["p0", "p1", "p2"]
        assert [m.sequence_number for m in peeked] == sorted(m.sequence_number for m in peeked)
        messages = receive(receiver, 3)
        assert [m.delivery_count for m in messages] == [0, 0, 0]
        for m in messages:
            receiver.complete_message(m)


def test_no_settlement_fell_back_to_management(busd):
    assert "update-disposition" not in busd.log_text()
