"""Limits of a real busd process as clients meet them (docs/design.md §3.12): the SDK, which
puts its token at once, is never caught by the time-out for unauthenticated connections; a
plain client that puts none is closed with `amqp:unauthorized-access`."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from proton import ConnectionException
from proton.utils import BlockingConnection

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("limits")], extra_env={"BUSD_AUTH_TIMEOUT": "1"})


def test_an_sdk_connection_outlives_the_auth_time_out(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("limits") as sender:
            sender.send_messages(ServiceBusMessage("before"))
            time.sleep(1.5)
            sender.send_messages(ServiceBusMessage("after"))
        with client.get_queue_receiver("limits", max_wait_time=5) as receiver:
            got = receive(receiver, 2)
            for message in got:
                receiver.complete_message(message)
    assert sorted(str(m) for m in got) == ["after", "before"]


def test_a_connection_without_a_token_is_closed_unauthorized(busd):
    conn = BlockingConnection(
        f"amqp://127.0.0.1:{busd.port}", allowed_mechs="ANONYMOUS", timeout=10
    )
    try:
        time.sleep(1.5)
        with pytest.raises(ConnectionException) as raised:
            conn.create_sender("limits")
        assert "amqp:unauthorized-access" in str(raised.value)
    finally:
        try:
            conn.close()
        except Exception:
            pass
