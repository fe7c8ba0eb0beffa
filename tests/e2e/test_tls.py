"""AMQP over TLS: the official SDK (sync and aio) without the emulator flag, trusting busd's
certificate authority alone through `connection_verify`, sends and receives on queues and
sessions; the authority signs local names only, and a burst of new namespace hosts is served
without holding up other clients."""

from __future__ import annotations

import asyncio
import http.client
import signal
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusConnectionError
from cryptography import x509

from busd.auth.sas import generate_sas_token
from busd.net import tls
from tests.e2e.conftest import amqp_header_over_tls, queue, receive
from tests.e2e.test_admin_cli import http as admin_request
from tests.test_tls import write_unconstrained

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("plain"), queue("sessions", RequiresSession=True)])


def tls_kwargs(busd) -> dict:
    """What an application passes to reach a TLS listener that is not on 5671: the SDK drops
    the connection string's port outside the emulator and connects to a custom endpoint's."""
    return {
        "custom_endpoint_address": f"sb://localhost:{busd.tls_port}",
        "transport_type": TransportType.Amqp,  # a custom endpoint alone means WebSockets
        "connection_verify": busd.cert_path,
        "retry_total": 0,
    }


def tls_connection_string(busd) -> str:
    return (
        "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE"
    )


def test_banner_names_the_listener_and_the_certificate(busd):
    assert busd.tls_port and busd.cert_path
    text = busd.log_text()
    assert "TLS connection string: Endpoint=sb://localhost:" in text
    # the TLS string does not carry the emulator flag: with it, the SDKs speak plain AMQP
    tls_line = next(line for line in text.splitlines() if "TLS connection string" in line)
    assert "UseDevelopmentEmulator" not in tls_line
    # what clients trust is busd's authority, which may sign local names only
    assert Path(busd.cert_path).name == tls.CA_FILE
    authority = x509.load_pem_x509_certificate(Path(busd.cert_path).read_bytes())
    assert authority.extensions.get_extension_for_class(x509.NameConstraints).critical


def test_sdk_sync_over_tls_queue_and_session(busd):
    with ServiceBusClient.from_connection_string(
        tls_connection_string(busd), **tls_kwargs(busd)
    ) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages(ServiceBusMessage(b"over tls"))
        with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
            got = receive(receiver, 1)
            assert [str(m) for m in got] == ["over tls"]
            receiver.complete_message(got[0])
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages([ServiceBusMessage(f"s{i}", session_id="tls-s") for i in range(3)])
        with client.get_queue_receiver("sessions", session_id="tls-s", max_wait_time=5) as receiver:
            got = receive(receiver, 3)
            assert [str(m) for m in got] == ["s0", "s1", "s2"]
            receiver.session.set_state(b"state")
            assert receiver.session.get_state() == b"state"
            for m in got:
                receiver.complete_message(m)


def test_sdk_aio_over_tls_session(busd):
    async def main() -> list[str]:
        async with AsyncServiceBusClient.from_connection_string(
            tls_connection_string(busd), **tls_kwargs(busd)
        ) as client:
            async with client.get_queue_sender("sessions") as sender:
                await sender.send_messages(ServiceBusMessage("aio", session_id="tls-aio"))
            async with client.get_queue_receiver(
                "sessions", session_id="tls-aio", max_wait_time=5
            ) as receiver:
                got = await receiver.receive_messages(max_wait_time=5)
                for m in got:
                    await receiver.complete_message(m)
                return [str(m) for m in got]

    assert asyncio.run(main()) == ["aio"]


def test_a_client_that_does_not_trust_the_certificate_is_refused(busd):
    kwargs = tls_kwargs(busd)
    del kwargs["connection_verify"]  # the system's CAs only
    with ServiceBusClient.from_connection_string(tls_connection_string(busd), **kwargs) as client:
        with pytest.raises(ServiceBusConnectionError):
            with client.get_queue_sender("plain") as sender:
                sender.send_messages(ServiceBusMessage(b"nope"))


def plain_amqp_header(port: int, header: bytes) -> None:
    """Speak plain AMQP (no TLS) to the TLS port: busd refuses the handshake and hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(header)
        try:
            raw.recv(64)
        except (ConnectionResetError, TimeoutError):
            pass


def test_plain_amqp_on_the_tls_port_is_refused_and_busd_keeps_serving(busd):
    plain_amqp_header(busd.tls_port, b"AMQP\x03\x01\x00\x00")
    sasl = b"AMQP\x03\x01\x00\x00"
    assert amqp_header_over_tls(busd.tls_port, busd.cert_path, sasl) == sasl  # SASL answers


def test_failed_handshakes_leave_nothing_behind_and_shutdown_is_clean(busd_factory):
    own = busd_factory([queue("plain")])
    # A client that does not trust the certificate, and one that speaks no TLS at all: neither
    # handshake finishes, so asyncio never tells the AMQP protocol a connection was made.
    untrusting = ssl.create_default_context()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", own.tls_port), timeout=5) as raw:
            with pytest.raises(ssl.SSLError):
                untrusting.wrap_socket(raw, server_hostname="localhost")
        plain_amqp_header(own.tls_port, b"AMQP\x00\x01\x00\x00")
    with ServiceBusClient.from_connection_string(
        tls_connection_string(own), **tls_kwargs(own)
    ) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages(ServiceBusMessage(b"after"))
    # A graceful stop closes every open connection; the half-made ones must not be among them
    # (they used to be, and the stop failed on them with a traceback and exit code 1).
    own.stop(signal.SIGTERM)
    assert own.proc.returncode == 0, own.log_text()[-3000:]
    assert "Traceback" not in own.log_text()


def presented_names(port: int, cert_path: str, host: str) -> list[str]:
    """A TLS handshake naming `host`, trusting busd's authority alone: the DNS names of the
    certificate busd presented (an ssl.SSLCertVerificationError when it is not for `host`)."""
    context = ssl.create_default_context(cafile=cert_path)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as raw:
        with context.wrap_socket(raw, server_hostname=host) as s:
            return [v for k, v in s.getpeercert()["subjectAltName"] if k == "DNS"]


def health_answer_s(http_port: int) -> float:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    return time.perf_counter() - started


def test_a_burst_of_new_host_names_does_not_hold_up_other_clients(busd):
    """Each new `<name>.localhost` named at the handshake, before any authentication, gets a
    certificate of its own, issued off the event loop: /health answers meanwhile."""
    names = [f"burst{i}-{time.time_ns() % 10**8}.localhost" for i in range(30)]
    with ThreadPoolExecutor(8) as pool:
        burst = [pool.submit(presented_names, busd.tls_port, busd.cert_path, n) for n in names]
        answers = [health_answer_s(busd.http_port) for _ in range(5)]
        presented = [f.result() for f in burst]
    assert presented == [[n] for n in names]
    assert max(answers) < 1.0, answers


def test_a_foreign_name_gets_busds_own_certificate(busd):
    for name in ("login.microsoftonline.com", "a.b.localhost"):
        with pytest.raises(ssl.SSLCertVerificationError):
            presented_names(busd.tls_port, busd.cert_path, name)
    assert presented_names(busd.tls_port, busd.cert_path, "localhost") == ["localhost"]


def test_every_tls_port_presents_a_namespace_hosts_own_certificate(busd):
    for port in (busd.port, busd.tls_port, busd.http_port, busd.ws_port):
        host = f"p{port}-{time.time_ns() % 10**8}.localhost"
        assert presented_names(port, busd.cert_path, host) == [host]


def _named_quietly(port: int, host: str) -> None:
    """A TLS handshake naming `host` that goes no further (no authentication)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=20) as raw:
        with context.wrap_socket(raw, server_hostname=host):
            pass


def test_a_churn_of_made_up_hosts_leaves_known_namespaces_their_certificates(busd_factory):
    """Made-up host names, named before any authentication, spend the issuing of other names
    (64 at once, then 20 a second): a namespace made by its Manage key keeps its own."""
    own = busd_factory([queue("plain")])
    namespace = f"known-{time.time_ns() % 10**8}"
    made = generate_sas_token(
        "sb://localhost/", f"{namespace}/RootManageSharedAccessKey", "SAS_KEY_VALUE", 2**31
    )
    assert admin_request(own, "GET", "/admin/queues", token=made)[0] == 200  # the namespace is made
    churn = [f"churn{i}-{time.time_ns() % 10**8}.localhost" for i in range(300)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: _named_quietly(own.tls_port, name), churn))
    host = f"{namespace}.localhost"
    assert presented_names(own.tls_port, own.cert_path, host) == [host]


def test_the_unconstrained_certificate_of_an_earlier_busd_is_replaced(busd_factory, tmp_path):
    data = tmp_path / "data"
    old = write_unconstrained(data)
    own = busd_factory([queue("plain")], extra_env={"BUSD_DATA_DIR": str(data)})
    assert own.cert_path == str(data / tls.CA_FILE)
    assert (data / tls.CERT_FILE).read_bytes() != old
    (line,) = [x for x in own.log_text().splitlines() if "certificate authority" in x]
    assert "no name constraints" in line and str(data / tls.CA_FILE) in line
    with ServiceBusClient.from_connection_string(
        tls_connection_string(own), **tls_kwargs(own)
    ) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages(ServiceBusMessage(b"trusting the authority"))
        with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
            assert [str(m) for m in receive(receiver, 1)] == ["trusting the authority"]
