"""One admission rule for every way in: a session id with a NUL or longer than 128 characters
is refused by a sender link, by `$management` schedule-message and by the operator's send,
each with the error its client expects, and nothing is stored.

Why NUL matters: the store's keys separate a session id from a sequence number with NUL, so
a message of session "a\\0b" would be delivered to the holder of session "a" (docs/design.md
§2.2). The session "a" here holds one legitimate message and must never see another.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError
from proton import Delivery, Message

from busd.amqp import codec
from busd.auth.sas import generate_sas_token
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(60)

BAD_IDS = ["a\0b", "a\0", "x" * 129]


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("admit-sessions", RequiresSession=True)])


@pytest.fixture(scope="module")
def sdk(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("admit-sessions") as sender:
            sender.send_messages(ServiceBusMessage("legit", session_id="a"))
        yield client


def admin(busd, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    token = generate_sas_token(
        "sb://localhost/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", int(time.time()) + 300
    )
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(busd.http_url + path, data=data, method=method)
    request.add_header("Authorization", token)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def send_raw(client: ProtonCbsClient, sender, payload: bytes) -> Delivery:
    """Send an encoded message as is (proton's own Message stops a string at a NUL) and wait
    for busd's outcome."""
    delivery = sender.link.delivery(uuid.uuid4().bytes)
    sender.link.send(payload)
    sender.link.advance()
    client.conn.wait(lambda: delivery.remote_state != 0, timeout=10)
    return delivery


@pytest.mark.parametrize("bad", BAD_IDS, ids=["nul-inside", "nul-at-end", "129-chars"])
def test_a_sender_link_rejects_the_transfer(busd, sdk, bad):
    with ProtonCbsClient(busd.port) as client:
        client.authorize("admit-sessions")
        sender = client.sender("admit-sessions")
        payload = codec.encode_message(properties={"group_id": bad}, data=b"leak?")
        assert codec.parse_incoming(payload).session_id == bad  # the id busd will read
        delivery = send_raw(client, sender, payload)
        assert delivery.remote_state == Delivery.REJECTED
        assert delivery.remote.condition.name == "com.microsoft:argument-out-of-range"
        assert "session id" in delivery.remote.condition.description
        sender.send(Message(body="the link lives on", group_id="other"))


@pytest.mark.parametrize("bad", BAD_IDS[:2], ids=["nul-inside", "nul-at-end"])
def test_schedule_message_is_refused(sdk, bad):
    # (The SDK itself refuses an id over 128 characters before sending it.)
    due = datetime.now(UTC) + timedelta(seconds=1)
    with sdk.get_queue_sender("admit-sessions") as sender:
        with pytest.raises(ServiceBusError) as refused:
            sender.schedule_messages(ServiceBusMessage("leak?", session_id=bad), due)
        assert "session id" in str(refused.value).lower()


@pytest.mark.parametrize("bad", BAD_IDS, ids=["nul-inside", "nul-at-end", "129-chars"])
def test_the_operators_send_is_refused(busd, sdk, bad):
    status, answer = admin(
        busd, "POST", "/admin/queues/admit-sessions/messages", {"body": "leak?", "session_id": bad}
    )
    assert status == 400, answer
    assert "session id" in json.dumps(answer).lower()


def test_nothing_was_stored_and_session_a_holds_only_its_own(busd, sdk):
    time.sleep(1.5)  # past the due time of anything a refused schedule might have stored
    with sdk.get_queue_receiver("admit-sessions", session_id="a", max_wait_time=2) as receiver:
        bodies = [str(m) for m in receiver.receive_messages(max_message_count=10, max_wait_time=2)]
        for message in receiver.receive_messages(max_message_count=10, max_wait_time=1):
            bodies.append(str(message))
        assert bodies == ["legit"]
    status, sessions = admin(busd, "GET", "/admin/queues/admit-sessions/sessions")
    assert status == 200
    assert sorted(s["session_id"] for s in sessions) == ["a", "other"]
