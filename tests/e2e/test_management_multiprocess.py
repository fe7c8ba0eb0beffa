"""Two busd processes over one store: an entity created through one's management API is served
at once by the other, over the management API and over AMQP; a deleted one is refused by both."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
)
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pair(busd_factory):
    prefix = f"e2e-{uuid.uuid4().hex[:10]}"
    return busd_factory([queue("mp-file")], prefix=prefix), busd_factory([], prefix=prefix)


def _admin(busd):
    return ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    )


def test_created_on_one_served_by_the_other_deleted_refused_by_both(pair):
    one, two = pair
    name = f"mp-{uuid.uuid4().hex[:8]}"
    with _admin(one) as admin_one, _admin(two) as admin_two:
        assert "mp-file" in [q.name for q in admin_two.list_queues()]
        admin_one.create_queue(name, requires_session=True, max_delivery_count=3)
        # at once: no waiting for a poll
        got = admin_two.get_queue(name)
        assert got.requires_session is True and got.max_delivery_count == 3
        with ServiceBusClient.from_connection_string(two.connection_string) as client:
            with client.get_queue_sender(name) as sender:
                sender.send_messages(ServiceBusMessage("via two", session_id="s"))
        assert admin_one.get_queue_runtime_properties(name).active_message_count == 1
        with ServiceBusClient.from_connection_string(one.connection_string) as client:
            with client.get_queue_receiver(name, session_id="s") as receiver:
                (message,) = receive(receiver, 1)
                assert str(message) == "via two"
                receiver.complete_message(message)

        admin_two.delete_queue(name)
        for admin in (admin_one, admin_two):
            with pytest.raises(ResourceNotFoundError):
                admin.get_queue(name)
        for busd in (one, two):
            with ServiceBusClient.from_connection_string(
                busd.connection_string, retry_total=0
            ) as client:
                # the put-token for it is answered 404 (busd.broker.links.cbs), else the attach
                # amqp:not-found: either way the SDK gives up on it
                with pytest.raises((MessagingEntityNotFoundError, ServiceBusAuthenticationError)):
                    with client.get_queue_sender(name) as sender:
                        sender.send_messages(ServiceBusMessage("too late"))


def test_updates_reach_the_other_process(pair):
    one, two = pair
    name = f"mp-{uuid.uuid4().hex[:8]}"
    with _admin(one) as admin_one, _admin(two) as admin_two:
        admin_one.create_queue(name, lock_duration=dt.timedelta(seconds=10))
        props = admin_two.get_queue(name)
        props.max_delivery_count = 2
        admin_two.update_queue(props)
        deadline = time.monotonic() + 5
        while admin_one.get_queue(name).max_delivery_count != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert admin_one.get_queue(name).max_delivery_count == 2
        admin_one.delete_queue(name)
