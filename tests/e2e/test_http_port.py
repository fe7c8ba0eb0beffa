"""The HTTP port itself: HTTP/1.1 keep-alive, AMQP sniffed and served on it too, the routes
kept apart (health, admin, management API, dashboard)."""

from __future__ import annotations

import http.client
import socket
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from busd.auth.sas import generate_sas_token
from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("port-q"), queue("health")])


def _token(busd) -> str:
    return generate_sas_token(
        f"https://localhost:{busd.http_port}",
        "RootManageSharedAccessKey",
        "SAS_KEY_VALUE",
        int(time.time()) + 600,
    )


def test_one_connection_serves_many_requests(busd):
    conn = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    headers = {"Authorization": _token(busd)}
    for _ in range(3):
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200 and b'"status":"healthy"' in response.read()
        conn.request("GET", "/port-q?api-version=2021-05", headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type").startswith("application/atom+xml")
        assert b'<title type="text">port-q</title>' in response.read()
    conn.close()


def test_a_queue_named_like_a_route_is_reached_through_the_management_api(busd):
    conn = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    conn.request("GET", "/health?api-version=2024-05", headers={"Authorization": _token(busd)})
    response = conn.getresponse()
    assert b"<QueueDescription" in response.read()


def test_amqp_clients_may_use_the_http_port(busd):
    conn_str = busd.connection_string.replace(f":{busd.port};", f":{busd.http_port};")
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender("port-q") as sender:
            sender.send_messages(ServiceBusMessage("over 5300"))
        with client.get_queue_receiver("port-q") as receiver:
            (message,) = receive(receiver, 1)
            assert str(message) == "over 5300"
            receiver.complete_message(message)


def test_the_dashboard_page_is_served_and_its_login_checks_the_key(busd):
    conn = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    conn.request("GET", "/")
    response = conn.getresponse()
    assert response.status == 200 and b"<title>busd</title>" in response.read()
    conn.request(
        "POST", "/dashboard/login", body=b'{"key_name": "RootManageSharedAccessKey", "key": "nope"}'
    )
    response = conn.getresponse()
    assert response.status == 401 and b"wrong key" in response.read()
    conn.request(
        "POST",
        "/dashboard/login",
        body=b'{"key_name": "RootManageSharedAccessKey", "key": "SAS_KEY_VALUE"}',
    )
    response = conn.getresponse()
    assert response.status == 200 and b"SharedAccessSignature" in response.read()


def test_management_over_plain_http_as_dotnet_signs_it(busd):
    """.NET speaks plain HTTP to an emulator and signs the URL without its query."""
    conn = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    base = f"http://localhost:{busd.http_port}"

    def call(method: str, path: str, body: bytes | None = None, **headers: str):
        token = generate_sas_token(
            f"{base}{path}", "RootManageSharedAccessKey", "SAS_KEY_VALUE", int(time.time()) + 600
        )
        conn.request(
            method,
            f"{path}?api-version=2021-05",
            body=body,
            headers={"Authorization": token, **headers},
        )
        response = conn.getresponse()
        return response.status, response.read()

    entry = (
        b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/'
        b'servicebus/connect"><MaxDeliveryCount>6</MaxDeliveryCount></QueueDescription>'
        b"</content></entry>"
    )
    status, data = call("PUT", "/dotnet-q", entry)
    assert status == 201 and b"<MaxDeliveryCount>6</MaxDeliveryCount>" in data
    assert call("PUT", "/dotnet-q", entry)[0] == 409
    status, data = call("GET", "/dotnet-q")
    assert status == 200 and b'<title type="text">dotnet-q</title>' in data
    assert call("DELETE", "/dotnet-q") == (200, b"")
    assert call("DELETE", "/dotnet-q")[0] == 404
    status, data = call("GET", "/dotnet-q")
    assert status == 200 and b"Publicly Listed Services" in data


def _exchange(busd, data: bytes, wait: float = 5) -> bytes:
    """Raw bytes to the HTTP port; everything busd writes until it closes the socket."""
    got = b""
    with socket.create_connection(("127.0.0.1", busd.http_port), timeout=wait) as raw:
        raw.sendall(data)
        try:
            while chunk := raw.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
    return got


LOGIN = b'{"key_name": "RootManageSharedAccessKey", "key": "SAS_KEY_VALUE"}'


def test_a_chunked_body_and_a_pipelined_second_request_on_one_connection(busd):
    chunked = (
        b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (LOGIN[:10], LOGIN[10:]))
        + b"0\r\n\r\n"
    )
    got = _exchange(
        busd,
        b"POST /dashboard/login HTTP/1.1\r\nHost: localhost\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + chunked
        + b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    first, _, second = got.partition(b"HTTP/1.1 200 OK\r\n")[2].partition(b"HTTP/1.1 ")
    assert b"SharedAccessSignature" in first, got  # the login read the whole chunked body
    assert second.startswith(b"200 OK") and b'"status":"healthy"' in second, got


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: "
            + b"x" * (70 * 1024)
            + b"\r\n\r\n",
            b"431 ",
        ),
        (b"GET /health HTTP/1.1\r\nX-Endless: " + b"x" * (70 * 1024), b"431 "),  # no end in sight
        (
            b"POST /dashboard/login HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
            + str(128 * 1024 * 1024 + 1).encode()
            + b"\r\n\r\n",
            b"413 ",
        ),
        (
            b"POST /dashboard/login HTTP/1.1\r\nHost: localhost\r\n"
            + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"400 ",
        ),
        (b"GET /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: twelve\r\n\r\n", b"400 "),
        (b"GET /health\r\n\r\n", b"400 "),
    ],
    ids=[
        "head-too-large",
        "head-without-end",
        "body-too-large",
        "bad-chunk-size",
        "bad-content-length",
        "no-version",
    ],
)
def test_a_bad_request_gets_its_status_and_the_connection_closed(busd, request_bytes, status):
    got = _exchange(busd, request_bytes)
    assert got.startswith(b"HTTP/1.1 " + status), got
    assert _exchange(
        busd, b"GET /health HTTP/1.1\r\nConnection: close\r\nHost: localhost\r\n\r\n"
    ).startswith(b"HTTP/1.1 200 ")
