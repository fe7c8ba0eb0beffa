"""busd.testing.BusdBroker outside pytest's fixtures: a real busd as a context manager."""

from __future__ import annotations

import socket
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

from busd.testing import BusdBroker, BusdStartError
from busd.testing.management import ManagementError

pytestmark = pytest.mark.timeout(120)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_a_broker_over_a_given_store_serves_and_leaves_nothing(redis_url: str) -> None:
    with BusdBroker(redis_url=redis_url) as broker:
        prefix, port = broker.key_prefix, broker.port
        with urllib.request.urlopen(f"{broker.http_url}/health", timeout=5) as answer:
            assert answer.status == 200
        queue = broker.management.create_queue(
            "orders", requires_session=True, lock_duration=timedelta(seconds=7)
        )
        with ServiceBusAdministrationClient.from_connection_string(
            broker.admin_connection_string, connection_verify=broker.cert_path
        ) as admin:
            props = admin.get_queue(queue)
            assert props.requires_session and props.lock_duration == timedelta(seconds=7)
        with ServiceBusClient.from_connection_string(broker.connection_string) as client:
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("hello", session_id="s"))
            with client.get_queue_receiver(queue, session_id="s", max_wait_time=5) as receiver:
                (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                assert str(message) == "hello"
                receiver.complete_message(message)
        client_keys = redis.Redis.from_url(redis_url)
        try:
            assert list(client_keys.scan_iter(match=f"*{prefix}*", count=1000))
        finally:
            client_keys.close()
    assert _refused(port)
    client_keys = redis.Redis.from_url(redis_url)
    try:
        assert list(client_keys.scan_iter(match=f"*{prefix}*", count=1000)) == []
    finally:
        client_keys.close()


def test_management_refusals_say_why(redis_url: str) -> None:
    with BusdBroker(redis_url=redis_url) as broker:
        with pytest.raises(ManagementError, match="LockDuration"):
            broker.management.create_queue("bad", lock_duration="forever")
        assert not broker.management.exists("bad")
        assert broker.management.delete_queue("never-made") is False


def test_a_broker_that_cannot_start_says_why(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    config.write_text("{not json")
    broker = BusdBroker(config=config, data_dir=tmp_path / "data")
    with pytest.raises(BusdStartError, match="Config.json"):
        broker.start()
    assert broker.proc is None
