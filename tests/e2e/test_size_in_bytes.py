"""SizeInBytes, as the SDKs' administration clients read it (docs/management.md §4): the bytes
of the messages an entity holds, dead letters included, exact for a few dozen messages and
estimated from a bounded sample past that, so that reading it costs the same however many
messages there are."""

from __future__ import annotations

import pytest
import redis
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

from busd.storage.redis.catalog import SIZE_SAMPLE
from tests.e2e.conftest import command_calls, queue, receive

pytestmark = pytest.mark.timeout(120)

BODY = "s" * 500
MANY = 6 * SIZE_SAMPLE  # well past the exact range (2 * SIZE_SAMPLE per sub-queue)
NO_SWEEP = {"BUSD_SWEEP_INTERVAL": "3600"}


@pytest.fixture(scope="module")
def redis_url(own_redis_url):
    return own_redis_url  # its INFO commandstats count this module's brokers alone


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("size-one"),
            queue("size-many"),
            queue("size-spread", EnablePartitioning=True),
            queue("size-empty"),
            queue("size-unit"),
        ],
        extra_env=NO_SWEEP,
    )


def _size(busd, name: str) -> int:
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as admin:
        return admin.get_queue_runtime_properties(name).size_in_bytes


def _send(busd, name: str, count: int) -> None:
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender(name) as sender:
            for start in range(0, count, 50):
                batch = sender.create_message_batch()
                for i in range(start, min(count, start + 50)):
                    batch.add_message(ServiceBusMessage(BODY, message_id=f"m{i:06d}"))
                sender.send_messages(batch)


@pytest.fixture(scope="module")
def per_message(busd) -> int:
    """The stored size of one message as _send sends it."""
    _send(busd, "size-unit", 1)
    return _size(busd, "size-unit")


def test_size_counts_every_stored_message_dead_letters_included(busd):
    assert _size(busd, "size-empty") == 0
    _send(busd, "size-one", 3)
    three = _size(busd, "size-one")
    one = three // 3
    assert three == 3 * one and len(BODY) < one < len(BODY) + 300  # the body and its sections
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_receiver("size-one", max_wait_time=5) as receiver:
            first, second = receive(receiver, 2)
            receiver.dead_letter_message(first, reason="kept")
            receiver.complete_message(second)
    assert _size(busd, "size-one") == 2 * one  # one left, one dead-lettered


def test_size_of_many_messages_is_estimated_at_a_bounded_cost(busd, redis_url, per_message):
    _send(busd, "size-many", MANY)
    store = redis.Redis.from_url(redis_url)
    before = command_calls(store)
    size = _size(busd, "size-many")
    after = command_calls(store)
    # equal messages: the sample's mean is theirs (the id's digits are of one length)
    assert size == MANY * per_message
    reads = after.get("cmdstat_hstrlen", 0) - before.get("cmdstat_hstrlen", 0)
    assert reads == 2 * SIZE_SAMPLE  # the oldest and the newest, not every message


def test_size_of_a_partitioned_queue_sums_its_partitions(busd, per_message):
    _send(busd, "size-spread", 40)
    assert _size(busd, "size-spread") == 40 * per_message
