"""The start banner gives what a user pastes: one connection string for the data and the admin
clients, what each SDK's admin client needs besides (the certificate), the dashboard's URL and
the certificate to trust, each of them working as printed."""

from __future__ import annotations

import re
import urllib.request

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)


def banner_value(text: str, label: str) -> str:
    match = re.search(rf"^\s+{label}: (\S+)", text, re.M)
    assert match, f"no {label!r} line in the banner:\n{text}"
    return match.group(1)


def test_banner_strings_work_as_printed(busd_factory):
    busd = busd_factory([queue("orders")])
    text = busd.log_text()
    lines = [line for line in text.splitlines() if line.startswith("  ")]
    assert lines[-1].startswith("  connection string: ")  # last: the banner is complete
    amqp = banner_value(text, "connection string")
    dashboard = banner_value(text, "dashboard")
    cert = banner_value(text, "certificate")
    # one string: no second one for the administration client to tell apart
    assert text.count("Endpoint=sb://") == 2  # this one and the TLS listener's
    assert f":{busd.port};" in amqp and "UseDevelopmentEmulator=true;" in amqp
    # the admin client's settings, per SDK, as printed
    python = next(line for line in lines if line.strip().startswith("Python:"))
    assert f'connection_verify="{cert}"' in python
    assert any(f"NODE_EXTRA_CA_CERTS={cert} " in line for line in lines)
    assert any(line.strip().startswith(".NET:") for line in lines)
    with ServiceBusAdministrationClient.from_connection_string(
        amqp, connection_verify=cert
    ) as admin:
        assert [q.name for q in admin.list_queues()] == ["orders"]
    with ServiceBusClient.from_connection_string(amqp) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("pasted"))
        with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
            (message,) = receive(receiver, 1)
            assert str(message) == "pasted"
            receiver.complete_message(message)
    assert dashboard == f"http://localhost:{busd.http_port}/"
    with urllib.request.urlopen(dashboard, timeout=5) as page:
        assert page.status == 200 and b"<html" in page.read().lower()


def test_the_admin_client_without_the_certificate_fails_as_the_banner_warns(busd_factory):
    """Why the banner names the certificate for the admin client: without it the Python
    client's HTTPS handshake is refused."""
    from azure.core.exceptions import ServiceRequestError

    busd = busd_factory([queue("orders")])
    amqp = banner_value(busd.log_text(), "connection string")
    with ServiceBusAdministrationClient.from_connection_string(amqp) as admin:
        with pytest.raises(ServiceRequestError, match="CERTIFICATE_VERIFY_FAILED"):
            list(admin.list_queues())


def test_banner_names_the_embedded_store_allocator(busd_factory):
    from busd.storage.redis.embedded import jemalloc_path

    busd = busd_factory([queue("orders")], embedded=True)
    text = busd.log_text()
    line = next(x for x in text.splitlines() if x.startswith("  allocator: "))
    library = jemalloc_path()
    if library is not None:
        assert line == f"  allocator: jemalloc ({library})"
    else:
        assert "libjemalloc2" in line  # says what would make it faster
