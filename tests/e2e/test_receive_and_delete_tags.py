"""Receive-and-delete deliveries are sent settled with the one-byte tag 00 (docs/wire.md §6.4):
a tag is there, which the Java SDK's proton-j needs (an empty one proton sends as none), and
no SDK takes it for a lock token; proton takes several such deliveries in a row; peek-lock
deliveries keep the lock token as their tag."""

from __future__ import annotations

import uuid
import warnings

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from cproton import lib
from proton import Message
from proton.reactor import AtMostOnce

from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("rad"), queue("locks"), queue("raw")])


def test_the_sdk_shows_no_lock_token_in_receive_and_delete(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("rad") as sender:
            sender.send_messages([ServiceBusMessage("hello"), ServiceBusMessage("again")])
        with client.get_queue_receiver(
            "rad", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            messages = receive(receiver, 2)
    assert [str(m) for m in messages] == ["hello", "again"]
    for message in messages:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # `.message`: the SDK's own
            legacy = message.message
        assert legacy.settled and legacy.delivery_tag == b"\x00" and legacy.delivery_no >= 0
        assert message.lock_token is None


def test_peek_lock_deliveries_carry_the_lock_token_as_their_tag(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("locks") as sender:
            sender.send_messages(ServiceBusMessage("locked"))
        with client.get_queue_receiver("locks", max_wait_time=5) as receiver:
            (message,) = receive(receiver, 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                tag = message.message.delivery_tag
            assert uuid.UUID(bytes_le=tag) == message.lock_token
            receiver.complete_message(message)


def test_proton_takes_settled_deliveries_with_one_byte_tags(busd):
    with ProtonCbsClient(busd.port) as client:
        client.authorize("raw")
        sender = client.sender("raw")
        for i in range(3):
            sender.send(Message(body=f"raw-{i}"))
        receiver = client.conn.create_receiver(
            "raw", credit=10, name=f"rad-{uuid.uuid4()}", options=AtMostOnce()
        )
        fetcher = receiver.fetcher
        client.conn.wait(lambda: fetcher.has_message >= 3, timeout=5)
        arrived = list(fetcher.incoming)
        assert [m.body for m, _ in arrived] == ["raw-0", "raw-1", "raw-2"]
        assert all(d.settled for _, d in arrived)
        # a tag on the wire (proton-j takes no transfer without one), of one byte
        assert [lib.pn_delivery_tag(d._impl).size for _, d in arrived] == [1, 1, 1]
        assert [d.tag for _, d in arrived] == ["\x00"] * 3  # python-qpid-proton decodes tags
