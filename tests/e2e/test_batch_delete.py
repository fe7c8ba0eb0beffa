"""`com.microsoft:batch-delete-messages` on `$management`, as the SDKs' delete_messages and
purge_messages send it (docs/wire.md §8.4.13): up to `message-count` messages enqueued before
`enqueued-time-utc`, oldest first, one session's with `session-id`; 200 with the count deleted,
204 when none matched; locked and scheduled messages stay. Sent here with proton as the
SDKs encode it (an int count, a timestamp), since azure-servicebus 7.15 has no method for it."""

from __future__ import annotations

import time
import uuid

import pytest
from proton import Message, int32, timestamp

from tests.e2e.amqp_client import Management, ProtonCbsClient
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            *(queue(f"plain-{i}", LockDuration="PT30S") for i in range(1, 5)),
            queue("sessions", RequiresSession=True, LockDuration="PT30S"),
            queue("parts", EnablePartitioning=True),
        ]
    )


@pytest.fixture
def client(busd):
    with ProtonCbsClient(busd.port) as client:
        yield client


def delete(mgmt: Management, count, before_ms=None, session_id=None) -> tuple[int, dict | None]:
    body: dict = {"message-count": int32(count) if isinstance(count, int) else count}
    if before_ms is not None:
        body["enqueued-time-utc"] = timestamp(before_ms)
    if session_id is not None:
        body["session-id"] = session_id
    answer = mgmt.request("batch-delete-messages", body)
    return answer.properties["statusCode"], answer.body


def send(client: ProtonCbsClient, entity: str, bodies: list[str], session: str | None = None):
    sender = client.sender(entity)
    for body in bodies:
        sender.send(Message(body=body, id=str(uuid.uuid4()), group_id=session))
    sender.close()


def peek(mgmt: Management, session_id: str | None = None) -> list[tuple[str, bool]]:
    """Every message of the entity: its body, and whether it is locked."""
    body: dict = {"from-sequence-number": 1, "message-count": int32(100)}
    if session_id is not None:
        body["session-id"] = session_id
    answer = mgmt.request("peek-message", body)
    if answer.properties["statusCode"] == 204:
        return []
    out = []
    for item in answer.body["messages"]:
        message = Message()
        message.decode(item["message"])
        locked = "x-opt-locked-until" in (message.annotations or {})
        out.append((message.body, locked))
    return out


def peeked(mgmt: Management, session_id: str | None = None) -> list[str]:
    return [body for body, _ in peek(mgmt, session_id)]


def test_the_oldest_are_deleted_locked_ones_stay_and_none_left_is_204(client):
    client.authorize("plain-1")
    mgmt = Management(client, "plain-1")
    send(client, "plain-1", [f"m{i}" for i in range(8)])
    # One credit, granted once: proton's prefetch would top the credit up and take it back
    # (a flow may lower it), so which messages end up locked would be a race.
    receiver = client.receiver("plain-1", credit=0)
    receiver.link.flow(1)
    client.conn.wait(lambda: receiver.fetcher.has_message, timeout=5)
    assert peek(mgmt) == [("m0", True), *((f"m{i}", False) for i in range(1, 8))]
    assert delete(mgmt, 2) == (200, {"message-count": 2})  # the oldest two eligible
    assert peeked(mgmt) == ["m0", "m3", "m4", "m5", "m6", "m7"]
    assert delete(mgmt, 100) == (200, {"message-count": 5})
    assert peek(mgmt) == [("m0", True)]
    assert delete(mgmt, 100) == (204, None)
    receiver.close()


def test_only_messages_enqueued_before_the_cutoff(client):
    client.authorize("plain-2")
    mgmt = Management(client, "plain-2")
    send(client, "plain-2", ["old-1", "old-2"])
    time.sleep(0.05)
    cutoff = int(time.time() * 1000)
    time.sleep(0.05)
    send(client, "plain-2", ["new-1"])
    assert delete(mgmt, 100, before_ms=cutoff) == (200, {"message-count": 2})
    assert peeked(mgmt) == ["new-1"]
    assert delete(mgmt, 100, before_ms=cutoff) == (204, None)
    assert delete(mgmt, 100) == (200, {"message-count": 1})  # no cutoff: now


def test_one_sessions_messages_with_session_id(client):
    client.authorize("sessions")
    mgmt = Management(client, "sessions")
    send(client, "sessions", ["a1", "a2"], session="a")
    send(client, "sessions", ["b1"], session="b")
    assert delete(mgmt, 100, session_id="a") == (200, {"message-count": 2})
    assert peeked(mgmt, "a") == [] and peeked(mgmt, "b") == ["b1"]
    sessions = mgmt.request(
        "get-message-sessions", {"skip": int32(0), "top": int32(10), "last-updated-time": None}
    )
    assert list(sessions.body["sessions-ids"]) == ["b"]  # session a ceased to exist
    assert delete(mgmt, 100) == (200, {"message-count": 1})


def test_a_held_sessions_messages_stay_unless_it_is_named(client):
    client.authorize("sessions")
    mgmt = Management(client, "sessions")
    send(client, "sessions", ["h1", "h2"], session="h")
    send(client, "sessions", ["f1"], session="f")
    holder = client.receiver("sessions", session="h", credit=0)
    assert delete(mgmt, 100) == (200, {"message-count": 1})  # f's
    assert peeked(mgmt, "h") == ["h1", "h2"]
    assert delete(mgmt, 100, session_id="h") == (200, {"message-count": 2})
    holder.close()


def test_the_dead_letter_queue(client):
    client.authorize("plain-3")
    send(client, "plain-3", ["dead-1", "dead-2", "alive"])
    receiver = client.receiver("plain-3", credit=2)
    for _ in range(2):
        receiver.receive(timeout=5)
        receiver.reject()  # rejected: dead-lettered
    receiver.close()
    dlq = Management(client, "plain-3/$DeadLetterQueue")
    assert peeked(dlq) == ["dead-1", "dead-2"]
    assert delete(dlq, 10) == (200, {"message-count": 2})
    assert peeked(dlq) == []
    assert peeked(Management(client, "plain-3")) == ["alive"]  # the queue's own untouched


@pytest.mark.parametrize(
    "count, before, description",
    [
        (0, None, "message-count must be an integer of 1 or more"),
        (-3, None, "message-count must be an integer of 1 or more"),
        ("10", None, "message-count must be an integer of 1 or more"),
        (10, "yesterday", "enqueued-time-utc must be a timestamp"),
    ],
)
def test_bad_requests_are_refused_and_delete_nothing(client, count, before, description):
    client.authorize("plain-4")
    mgmt = Management(client, "plain-4")
    send(client, "plain-4", ["kept"])
    body: dict = {"message-count": int32(count) if isinstance(count, int) else count}
    if before is not None:
        body["enqueued-time-utc"] = before
    answer = mgmt.request("batch-delete-messages", body)
    assert answer.properties["statusCode"] == 400
    assert answer.properties["errorCondition"] == "com.microsoft:argument-error"
    assert description in answer.properties["statusDescription"]
    assert peeked(mgmt) == ["kept"]
    assert delete(mgmt, 10) == (200, {"message-count": 1})


def test_a_partitioned_entity_is_refused_as_service_bus_does(client):
    client.authorize("parts")
    mgmt = Management(client, "parts")
    send(client, "parts", ["kept"])
    answer = mgmt.request("batch-delete-messages", {"message-count": int32(10)})
    assert answer.properties["statusCode"] == 501
    assert "partitioned" in answer.properties["statusDescription"]
