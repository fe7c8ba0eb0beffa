"""Several isolated namespaces in one busd (docs/design.md §3.17): chosen by the SAS key name
(`<name>/RootManageSharedAccessKey`, what the SDKs' tests use: `*.localhost` does not resolve
everywhere) or by the host the client connected to (`<name>.localhost`: the AMQP open frame's
hostname, the HTTP Host header). Each sees only its own entities and messages."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import uuid

import pytest
from azure.core.exceptions import ClientAuthenticationError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from click.testing import CliRunner
from proton import Message
from proton.utils import LinkDetached

from busd.auth.sas import generate_sas_token
from busd.cli.main import cli
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue, receive, run_node

pytestmark = pytest.mark.timeout(120)

ROOT = "RootManageSharedAccessKey"


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("orders"), queue("file-only")])


def connection_string(busd, key_name: str = ROOT) -> str:
    return (
        f"Endpoint=sb://localhost:{busd.port};SharedAccessKeyName={key_name};"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


def admin(busd, namespace: str | None) -> ServiceBusAdministrationClient:
    key_name = f"{namespace}/{ROOT}" if namespace else ROOT
    return ServiceBusAdministrationClient.from_connection_string(
        connection_string(busd, key_name), connection_verify=busd.cert_path
    )


def fresh() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"team-a-{tag}", f"team-b-{tag}"


def test_two_namespaces_with_the_same_queue_see_only_their_own_messages(busd):
    namespaces = fresh()
    for namespace in namespaces:
        with admin(busd, namespace) as client:
            client.create_queue("orders", max_delivery_count=3)
            assert [q.name for q in client.list_queues()] == ["orders"]  # not the file's
            assert client.get_namespace_properties().name == namespace
        conn = connection_string(busd, f"{namespace}/{ROOT}")
        with ServiceBusClient.from_connection_string(conn) as client:
            with client.get_queue_sender("orders") as sender:
                sender.send_messages([ServiceBusMessage(f"{namespace} {i}") for i in range(2)])
    for namespace in namespaces:
        with admin(busd, namespace) as client:
            assert client.get_queue_runtime_properties("orders").active_message_count == 2
            assert client.get_queue("orders").max_delivery_count == 3
        conn = connection_string(busd, f"{namespace}/{ROOT}")
        with ServiceBusClient.from_connection_string(conn) as client:
            with client.get_queue_receiver("orders", max_wait_time=2) as receiver:
                got = receive(receiver, 2, wait=2, patience=6)
                assert sorted(str(m) for m in got) == [f"{namespace} 0", f"{namespace} 1"]
                for message in got:
                    receiver.complete_message(message)
                # nothing of the other namespace's queue, stored before, comes after them
                assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    # the default namespace is busd as it was: the file's entities, none of the others' messages
    with admin(busd, None) as client:
        assert {q.name for q in client.list_queues()} == {"orders", "file-only"}
        assert client.get_queue_runtime_properties("orders").total_message_count == 0


def test_topics_and_the_namespace_entities_stay_apart(busd):
    namespace, other = fresh()
    with admin(busd, namespace) as client:
        client.create_topic("events")
        client.create_subscription("events", "audit")
        assert [t.name for t in client.list_topics()] == ["events"]
    with admin(busd, other) as client:
        assert list(client.list_topics()) == []
        assert list(client.list_queues()) == []
    conn = connection_string(busd, f"{namespace}/{ROOT}")
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("fanned out"))
        with client.get_subscription_receiver("events", "audit", max_wait_time=5) as receiver:
            (message,) = receive(receiver, 1)
            assert str(message) == "fanned out"
            receiver.complete_message(message)


def test_the_host_name_chooses_the_namespace_over_amqp_and_http(busd):
    namespace = fresh()[0]
    host = f"{namespace}.localhost"
    with ProtonCbsClient(busd.port, host=host) as client:
        client.authorize("")  # a namespace-wide token: any entity of the namespace
        assert client.put_token("orders").properties["status-code"] == 404  # not created yet
    with admin(busd, namespace) as client:
        client.create_queue("orders")
    with ProtonCbsClient(busd.port, host=host) as client:
        client.authorize("orders")
        client.sender("orders").send(Message(body="by host"))
        receiver = client.receiver("orders")
        assert receiver.receive(timeout=10).body == "by host"
        receiver.accept()
    # HTTP: the Host header, with a plain key name
    token = generate_sas_token(
        f"https://{host}:{busd.http_port}", ROOT, "SAS_KEY_VALUE", int(time.time()) + 300
    )
    conn = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    conn.request(
        "GET",
        "/$Resources/Queues?api-version=2021-05",
        headers={"Host": f"{host}:{busd.http_port}", "Authorization": token},
    )
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200
    assert b'<title type="text">orders</title>' in body and b"file-only" not in body


def test_a_connection_serves_one_namespace(busd):
    namespace, other = fresh()
    with ProtonCbsClient(busd.port, host=f"{namespace}.localhost") as client:
        status = client.put_token("", key_name=f"{other}/{ROOT}").properties["status-code"]
        assert status == 401  # the key's namespace is not the host's
    with ProtonCbsClient(busd.port) as client:
        assert client.put_token("", key_name=f"{namespace}/{ROOT}").properties["status-code"] == 202
        assert client.put_token("", key_name=f"{other}/{ROOT}").properties["status-code"] == 401
        # bound to `namespace`: the default namespace's file queue is not there
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            client.sender("file-only")


def test_a_namespace_is_made_only_for_a_holder_of_its_keys(busd):
    namespace = fresh()[0]
    with ServiceBusAdministrationClient.from_connection_string(
        connection_string(busd, f"{namespace}/{ROOT}").replace("SAS_KEY_VALUE", "WRONG"),
        connection_verify=busd.cert_path,
    ) as client:
        with pytest.raises(ClientAuthenticationError):
            list(client.list_queues())
    with ProtonCbsClient(busd.port) as client:
        status = client.put_token("", key_name=f"{namespace}/{ROOT}", key="WRONG")
        assert status.properties["status-code"] == 401
        bad = client.put_token("", key_name=f"No_Such.Name/{ROOT}").properties["status-code"]
        assert bad == 401  # not a namespace name
    assert f"namespace {namespace}: serving it" not in busd.log_text()


def test_the_javascript_sdk_chooses_namespaces_by_key_name(busd, node_modules):
    namespaces = fresh()
    steps = run_node(
        "namespaces.mjs",
        *(connection_string(busd, f"{n}/{ROOT}") for n in namespaces),
        cert_path=busd.cert_path,
    )
    assert steps == {
        "queues0": ["orders"],
        "received0": ["namespace 0"],
        "queues1": ["orders"],
        "received1": ["namespace 1"],
        "done": True,
    }


@pytest.fixture
def localhost_subdomains(monkeypatch):
    """`*.localhost` resolved to the loopback address in this process, as systemd-resolved
    resolves it (this machine's resolver does not)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_both_python_clients_by_host_name_over_amqp_and_https(busd, localhost_subdomains):
    """The administration client checks that the certificate names `<name>.localhost`: busd
    presents one it signed for that host with the certificate the client trusts."""
    namespace = fresh()[0]
    conn = (
        f"Endpoint=sb://{namespace}.localhost:{busd.port};SharedAccessKeyName={ROOT};"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    with ServiceBusAdministrationClient.from_connection_string(
        conn, connection_verify=busd.cert_path
    ) as client:
        client.create_queue("orders")
        assert [q.name for q in client.list_queues()] == ["orders"]
        assert client.get_namespace_properties().name == namespace
        with ServiceBusClient.from_connection_string(conn) as messaging:
            with messaging.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("by host name"))
            assert client.get_queue_runtime_properties("orders").active_message_count == 1
            with messaging.get_queue_receiver("orders", max_wait_time=5) as receiver:
                (message,) = receive(receiver, 1)
                assert str(message) == "by host name"
                receiver.complete_message(message)


def test_a_namespace_host_gets_a_certificate_for_exactly_that_name(busd):
    context = ssl.create_default_context(cafile=busd.cert_path)
    for host in ("team-z.localhost", "localhost"):
        with socket.create_connection(("127.0.0.1", busd.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                names = [v for k, v in tls.getpeercert()["subjectAltName"] if k == "DNS"]
                assert host in names
    with socket.create_connection(("127.0.0.1", busd.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):  # two labels: not a namespace host
            context.wrap_socket(raw, server_hostname="a.b.localhost")


def test_the_dashboard_and_the_tools_act_on_the_namespace_of_their_key(busd):
    namespace = fresh()[0]
    with admin(busd, namespace) as client:
        client.create_queue("ns-only")
    conn = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    login = json.dumps({"key_name": f"{namespace}/{ROOT}", "key": "SAS_KEY_VALUE"})
    conn.request("POST", "/dashboard/login", body=login.encode())
    response = conn.getresponse()
    token = json.loads(response.read())["token"]
    assert response.status == 200
    conn.request("GET", "/admin/queues", headers={"Authorization": token})
    response = conn.getresponse()
    assert [q["name"] for q in json.loads(response.read())] == ["ns-only"]
    # the page's renewal keeps the namespace (the key name names it)
    conn.request("POST", "/dashboard/renew", headers={"Authorization": token})
    response = conn.getresponse()
    renewed = json.loads(response.read())["token"]
    assert response.status == 200
    conn.request("GET", "/admin/queues", headers={"Authorization": renewed})
    response = conn.getresponse()
    assert [q["name"] for q in json.loads(response.read())] == ["ns-only"]
    result = CliRunner().invoke(
        cli,
        ["queues", "--json", "--url", busd.http_url],
        prog_name="busd",
        env={"BUSD_SAS_KEY": f"{namespace}/{ROOT}=SAS_KEY_VALUE"},
    )
    assert result.exit_code == 0, result.output
    assert [q["name"] for q in json.loads(result.stdout)] == ["ns-only"]


def test_the_javascript_sdk_names_a_namespace_by_host(busd, node_modules):
    namespace = fresh()[0]
    conn = (
        f"Endpoint=sb://{namespace}.localhost:{busd.port};SharedAccessKeyName={ROOT};"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    steps = run_node("namespace_host.mjs", conn, cert_path=busd.cert_path)
    assert steps == {
        "queues": ["orders"],
        "namespace": namespace,
        "received": ["by host"],
        "done": True,
    }
