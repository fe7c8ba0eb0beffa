"""Message lifecycle over $management through the official SDK: renew-lock, defer and
receive-by-sequence-number, scheduling and cancelling, peeking, duplicate detection."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageNotFoundError, ServiceBusError

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)
RECEIVE_AND_DELETE = ServiceBusReceiveMode.RECEIVE_AND_DELETE


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("renew", LockDuration="PT2S"),
            queue("defer"),
            queue("sdefer", RequiresSession=True),
            queue("sched"),
            queue("ssched", RequiresSession=True),
            queue("peek"),
            queue(
                "dedup", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT2S"
            ),
        ]
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


def test_renew_message_lock_extends_the_lock(client):
    with client.get_queue_sender("renew") as sender:
        sender.send_messages(ServiceBusMessage("long job"))
    with client.get_queue_receiver("renew") as receiver:
        (message,) = receive(receiver, 1)
        first = message.locked_until_utc
        time.sleep(1)
        renewed = receiver.renew_message_lock(message)
        assert renewed > first
        time.sleep(1.5)  # past the first lock, inside the renewed one
        receiver.complete_message(message)
    with client.get_queue_receiver("renew") as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_auto_lock_renewer_keeps_a_message_lock(client):
    with client.get_queue_sender("renew") as sender:
        sender.send_messages(ServiceBusMessage("longer job"))
    renewer = AutoLockRenewer(max_lock_renewal_duration=20)
    with client.get_queue_receiver("renew", auto_lock_renewer=renewer) as receiver:
        (message,) = receive(receiver, 1)
        time.sleep(4)
        receiver.complete_message(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    renewer.close()


def test_deferred_message_is_hidden_until_fetched_by_sequence_number(client):
    with client.get_queue_sender("defer") as sender:
        sender.send_messages([ServiceBusMessage("later"), ServiceBusMessage("now")])
    with client.get_queue_receiver("defer") as receiver:
        (later,) = receive(receiver, 1)
        receiver.defer_message(later)
        (now,) = receive(receiver, 1)
        assert str(now) == "now"
        receiver.complete_message(now)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
        peeked = receiver.peek_messages(max_message_count=5, sequence_number=later.sequence_number)
        assert [(str(m), m.state.value) for m in peeked] == [("later", 1)]
        (fetched,) = receiver.receive_deferred_messages([later.sequence_number])
        assert str(fetched) == "later" and fetched.lock_token is not None
        receiver.complete_message(fetched)
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages([later.sequence_number])


def test_deferred_message_can_be_dead_lettered_through_management(client):
    with client.get_queue_sender("defer") as sender:
        sender.send_messages(ServiceBusMessage("to dlq"))
    with client.get_queue_receiver("defer") as receiver:
        (message,) = receive(receiver, 1)
        receiver.defer_message(message)
        (fetched,) = receiver.receive_deferred_messages([message.sequence_number])
        receiver.dead_letter_message(fetched, reason="why", error_description="because")
    with client.get_queue_receiver("defer", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (dead,) = receive(dlq, 1)
        assert (str(dead), dead.dead_letter_reason, dead.dead_letter_error_description) == (
            "to dlq",
            "why",
            "because",
        )
        dlq.complete_message(dead)


def test_receive_deferred_in_receive_and_delete_mode_deletes(client):
    with client.get_queue_sender("defer") as sender:
        sender.send_messages(ServiceBusMessage("once"))
    with client.get_queue_receiver("defer") as receiver:
        (message,) = receive(receiver, 1)
        receiver.defer_message(message)
    with client.get_queue_receiver("defer", receive_mode=RECEIVE_AND_DELETE) as r:
        (fetched,) = r.receive_deferred_messages([message.sequence_number])
        assert str(fetched) == "once"
        with pytest.raises(MessageNotFoundError):
            r.receive_deferred_messages([message.sequence_number])


def test_deferred_session_message_stays_in_its_session(client):
    with client.get_queue_sender("sdefer") as sender:
        sender.send_messages([ServiceBusMessage(b, session_id="d1") for b in ("a", "b")])
    with client.get_queue_receiver("sdefer", session_id="d1") as receiver:
        (a,) = receive(receiver, 1)
        receiver.defer_message(a)
        (b,) = receive(receiver, 1)
        receiver.complete_message(b)
        (fetched,) = receiver.receive_deferred_messages([a.sequence_number])
        assert str(fetched) == "a" and fetched.session_id == "d1"
        receiver.complete_message(fetched)


def test_scheduled_message_is_invisible_until_due_and_can_be_cancelled(client):
    # Links are opened first so that connection set-up does not eat into the delay.
    with client.get_queue_sender("sched") as sender, client.get_queue_receiver("sched") as receiver:
        receiver.peek_messages(max_message_count=1)
        due = datetime.now(UTC) + timedelta(seconds=3)
        keep, cancel = sender.schedule_messages(
            [ServiceBusMessage("scheduled"), ServiceBusMessage("cancelled")], due
        )
        assert keep < cancel
        sender.cancel_scheduled_messages(cancel)
        with pytest.raises(ServiceBusError):
            sender.cancel_scheduled_messages(cancel)
        peeked = receiver.peek_messages(max_message_count=5, sequence_number=keep)
        assert [(str(m), m.state.value) for m in peeked] == [("scheduled", 2)]
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        assert datetime.now(UTC) < due  # the empty receive happened before the due time
        messages = receive(receiver, 1, wait=5)
        assert [str(m) for m in messages] == ["scheduled"]
        assert messages[0].sequence_number == keep
        receiver.complete_message(messages[0])
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_scheduled_enqueue_time_on_send_delays_delivery(client):
    with client.get_queue_sender("sched") as sender, client.get_queue_receiver("sched") as receiver:
        receiver.peek_messages(max_message_count=1)
        message = ServiceBusMessage("via annotation")
        due = datetime.now(UTC) + timedelta(seconds=3)
        message.scheduled_enqueue_time_utc = due
        sender.send_messages(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        assert datetime.now(UTC) < due
        (got,) = receive(receiver, 1, wait=5)
        assert str(got) == "via annotation"
        receiver.complete_message(got)


def test_scheduled_session_message_joins_its_session_when_due(client):
    with client.get_queue_sender("ssched") as sender:
        sender.schedule_messages(
            ServiceBusMessage("later", session_id="ss"), datetime.now(UTC) + timedelta(seconds=3)
        )
        sender.send_messages(ServiceBusMessage("now", session_id="ss"))
    with client.get_queue_receiver("ssched", session_id="ss") as receiver:
        (now,) = receive(receiver, 1)
        assert str(now) == "now"
        receiver.complete_message(now)
        (later,) = receive(receiver, 1, wait=6)
        assert str(later) == "later"
        receiver.complete_message(later)


def test_peek_pages_through_the_queue_without_locking(client):
    with client.get_queue_sender("peek") as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(5)])
    with client.get_queue_receiver("peek") as receiver:
        first = receiver.peek_messages(max_message_count=3)
        second = receiver.peek_messages(max_message_count=3)  # continues after the last one
        assert [str(m) for m in first] == ["p0", "p1", "p2"]
        assert [str(m) for m in second] == ["p3", "p4"]
        messages = receive(receiver, 5)
        assert [m.delivery_count for m in messages] == [0] * 5
        for m in messages:
            receiver.complete_message(m)


def test_duplicate_message_id_is_dropped_inside_the_window(client):
    with client.get_queue_sender("dedup") as sender:
        sender.send_messages(ServiceBusMessage("one", message_id="same"))
        sender.send_messages(ServiceBusMessage("two", message_id="same"))
        sender.send_messages(ServiceBusMessage("other", message_id="different"))
    with client.get_queue_receiver("dedup", receive_mode=RECEIVE_AND_DELETE) as r:
        assert [str(m) for m in receive(r, 2)] == ["one", "other"]
        assert r.receive_messages(max_message_count=1, max_wait_time=0.5) == []
    time.sleep(2.2)  # the window is 2 s
    with client.get_queue_sender("dedup") as sender:
        sender.send_messages(ServiceBusMessage("three", message_id="same"))
    with client.get_queue_receiver("dedup", receive_mode=RECEIVE_AND_DELETE) as r:
        assert [str(m) for m in receive(r, 1)] == ["three"]


def test_peek_on_the_dead_letter_queue(client):
    with client.get_queue_sender("peek") as sender:
        sender.send_messages(ServiceBusMessage("dead"))
    with client.get_queue_receiver("peek") as receiver:
        (message,) = receive(receiver, 1)
        receiver.dead_letter_message(message, reason="r")
    with client.get_queue_receiver("peek", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (peeked,) = dlq.peek_messages(max_message_count=5)
        assert str(peeked) == "dead" and peeked.dead_letter_reason == "r"


def test_scheduled_messages_take_part_in_duplicate_detection(client):
    with client.get_queue_sender("dedup") as sender:
        sender.schedule_messages(
            ServiceBusMessage("scheduled", message_id="sched-dup"),
            datetime.now(UTC) + timedelta(seconds=1),
        )
        sender.send_messages(ServiceBusMessage("duplicate", message_id="sched-dup"))
    with client.get_queue_receiver("dedup", receive_mode=RECEIVE_AND_DELETE) as r:
        assert [str(m) for m in receive(r, 1, wait=4)] == ["scheduled"]
        assert r.receive_messages(max_message_count=1, max_wait_time=0.5) == []
