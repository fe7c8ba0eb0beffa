"""busd.testing.containers.BusdContainer: busd's image, built from this repository's
Dockerfile, under Testcontainers. Needs a Docker engine; skipped where none answers."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.conftest import _docker_answers

pytestmark = [
    pytest.mark.timeout(900),  # the image is built from the Dockerfile
    pytest.mark.skipif(not _docker_answers(), reason="no Docker engine answers"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_the_image_serves_the_sdk_and_its_config(tmp_path: Path) -> None:
    from busd.testing.containers import BusdContainer

    config = tmp_path / "Config.json"
    config.write_text(
        '{"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": '
        '[{"Name": "orders", "Properties": {"RequiresSession": true}}]}]}}'
    )
    with BusdContainer.from_dockerfile(ROOT, config=config) as busd:
        with urllib.request.urlopen(f"{busd.http_url}/health", timeout=5) as answer:
            assert answer.status == 200
        with ServiceBusClient.from_connection_string(busd.connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("hello", session_id="s"))
            with client.get_queue_receiver("orders", session_id="s", max_wait_time=10) as rx:
                (message,) = rx.receive_messages(max_message_count=1, max_wait_time=10)
                assert str(message) == "hello"
                rx.complete_message(message)
        assert busd.cert().startswith(b"-----BEGIN CERTIFICATE-----")
