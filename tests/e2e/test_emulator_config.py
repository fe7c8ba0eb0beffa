"""The sample entities file, laid out as the Service Bus emulator ships its Config.json (topic
`topic.1` with four subscriptions: two correlation rules, one with `//` comments, none, and
a SQL rule with an action), loads, and every entity in it serves the SDK."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from busd.config.entities_file import load_entities
from tests.e2e.conftest import launch_busd, receive

pytestmark = pytest.mark.timeout(120)

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "Config.json"


@pytest.fixture(scope="module")
def busd(redis_url, tmp_path_factory):
    proc = launch_busd(
        redis_url,
        SAMPLE,
        tmp_path_factory.mktemp("emulator-config"),
        prefix=f"e2e-sample-{uuid.uuid4().hex[:8]}",
    )
    yield proc
    proc.stop()


def take(rx, count: int) -> list:
    got = receive(rx, count, wait=2, patience=6)
    for m in got:
        rx.complete_message(m)
    return got


def test_every_queue_of_the_sample_serves_the_sdk(busd):
    found = load_entities(SAMPLE)
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        for queue in found.queues:
            session = "s" if queue.requires_session else None
            with client.get_queue_sender(queue.name) as sender:
                sender.send_messages(ServiceBusMessage(queue.name, session_id=session))
            with client.get_queue_receiver(queue.name, session_id=session, max_wait_time=3) as rx:
                assert [str(m) for m in take(rx, 1)] == [queue.name]


def test_topic_1_routes_as_its_rules_say(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_topic_sender("topic.1") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("json", content_type="application/json"),
                    ServiceBusMessage("prop", application_properties={"prop1": "value1"}),
                    ServiceBusMessage(
                        "sql", message_id="123456", application_properties={"userProp1": "value1"}
                    ),
                    ServiceBusMessage("none"),
                ]
            )
        bodies = {}
        expected = {
            "subscription.1": 1,
            "subscription.2": 1,
            "subscription.3": 4,
            "subscription.4": 1,
        }
        for sub, count in expected.items():
            with client.get_subscription_receiver("topic.1", sub, max_wait_time=2) as rx:
                got = take(rx, count)
                # Nothing more than its rules took is stored there (peek does not wait).
                got += rx.peek_messages(max_message_count=10)
                bodies[sub] = [str(m) for m in got]
                if sub == "subscription.4":
                    assert [(m.to, m.application_properties[b"RuleName"]) for m in got] == [
                        ("Entity", b"sql-filter-1")
                    ]
    assert bodies == {
        "subscription.1": ["json"],
        "subscription.2": ["prop"],
        "subscription.3": ["json", "prop", "sql", "none"],
        "subscription.4": ["sql"],
    }
