"""Auto-forwarding from a partitioned queue or subscription, as Service Bus accepts it (the
SDK's own test_mgmt_queue_create_with_queue_description creates a partitioned session queue
forwarding to a topic): every partition's messages move, each partition under its own lease,
its dead letters too. Forwarding to a partitioned entity stays refused."""

from __future__ import annotations

import datetime
import uuid

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("seed")])


@pytest.fixture(scope="module")
def admin(busd):
    with ServiceBusAdministrationClient.from_connection_string(
        busd.connection_string, connection_verify=busd.cert_path
    ) as client:
        yield client


@pytest.fixture(scope="module")
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


def _name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def drain(client, name: str, count: int, **kwargs) -> list[str]:
    with client.get_queue_receiver(name, max_wait_time=2, **kwargs) as rx:
        got = receive(rx, count, wait=2, patience=15)
        for m in got:
            rx.complete_message(m)
        return sorted(str(m) for m in got)


def test_the_sdks_partitioned_session_queue_forwarding_to_a_topic(busd, admin, client):
    """The SDK test's own creation, then its messages through the topic."""
    topic = _name("aghadh")
    admin.create_topic(topic)
    admin.create_subscription(topic, "all")
    source = _name("iweidk")
    admin.create_queue(
        source,
        auto_delete_on_idle=datetime.timedelta(minutes=10),
        dead_lettering_on_message_expiration=True,
        default_message_time_to_live=datetime.timedelta(minutes=11),
        duplicate_detection_history_time_window=datetime.timedelta(minutes=12),
        enable_batched_operations=True,
        enable_express=True,
        enable_partitioning=True,
        forward_dead_lettered_messages_to=topic,
        forward_to=topic,
        lock_duration=datetime.timedelta(seconds=13),
        max_delivery_count=14,
        max_size_in_megabytes=3072,
        requires_session=True,
    )
    found = admin.get_queue(source)
    assert found.enable_partitioning and found.requires_session
    assert found.forward_to.endswith(f"/{topic}")
    assert found.forward_dead_lettered_messages_to.endswith(f"/{topic}")
    sessions = [f"s{i}" for i in range(12)]  # spread over the partitions
    with client.get_queue_sender(source) as sender:
        sender.send_messages([ServiceBusMessage(f"m-{s}", session_id=s) for s in sessions])
    with client.get_subscription_receiver(topic, "all", max_wait_time=2) as rx:
        got = receive(rx, len(sessions), wait=2, patience=15)
        for m in got:
            rx.complete_message(m)
    assert sorted(str(m) for m in got) == sorted(f"m-{s}" for s in sessions)
    assert {m.session_id for m in got} == set(sessions)
    assert admin.get_queue_runtime_properties(source).total_message_count == 0


def test_a_partitioned_queue_and_its_dead_letters_forward(busd, admin, client):
    out, dead = _name("out"), _name("dead")
    admin.create_queue(out)
    admin.create_queue(dead)
    source = _name("parted")
    admin.create_queue(source, enable_partitioning=True, max_delivery_count=1)
    with client.get_queue_sender(source) as sender:  # dead-lettered before forwarding starts
        sender.send_messages([ServiceBusMessage(f"d{i}", message_id=f"d{i}") for i in range(6)])
    with client.get_queue_receiver(source, max_wait_time=2) as rx:
        for m in receive(rx, 6, wait=2, patience=15):
            rx.dead_letter_message(m, reason="test")
    found = admin.get_queue(source)
    found.forward_to = out
    found.forward_dead_lettered_messages_to = dead
    admin.update_queue(found)
    with client.get_queue_sender(source) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(10)])
    assert drain(client, out, 10) == sorted(f"m{i}" for i in range(10))
    assert drain(client, dead, 6) == sorted(f"d{i}" for i in range(6))
    counts = admin.get_queue_runtime_properties(source)
    assert counts.total_message_count == 0 and counts.dead_letter_message_count == 0


def test_forwarding_to_a_partitioned_entity_stays_refused(busd, admin):
    target = _name("ptarget")
    admin.create_queue(target, enable_partitioning=True)
    with pytest.raises(HttpResponseError) as refused:
        admin.create_queue(_name("src"), forward_to=target)
    assert refused.value.status_code == 400 and "partitioned" in str(refused.value)
