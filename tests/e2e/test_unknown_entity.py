"""A mistyped entity name shows in busd's log: at INFO, once per entity and client connection
(its container id), however often the client retries, and at most a bounded number of lines a
minute however many names a client tries. The client's answer is Service Bus's (a put-token
answered 404: the SDK raises ServiceBusAuthenticationError, the name in its inner exception)."""

from __future__ import annotations

import re
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError
from proton.utils import LinkDetached

from busd.broker.links.unknown_entities import LINES_PER_MINUTE
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import cbs_refusal, queue

pytestmark = pytest.mark.timeout(120)


def lines_naming(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if f"no entity '{name}'" in line]


def wait_for_lines(busd, name: str, count: int, timeout: float = 5) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = lines_naming(busd.log_text(), name)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_mistyped_queue_is_logged_once_and_the_sdk_keeps_its_name(busd_factory):
    busd = busd_factory([queue("orders")])
    # retries shortened as the troubleshooting notes say: the answer comes at once
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=1) as client:
        with pytest.raises(ServiceBusAuthenticationError) as info:
            with client.get_queue_sender("ordres") as sender:
                sender.send_messages(ServiceBusMessage("lost"))
    status, description = cbs_refusal(info.value)
    assert status == 404 and "ordres" in description  # the inner exception keeps the name
    (line,) = wait_for_lines(busd, "ordres", 1)
    assert " INFO " in line and "a put-token" in line and "peer=127.0.0.1:" in line
    time.sleep(0.3)
    # its retry, on a new socket with the same container id, was not logged again
    assert busd.log_text().count("container=SBSender-") >= 4  # two sockets: opened, closed
    assert len(lines_naming(busd.log_text(), "ordres")) == 1


def test_each_connection_is_logged_once_per_name_and_lines_are_rate_limited(busd_factory):
    busd = busd_factory([queue("orders")])
    with ProtonCbsClient(busd.port) as client:
        client.authorize("")  # a namespace-wide token: the attach is what finds no entity
        for _ in range(3):
            with pytest.raises(LinkDetached, match="could not be found"):
                client.sender("nope")
        assert len(wait_for_lines(busd, "nope", 1)) == 1
        time.sleep(0.3)
        assert len(lines_naming(busd.log_text(), "nope")) == 1
    with ProtonCbsClient(busd.port) as other:  # another connection: its own line
        other.authorize("")
        with pytest.raises(LinkDetached):
            other.sender("nope")
        assert len(wait_for_lines(busd, "nope", 2)) == 2
        names = [f"guess-{i}" for i in range(LINES_PER_MINUTE + 20)]
        for name in names:
            with pytest.raises(LinkDetached):
                other.sender(name)
        other.sender("orders").close()  # the connection still serves
    time.sleep(0.5)
    logged = re.findall(r"no entity 'guess-\d+'", busd.log_text())
    assert 0 < len(logged) < LINES_PER_MINUTE  # the allowance of a minute, less what went
