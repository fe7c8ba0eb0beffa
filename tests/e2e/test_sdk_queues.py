"""Plain (non-session) queues through the official azure-servicebus SDK, against busd on a real
socket over a real store."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    ServiceBusAuthenticationError,
)

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)
RECEIVE_AND_DELETE = ServiceBusReceiveMode.RECEIVE_AND_DELETE


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("orders"),
            queue("batch"),
            queue("settle"),
            queue("dlq-test"),
            queue("short-lock", LockDuration="PT1S", MaxDeliveryCount=2),
            queue("rad"),
            queue("ttl-dlq", DeadLetteringOnMessageExpiration=True),
            queue("ttl-drop"),
            queue("small", MaxMessageSizeInKilobytes=64),
        ]
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        yield sb


def test_messages_arrive_in_order_with_sequence_numbers(client):
    with client.get_queue_sender("orders") as sender:
        for i in range(5):
            sender.send_messages(ServiceBusMessage(f"m{i}", application_properties={"i": i}))
    with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
        messages = receive(receiver, 5)
        assert [str(m) for m in messages] == [f"m{i}" for i in range(5)]
        seqs = [m.sequence_number for m in messages]
        assert seqs == sorted(seqs) and seqs[0] >= 1 and len(set(seqs)) == 5
        assert all(m.delivery_count == 0 for m in messages)
        assert all(m.enqueued_time_utc is not None for m in messages)
        assert all(m.locked_until_utc is not None for m in messages)
        assert [m.application_properties[b"i"] for m in messages] == list(range(5))
        for m in messages:
            receiver.complete_message(m)
    with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_message_count=5, max_wait_time=1) == []


def test_batch_is_stored_as_separate_messages(client):
    with client.get_queue_sender("batch") as sender:
        batch = sender.create_message_batch()
        for i in range(4):
            batch.add_message(ServiceBusMessage(f"b{i}"))
        sender.send_messages(batch)
        sender.send_messages([ServiceBusMessage("l0"), ServiceBusMessage("l1")])
    with client.get_queue_receiver("batch", receive_mode=RECEIVE_AND_DELETE) as receiver:
        messages = receive(receiver, 6)
    assert [str(m) for m in messages] == ["b0", "b1", "b2", "b3", "l0", "l1"]
    assert len({m.sequence_number for m in messages}) == 6


def test_abandon_increments_delivery_count_and_redelivers_first(client):
    with client.get_queue_sender("settle") as sender:
        sender.send_messages([ServiceBusMessage("first"), ServiceBusMessage("second")])
    with client.get_queue_receiver("settle", max_wait_time=5) as receiver:
        (first,) = receive(receiver, 1)
        assert str(first) == "first"
        receiver.abandon_message(first)
        (again,) = receive(receiver, 1)
        assert str(again) == "first"
        assert again.delivery_count == 1
        assert again.sequence_number == first.sequence_number
        receiver.complete_message(again)
        (second,) = receive(receiver, 1)
        assert str(second) == "second"
        receiver.complete_message(second)


def test_dead_letter_keeps_reason_and_description(client):
    with client.get_queue_sender("dlq-test") as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    with client.get_queue_receiver("dlq-test", max_wait_time=5) as receiver:
        (message,) = receive(receiver, 1)
        receiver.dead_letter_message(message, reason="bad", error_description="very bad")
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    with client.get_queue_receiver(
        "dlq-test", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as dlq:
        (dead,) = receive(dlq, 1)
        assert str(dead) == "poison"
        assert dead.dead_letter_reason == "bad"
        assert dead.dead_letter_error_description == "very bad"
        assert dead.sequence_number == message.sequence_number
        dlq.complete_message(dead)


def test_expired_lock_is_redelivered_and_max_delivery_count_dead_letters(client):
    with client.get_queue_sender("short-lock") as sender:
        sender.send_messages(ServiceBusMessage("slow"))
    with client.get_queue_receiver("short-lock", max_wait_time=5) as receiver:
        (first,) = receive(receiver, 1)
        assert first.delivery_count == 0
        time.sleep(1.5)  # LockDuration is 1 s: let the lock lapse without settling
        (again,) = receive(receiver, 1)
        assert str(again) == "slow" and again.delivery_count == 1
        time.sleep(1.5)  # second lapse reaches MaxDeliveryCount=2
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1.5) == []
    with client.get_queue_receiver(
        "short-lock", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as dlq:
        (dead,) = receive(dlq, 1)
        assert str(dead) == "slow"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(dead)


def test_receive_and_delete_removes_on_delivery(client):
    with client.get_queue_sender("rad") as sender:
        sender.send_messages([ServiceBusMessage("x"), ServiceBusMessage("y")])
    with client.get_queue_receiver("rad", receive_mode=RECEIVE_AND_DELETE) as receiver:
        assert [str(m) for m in receive(receiver, 2)] == ["x", "y"]
    with client.get_queue_receiver("rad", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_message_count=2, max_wait_time=1) == []


def test_expired_message_is_dead_lettered_when_the_queue_says_so(client):
    from datetime import timedelta

    with client.get_queue_sender("ttl-dlq") as sender:
        sender.send_messages(ServiceBusMessage("short-lived", time_to_live=timedelta(seconds=1)))
    time.sleep(1.5)
    with client.get_queue_receiver("ttl-dlq", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    with client.get_queue_receiver(
        "ttl-dlq", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as dlq:
        (dead,) = receive(dlq, 1)
        assert str(dead) == "short-lived"
        assert dead.dead_letter_reason == "TTLExpiredException"
        dlq.complete_message(dead)


def test_expired_message_is_dropped_by_default(client):
    from datetime import timedelta

    with client.get_queue_sender("ttl-drop") as sender:
        sender.send_messages(ServiceBusMessage("gone", time_to_live=timedelta(seconds=1)))
        sender.send_messages(ServiceBusMessage("kept"))
    time.sleep(1.5)
    with client.get_queue_receiver("ttl-drop", max_wait_time=2) as receiver:
        messages = receive(receiver, 1)
        assert [str(m) for m in messages] == ["kept"]
        receiver.complete_message(messages[0])
    with client.get_queue_receiver("ttl-drop", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert dlq.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_wrong_key_is_refused(busd):
    bad = busd.connection_string.replace("SAS_KEY_VALUE", "WRONG_KEY")
    with ServiceBusClient.from_connection_string(bad, retry_total=0) as sb:
        with pytest.raises(ServiceBusAuthenticationError):
            with sb.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("nope"))


def test_unknown_queue_fails_the_put_token_as_in_service_bus(busd):
    # The token for a missing entity is answered 404 (docs/wire.md §3.4); the SDK raises
    # MessagingEntityNotFoundError only with a namespace-wide token (tests/e2e/test_rights.py).
    # No retries: the SDK would ask again three times with back-off before raising.
    with (
        pytest.raises(ServiceBusAuthenticationError) as caught,
        ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client,
    ):
        with client.get_queue_sender("no-such-queue") as sender:
            sender.send_messages(ServiceBusMessage("nope"))
    assert caught.value.inner_exception.status_code == 404


def test_oversized_message_is_refused_and_the_link_keeps_working(client):
    with client.get_queue_sender("small") as sender:
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * (100 * 1024)))
        sender.send_messages(ServiceBusMessage("fits"))
    with client.get_queue_receiver("small", receive_mode=RECEIVE_AND_DELETE) as receiver:
        assert [str(m) for m in receive(receiver, 1)] == ["fits"]


def test_no_settlement_falls_back_to_management(busd):
    # Every settlement above was answered on the link; the $management fallback logs itself.
    assert "update-disposition" not in busd.log_text()
