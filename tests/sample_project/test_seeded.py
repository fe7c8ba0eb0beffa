"""A broker seeded from the project's Config.json, for the tests that name it."""

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage


@pytest.mark.busd_config("Config.json")
def test_the_config_file_queue_is_there(busd_test_broker, busd_broker):
    assert busd_test_broker is not busd_broker  # the session's default broker has no such queue
    with ServiceBusClient.from_connection_string(busd_test_broker.connection_string) as client:
        with client.get_queue_sender("invoices") as sender:
            sender.send_messages(ServiceBusMessage("due", session_id="customer-7"))
        with client.get_queue_receiver(
            "invoices", session_id="customer-7", max_wait_time=5
        ) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert str(message) == "due"
            receiver.complete_message(message)


def test_the_default_broker_has_no_such_queue(busd_broker):
    assert not busd_broker.management.exists("invoices")
