"""One connection string for both SDK clients: every port busd serves AMQP on also answers
HTTP and HTTPS (busd/net/ports.py), told apart by a connection's first bytes, and `GET /health`
answers as the Service Bus emulator's does on each of them."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from importlib.metadata import version

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.e2e.conftest import amqp_header_over_tls, queue, receive

pytestmark = pytest.mark.timeout(90)

HEALTHY = b'{"status":"healthy","message":"Service is healthy."}'


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("op-file")])


def tls_connection_string(port: int) -> str:
    """Service Bus's own form, without the emulator flag: the SDKs speak TLS."""
    return (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE"
    )


def test_the_amqp_ports_connection_string_serves_both_python_clients(busd):
    """The administration client speaks HTTPS to the Endpoint's port, here the AMQP port."""
    with ServiceBusAdministrationClient.from_connection_string(
        busd.connection_string, connection_verify=busd.cert_path
    ) as admin:
        admin.create_queue("op-made", max_delivery_count=3)
        assert {"op-file", "op-made"} <= {q.name for q in admin.list_queues()}
        with ServiceBusClient.from_connection_string(busd.connection_string) as client:
            with client.get_queue_sender("op-made") as sender:
                sender.send_messages([ServiceBusMessage("one"), ServiceBusMessage("two")])
            assert admin.get_queue_runtime_properties("op-made").active_message_count == 2
            with client.get_queue_receiver("op-made") as receiver:
                got = receive(receiver, 2)
                assert sorted(str(m) for m in got) == ["one", "two"]
                for message in got:
                    receiver.complete_message(message)
        assert admin.get_queue_runtime_properties("op-made").total_message_count == 0
        admin.delete_queue("op-made")


def test_the_tls_ports_connection_string_serves_the_administration_client(busd):
    with ServiceBusAdministrationClient.from_connection_string(
        tls_connection_string(busd.tls_port), connection_verify=busd.cert_path
    ) as admin:
        assert admin.get_queue("op-file").max_delivery_count == 10


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, str, bytes]:
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.getheader("Content-Type"), response.read()


@pytest.mark.parametrize(
    "port_of, scheme",
    [
        (lambda b: b.port, "http"),
        (lambda b: b.port, "https"),
        (lambda b: b.http_port, "http"),
        (lambda b: b.http_port, "https"),
        (lambda b: b.tls_port, "https"),
    ],
    ids=["amqp-http", "amqp-https", "http-http", "http-https", "tls-https"],
)
def test_health_answers_as_the_emulator_on_every_port(busd, port_of, scheme):
    port = port_of(busd)
    if scheme == "https":
        context = ssl.create_default_context(cafile=busd.cert_path)
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "localhost", port, context=context, timeout=10
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert _get(conn, "/health") == (200, "application/json", HEALTHY)
    status, content_type, body = _get(conn, "/health/detail")  # same kept-alive connection
    assert (status, json.loads(body)) == (
        200,
        {"status": "ok", "store": True, "version": version("busd")},
    )
    conn.close()


def test_amqp_over_tls_on_the_amqp_port(busd):
    sasl = b"AMQP\x03\x01\x00\x00"
    assert amqp_header_over_tls(busd.port, busd.cert_path, sasl) == sasl  # SASL answers


def test_plain_http_on_the_tls_port_is_refused_and_the_port_keeps_serving(busd):
    with socket.create_connection(("127.0.0.1", busd.tls_port), timeout=5) as raw:
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        try:
            assert raw.recv(64) == b""
        except ConnectionResetError:
            pass
    context = ssl.create_default_context(cafile=busd.cert_path)
    conn = http.client.HTTPSConnection("localhost", busd.tls_port, context=context, timeout=10)
    assert _get(conn, "/health")[0] == 200


def test_a_silent_connection_does_not_hold_up_the_others(busd):
    """A client that connects and says nothing waits alone: the next one is served."""
    with socket.create_connection(("127.0.0.1", busd.port), timeout=5):
        with ServiceBusClient.from_connection_string(busd.connection_string) as client:
            with client.get_queue_sender("op-file") as sender:
                sender.send_messages(ServiceBusMessage("past the silent one"))
            with client.get_queue_receiver("op-file") as receiver:
                (message,) = receive(receiver, 1)
                receiver.complete_message(message)
