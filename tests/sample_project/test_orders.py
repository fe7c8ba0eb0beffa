"""Queues made for one test each: what a test sends is all its queue holds, on one broker
shared by every test of the session (of the worker, under pytest-xdist)."""

from datetime import timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from helpers import receive_all


@pytest.mark.parametrize("count", [1, 3, 5])
def test_a_queue_holds_only_what_its_test_sent(busd_broker, busd_queue_factory, count):
    queue = busd_queue_factory()
    with ServiceBusClient.from_connection_string(busd_broker.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"{queue} #{i}") for i in range(count)])
        with client.get_queue_receiver(queue) as receiver:
            got = receive_all(receiver, count)
            for message in got:
                receiver.complete_message(message)
            assert [str(m) for m in got] == [f"{queue} #{i}" for i in range(count)]
            assert receiver.peek_messages(max_message_count=10) == []


def test_a_session_queue_with_its_properties(busd_broker, busd_queue_factory):
    queue = busd_queue_factory(
        requires_session=True, max_delivery_count=2, lock_duration=timedelta(seconds=10)
    )
    admin = ServiceBusAdministrationClient.from_connection_string(
        busd_broker.admin_connection_string, connection_verify=busd_broker.cert_path
    )
    with admin:
        props = admin.get_queue(queue)
    assert props.requires_session and props.max_delivery_count == 2
    assert props.lock_duration == timedelta(seconds=10)
    with ServiceBusClient.from_connection_string(busd_broker.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(
                [ServiceBusMessage(f"step {i}", session_id="order-42") for i in range(3)]
            )
        with client.get_queue_receiver(
            queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver:
            assert receiver.session.session_id == "order-42"
            got = receive_all(receiver, 3)
            assert [str(m) for m in got] == ["step 0", "step 1", "step 2"]
            for message in got:
                receiver.complete_message(message)


def test_two_queues_of_one_test_are_two_queues(busd_queue_factory):
    assert busd_queue_factory() != busd_queue_factory()
