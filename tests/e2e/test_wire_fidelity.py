"""What the official SDK reads from busd the way it reads it from Service Bus: delivery
annotations, a received message sent again, deferred state, decimal properties, the empty
session id, the session lock at the end of a receive wait (docs/wire.md §5.3, §6.3, §8.4.7)."""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import SessionLockLostError

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("plain"),
            queue("sessions", RequiresSession=True),
            queue("short", RequiresSession=True, LockDuration="PT2S"),
        ]
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


# --- 1: delivery-annotations ----------------------------------------------------------------


def _annotated(body: bytes) -> AmqpAnnotatedMessage:
    return AmqpAnnotatedMessage(
        data_body=body,
        delivery_annotations={"x-app-hop": "first", "x-opt-lock-token": "forged"},
    )


def test_peek_lock_delivery_carries_the_lock_token_and_the_senders_annotations(client):
    with client.get_queue_sender("plain") as sender:
        sender.send_messages(_annotated(b"annotated"))
    with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
        (message,) = receive(receiver, 1)
        annotations = message.raw_amqp_message.delivery_annotations
        assert annotations[b"x-opt-lock-token"] == message.lock_token  # never the sender's
        assert isinstance(annotations[b"x-opt-lock-token"], uuid.UUID)
        assert annotations[b"x-app-hop"] == b"first"
        receiver.complete_message(message)


def test_receive_and_delete_delivery_keeps_the_senders_annotations_without_a_lock(client):
    with client.get_queue_sender("plain") as sender:
        sender.send_messages(_annotated(b"annotated"))
    with client.get_queue_receiver(
        "plain", max_wait_time=5, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as rx:
        (message,) = receive(rx, 1)
        annotations = message.raw_amqp_message.delivery_annotations
        assert annotations == {b"x-app-hop": b"first"}


def test_receive_and_delete_delivery_without_annotations_has_an_empty_map(client):
    """Service Bus sends the delivery-annotations section even with nothing in it: the SDK
    reads {} (its own test_message_backcompat_receive_and_delete_databody), not None."""
    with client.get_queue_sender("plain") as sender:
        sender.send_messages(ServiceBusMessage(b"bare"))
    with client.get_queue_receiver(
        "plain", max_wait_time=5, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as rx:
        (message,) = receive(rx, 1)
    assert message.raw_amqp_message.delivery_annotations == {}
    assert message.message.delivery_annotations == {}
    assert message.lock_token is None


def test_aio_session_delivery_carries_the_lock_token(busd):
    async def main():
        async with AsyncServiceBusClient.from_connection_string(busd.connection_string) as sb:
            async with sb.get_queue_sender("sessions") as sender:
                await sender.send_messages(ServiceBusMessage(b"s", session_id="da"))
            async with sb.get_queue_receiver(
                "sessions", session_id="da", max_wait_time=5
            ) as receiver:
                (message,) = await receiver.receive_messages(max_wait_time=5)
                annotations = message.raw_amqp_message.delivery_annotations
                token = message.lock_token  # None once settled
                await receiver.complete_message(message)
                return annotations, token

    annotations, token = asyncio.run(main())
    assert annotations == {b"x-opt-lock-token": token}


# --- 4: a received message sent again ---------------------------------------------------------


def test_a_received_message_can_be_sent_again(client):
    with client.get_queue_sender("sessions") as sender:
        sender.send_messages(
            ServiceBusMessage(
                b"again", session_id="fw", partition_key="fw", application_properties={"k": "v"}
            )
        )
    with client.get_queue_receiver("sessions", session_id="fw", max_wait_time=5) as receiver:
        (first,) = receive(receiver, 1)
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages(first)  # the forward/retry pattern: partition key as binary
        receiver.complete_message(first)
        (second,) = receive(receiver, 1)
        assert second.sequence_number != first.sequence_number
        assert (str(second), second.session_id, second.partition_key) == ("again", "fw", "fw")
        assert second.application_properties == {b"k": b"v"}
        receiver.complete_message(second)


def test_aio_a_received_message_can_be_sent_again(busd):
    async def main():
        async with AsyncServiceBusClient.from_connection_string(busd.connection_string) as sb:
            async with sb.get_queue_sender("sessions") as sender:
                await sender.send_messages(
                    ServiceBusMessage(b"again", session_id="fw-aio", partition_key="fw-aio")
                )
            async with sb.get_queue_receiver(
                "sessions", session_id="fw-aio", max_wait_time=5
            ) as receiver:
                (first,) = await receiver.receive_messages(max_wait_time=5)
                async with sb.get_queue_sender("sessions") as sender:
                    await sender.send_messages(first)
                await receiver.complete_message(first)
                (second,) = await receiver.receive_messages(max_wait_time=5)
                await receiver.complete_message(second)
                return second.session_id, second.partition_key

    assert asyncio.run(main()) == ("fw-aio", "fw-aio")


# --- 5: deferred messages come back as Deferred -------------------------------------------------


def test_deferred_message_fetched_by_sequence_number_is_deferred(client):
    with client.get_queue_sender("plain") as sender:
        sender.send_messages(ServiceBusMessage(b"later"))
    with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
        (message,) = receive(receiver, 1)
        assert message.state == ServiceBusMessageState.ACTIVE
        receiver.defer_message(message)
        (deferred,) = receiver.receive_deferred_messages([message.sequence_number])
        assert deferred.state == ServiceBusMessageState.DEFERRED
        (peeked,) = receiver.peek_messages(1, sequence_number=message.sequence_number)
        assert peeked.state == ServiceBusMessageState.DEFERRED
        receiver.complete_message(deferred)


def test_aio_deferred_session_message_is_deferred(busd):
    async def main():
        async with AsyncServiceBusClient.from_connection_string(busd.connection_string) as sb:
            async with sb.get_queue_sender("sessions") as sender:
                await sender.send_messages(ServiceBusMessage(b"later", session_id="defer"))
            async with sb.get_queue_receiver(
                "sessions", session_id="defer", max_wait_time=5
            ) as receiver:
                (message,) = await receiver.receive_messages(max_wait_time=5)
                await receiver.defer_message(message)
                (deferred,) = await receiver.receive_deferred_messages([message.sequence_number])
                await receiver.complete_message(deferred)
                return deferred.state

    assert asyncio.run(main()) == ServiceBusMessageState.DEFERRED


# --- 6: decimal application properties -------------------------------------------------------

DECIMALS = {
    "price": Decimal("1.5"),
    "neg": Decimal("-2.25"),
    "whole": Decimal("100"),
    "pi": Decimal("3.14159265"),
}


@pytest.mark.parametrize(
    "mode", [ServiceBusReceiveMode.PEEK_LOCK, ServiceBusReceiveMode.RECEIVE_AND_DELETE]
)
def test_decimal_application_properties_are_readable(client, mode):
    props = {**DECIMALS, "text": "kept"}
    with client.get_queue_sender("plain") as sender:
        sender.send_messages(ServiceBusMessage(b"priced", application_properties=props))
    with client.get_queue_receiver("plain", max_wait_time=5, receive_mode=mode) as receiver:
        (message,) = receive(receiver, 1)
        got = message.application_properties
        assert {k.decode(): v for k, v in got.items() if k != b"text"} == DECIMALS
        assert got[b"text"] == b"kept"
        if mode == ServiceBusReceiveMode.PEEK_LOCK:
            receiver.complete_message(message)


def test_aio_decimal_application_property_in_a_session(busd):
    async def main():
        async with AsyncServiceBusClient.from_connection_string(busd.connection_string) as sb:
            async with sb.get_queue_sender("sessions") as sender:
                await sender.send_messages(
                    ServiceBusMessage(
                        b"d", session_id="dec", application_properties={"p": Decimal("0.05")}
                    )
                )
            async with sb.get_queue_receiver(
                "sessions",
                session_id="dec",
                max_wait_time=5,
                receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            ) as receiver:
                (message,) = await receiver.receive_messages(max_wait_time=5)
                return message.application_properties[b"p"]

    assert asyncio.run(main()) == Decimal("0.05")


# --- 7: the empty session id ------------------------------------------------------------------


def test_empty_session_id_is_a_session(client):
    with client.get_queue_sender("sessions") as sender:
        sender.send_messages([ServiceBusMessage(f"e{i}", session_id="") for i in range(2)])
        sender.send_messages(ServiceBusMessage(b"other", session_id="not-empty"))
    assert {"", "not-empty"} <= set(client.list_queue_sessions("sessions"))
    with client.get_queue_receiver("sessions", session_id="", max_wait_time=5) as receiver:
        assert receiver.session.session_id == ""
        got = receive(receiver, 2)
        assert [(str(m), m.session_id) for m in got] == [("e0", ""), ("e1", "")]
        receiver.session.set_state(b"empty's state")
        assert receiver.session.get_state() == b"empty's state"
        receiver.session.renew_lock()
        peeked = receiver.peek_messages(5, sequence_number=got[0].sequence_number)
        assert [str(m) for m in peeked] == ["e0", "e1"]  # its own session's only
        for m in got:
            receiver.complete_message(m)
    # the next available session is the other one: "" is not "any session"
    with client.get_queue_receiver("sessions", session_id="not-empty", max_wait_time=5) as receiver:
        (m,) = receive(receiver, 1)
        receiver.complete_message(m)
    with client.get_queue_receiver("sessions", session_id="", max_wait_time=5) as receiver:
        assert receiver.session.get_state() == b"empty's state"
        receiver.session.set_state(None)
    assert "" not in set(client.list_queue_sessions("sessions"))


def test_aio_empty_session_id(busd):
    async def main():
        async with AsyncServiceBusClient.from_connection_string(busd.connection_string) as sb:
            async with sb.get_queue_sender("sessions") as sender:
                await sender.send_messages(ServiceBusMessage(b"aio-empty", session_id=""))
            async with sb.get_queue_receiver(
                "sessions", session_id="", max_wait_time=5
            ) as receiver:
                (message,) = await receiver.receive_messages(max_wait_time=5)
                await receiver.complete_message(message)
                return str(message), message.session_id

    assert asyncio.run(main()) == ("aio-empty", "")


# --- 8: the session lock at the end of a receive wait -----------------------------------------


def test_a_receive_waiting_as_long_as_the_session_lock_ends_on_its_own(client):
    """LockDuration 2 s and max_wait_time 2 s, as the SDK's own tests iterate a session (10 s
    and 10 s there): the iteration ends when the wait runs out, not with SessionLockLostError;
    the lock is lost all the same, and the next operation says so."""
    with client.get_queue_sender("short") as sender:
        sender.send_messages([ServiceBusMessage(f"x{i}", session_id="edge") for i in range(3)])
    with client.get_queue_receiver("short", session_id="edge", max_wait_time=2) as receiver:
        got = []
        for message in receiver:
            got.append(str(message))
            receiver.complete_message(message)
        assert got == ["x0", "x1", "x2"]
        time.sleep(2.5)
        with pytest.raises(SessionLockLostError):
            receiver.receive_messages(max_wait_time=1)
