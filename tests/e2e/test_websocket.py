"""AMQP over WebSockets: the official SDK (sync and aio) with
`TransportType.AmqpOverWebsocket` sends and receives on queues and sessions, over ws (the
emulator flag) and wss (trusting busd's certificate), on one port."""

from __future__ import annotations

import asyncio
import http.client

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)

ROOT_KEY = "SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE"


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("plain"), queue("sessions", RequiresSession=True)])


def ws(busd) -> tuple[str, dict]:
    """ws://: the emulator flag makes the SDK skip TLS; the custom endpoint names the port."""
    return (
        f"Endpoint=sb://localhost:{busd.port};{ROOT_KEY};UseDevelopmentEmulator=true;",
        {
            "transport_type": TransportType.AmqpOverWebsocket,
            "custom_endpoint_address": f"sb://localhost:{busd.ws_port}",
            "retry_total": 0,
        },
    )


def wss(busd) -> tuple[str, dict]:
    return (
        f"Endpoint=sb://localhost;{ROOT_KEY}",
        {
            "transport_type": TransportType.AmqpOverWebsocket,
            "custom_endpoint_address": f"sb://localhost:{busd.ws_port}",
            "connection_verify": busd.cert_path,
            "retry_total": 0,
        },
    )


@pytest.mark.parametrize("flavour", [ws, wss])
def test_sdk_sync_over_websockets(busd, flavour):
    conn_str, kwargs = flavour(busd)
    name = flavour.__name__
    with ServiceBusClient.from_connection_string(conn_str, **kwargs) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages([ServiceBusMessage(f"{name}-{i}") for i in range(3)])
            big = ServiceBusMessage(b"x" * 300_000)  # more than one AMQP frame
            sender.send_messages(big)
        with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
            got = receive(receiver, 4)
            assert [str(m) for m in got[:3]] == [f"{name}-{i}" for i in range(3)]
            assert len(b"".join(got[3].body)) == 300_000
            for m in got:
                receiver.complete_message(m)
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages([ServiceBusMessage(f"s{i}", session_id=name) for i in range(2)])
        with client.get_queue_receiver("sessions", session_id=name, max_wait_time=5) as receiver:
            got = receive(receiver, 2)
            assert [str(m) for m in got] == ["s0", "s1"]
            receiver.session.set_state(b"over websockets")
            assert receiver.session.get_state() == b"over websockets"
            for m in got:
                receiver.complete_message(m)


@pytest.mark.parametrize("flavour", [ws, wss])
def test_sdk_aio_over_websockets(busd, flavour):
    conn_str, kwargs = flavour(busd)

    async def main() -> list[str]:
        async with AsyncServiceBusClient.from_connection_string(conn_str, **kwargs) as client:
            async with client.get_queue_sender("sessions") as sender:
                await sender.send_messages(ServiceBusMessage("aio", session_id="ws-aio"))
            async with client.get_queue_receiver(
                "sessions", session_id="ws-aio", max_wait_time=5
            ) as receiver:
                got = await receiver.receive_messages(max_wait_time=5)
                for m in got:
                    await receiver.complete_message(m)
                return [str(m) for m in got]

    assert asyncio.run(main()) == ["aio"]


def test_other_paths_and_subprotocols_are_refused(busd):
    conn = http.client.HTTPConnection("127.0.0.1", busd.ws_port, timeout=10)
    upgrade = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    conn.request("GET", "/elsewhere", headers={**upgrade, "Sec-WebSocket-Protocol": "AMQPWSB10"})
    assert conn.getresponse().status == 404
    conn = http.client.HTTPConnection("127.0.0.1", busd.ws_port, timeout=10)
    conn.request("GET", "/$servicebus/websocket", headers=upgrade)  # no AMQPWSB10
    assert conn.getresponse().status == 400
    conn = http.client.HTTPConnection("127.0.0.1", busd.ws_port, timeout=10)
    conn.request(
        "GET", "/$servicebus/websocket", headers={**upgrade, "Sec-WebSocket-Protocol": "AMQPWSB10"}
    )
    response = conn.getresponse()
    assert response.status == 101
    assert response.getheader("Sec-WebSocket-Protocol") == "AMQPWSB10"
    # the binding's registered name, which the Go SDK's dialer asks for, is answered as asked
    for asked, status in (("amqp", 101), ("mqtt", 400)):
        conn = http.client.HTTPConnection("127.0.0.1", busd.ws_port, timeout=10)
        conn.request(
            "GET", "/$servicebus/websocket", headers={**upgrade, "Sec-WebSocket-Protocol": asked}
        )
        response = conn.getresponse()
        assert response.status == status
        assert response.getheader("Sec-WebSocket-Protocol") == (asked if status == 101 else None)


@pytest.mark.parametrize(
    "target", ["https://localhost/$servicebus/websocket", "/$servicebus/websocket?x=1"]
)
def test_the_upgrade_is_taken_in_absolute_form(busd, target):
    """The Java SDK asks `GET https://<host>/$servicebus/websocket` (absolute-form, which a
    server must take: RFC 9112 §3.2.2); busd answered 404 before."""
    conn = http.client.HTTPConnection("127.0.0.1", busd.ws_port, timeout=10)
    conn.request(
        "GET",
        target,
        headers={
            "Upgrade": "websocket",
            "Connection": "Upgrade,Keep-Alive",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Protocol": "AMQPWSB10",
        },
    )
    assert conn.getresponse().status == 101
    conn = http.client.HTTPConnection("127.0.0.1", busd.ws_port, timeout=10)
    conn.request("GET", "https://localhost/elsewhere", headers={"Upgrade": "websocket"})
    assert conn.getresponse().status == 404
