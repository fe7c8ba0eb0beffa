"""A plain AMQP 1.0 client (python-qpid-proton, no Service Bus SDK) against busd: SASL ANONYMOUS,
a CBS put-token, queues, and sessions chosen with the `com.microsoft:session-filter` source
filter, as any AMQP library can do it.

`ProtonCbsClient` is the reusable piece: a blocking proton connection that puts a SAS token
on `$cbs` for each entity before using it.
"""

from __future__ import annotations

import time
import uuid

import pytest
from proton import Endpoint, Message, Timeout, uint
from proton.reactor import Filter
from proton.utils import BlockingReceiver, LinkDetached

from tests.e2e.amqp_client import (
    DOTNET_EPOCH_TICKS,
    LOCKED_UNTIL,
    NEXT_AVAILABLE,
    SEQUENCE_NUMBER,
    SESSION_FILTER,
    TIMEOUT,
    LinkProperties,
    ProtonCbsClient,
)
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(120)


def attach_answer(receiver: BlockingReceiver) -> tuple[dict, dict]:
    """The source filter and the link properties busd answered the attach with."""
    data = receiver.link.remote_source.filter
    data.rewind()
    filters = data.get_object() if data.next() is not None else {}
    return dict(filters or {}), dict(receiver.link.remote_properties or {})


def ticks_to_unix(ticks: int) -> float:
    return (ticks - DOTNET_EPOCH_TICKS) / 10_000_000


def receive(receiver: BlockingReceiver, count: int, timeout: float = 5) -> list[Message]:
    messages = []
    for _ in range(count):
        messages.append(receiver.receive(timeout=timeout))
        receiver.accept()
    return messages


def assert_empty(receiver: BlockingReceiver, wait: float = 0.5) -> None:
    with pytest.raises(Timeout):
        receiver.receive(timeout=wait)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("plain"),
            queue("sessions", RequiresSession=True, LockDuration="PT10S"),
            queue("other"),
        ]
    )


@pytest.fixture
def client(busd):
    with ProtonCbsClient(busd.port) as c:
        yield c


def test_put_token_answers_202_and_a_wrong_key_401(client):
    good = client.put_token("plain")
    assert good.properties["status-code"] == 202
    assert good.correlation_id is not None
    bad = client.put_token("plain", key="WRONG")
    assert bad.properties["status-code"] == 401


def test_plain_queue_send_receive_accept(client):
    client.authorize("plain")
    sender = client.sender("plain")
    for i in range(3):
        sender.send(Message(body=f"p{i}", properties={"i": i}, id=f"id-{i}"))
    sender.close()

    receiver = client.receiver("plain")
    messages = receive(receiver, 3)
    assert [m.body for m in messages] == ["p0", "p1", "p2"]
    assert [m.properties["i"] for m in messages] == [0, 1, 2]
    assert [m.id for m in messages] == ["id-0", "id-1", "id-2"]
    seqs = [m.annotations[SEQUENCE_NUMBER] for m in messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert all(m.delivery_count == 0 for m in messages)
    receiver.close()

    # Accepted means completed: a new receiver finds nothing.
    again = client.receiver("plain")
    assert_empty(again)
    again.close()


def test_released_message_comes_back(client):
    client.authorize("plain")
    client.sender("plain").send(Message(body="back"))
    receiver = client.receiver("plain", credit=1)
    assert receiver.receive(timeout=5).body == "back"
    receiver.release(delivered=False)
    assert receiver.receive(timeout=5).body == "back"
    receiver.accept()
    assert_empty(receiver)
    receiver.close()


def test_session_filter_picks_a_session_and_the_answer_carries_it(client):
    client.authorize("sessions")
    sender = client.sender("sessions")
    for i in range(3):
        for group in ("a", "b"):
            sender.send(Message(body=f"{group}{i}", group_id=group))
    sender.close()

    before = time.time()
    receiver = client.receiver("sessions", session="b")
    filters, properties = attach_answer(receiver)
    assert filters == {SESSION_FILTER: "b"}
    locked_until = ticks_to_unix(properties[LOCKED_UNTIL])
    assert before + 8 <= locked_until <= time.time() + 11  # LockDuration is 10 s
    messages = receive(receiver, 3)
    assert [m.body for m in messages] == ["b0", "b1", "b2"]
    assert {m.group_id for m in messages} == {"b"}
    assert_empty(receiver)
    receiver.close()

    # A null filter value: the next available session, named in the answer.
    receiver = client.receiver("sessions", session=NEXT_AVAILABLE, timeout_ms=5000)
    filters, properties = attach_answer(receiver)
    assert filters == {SESSION_FILTER: "a"}
    assert ticks_to_unix(properties[LOCKED_UNTIL]) > time.time()
    assert [m.body for m in receive(receiver, 3)] == ["a0", "a1", "a2"]
    receiver.close()


def test_a_held_session_cannot_be_locked_twice(busd, client):
    client.authorize("sessions")
    client.sender("sessions").send(Message(body="held", group_id="h"))
    holder = client.receiver("sessions", session="h")
    with ProtonCbsClient(busd.port) as other:
        other.authorize("sessions")
        with pytest.raises(LinkDetached) as refused:
            other.receiver("sessions", session="h")
        assert refused.value.condition == "com.microsoft:session-cannot-be-locked"
    assert [m.body for m in receive(holder, 1)] == ["held"]
    holder.close()


def test_next_available_with_nothing_waits_for_the_timeout(client):
    client.authorize("sessions")
    started = time.monotonic()
    with pytest.raises(LinkDetached) as refused:
        client.receiver("sessions", session=NEXT_AVAILABLE, timeout_ms=700)
    waited = time.monotonic() - started
    assert refused.value.condition == "com.microsoft:timeout"
    assert 0.6 <= waited < 5


def test_next_available_is_answered_when_a_message_arrives(busd, client):
    client.authorize("sessions")
    # Attach without the blocking API (it would wait for the answer) ...
    link = client.conn.container.create_receiver(
        client.conn.conn,
        "sessions",
        name=f"receiver-{uuid.uuid4()}",
        options=[Filter({SESSION_FILTER: None}), LinkProperties({TIMEOUT: uint(10_000)})],
    )
    # ... and see it stay unanswered while no session has messages.
    with pytest.raises(Timeout):
        client.conn.wait(lambda: not (link.state & Endpoint.REMOTE_UNINIT), timeout=0.5)
    with ProtonCbsClient(busd.port) as producer:
        producer.authorize("sessions")
        producer.sender("sessions").send(Message(body="late", group_id="late"))
    receiver = BlockingReceiver(client.conn, link, None, credit=0)
    filters, _ = attach_answer(receiver)
    assert filters == {SESSION_FILTER: "late"}
    receiver.close()
    # Closed without taking anything: the message waits for the next holder.
    receiver = client.receiver("sessions", session="late")
    assert [m.body for m in receive(receiver, 1)] == ["late"]
    receiver.close()


def test_session_receiver_on_a_plain_queue_and_plain_receiver_on_sessions_are_refused(client):
    client.authorize("plain")
    client.authorize("sessions")
    with pytest.raises(LinkDetached) as refused:
        client.receiver("plain", session="x")
    assert refused.value.condition == "amqp:not-allowed"
    with pytest.raises(LinkDetached) as refused:
        client.receiver("sessions")
    assert refused.value.condition == "amqp:not-allowed"


def test_message_without_group_id_is_rejected_on_a_session_queue(client):
    from proton import Delivery
    from proton.utils import SendException

    client.authorize("sessions")
    sender = client.sender("sessions")
    with pytest.raises(SendException) as rejected:
        sender.send(Message(body="no session"))
    assert rejected.value.state == Delivery.REJECTED


def test_without_a_token_links_are_refused(busd):
    with ProtonCbsClient(busd.port) as client:
        with pytest.raises(LinkDetached) as refused:
            client.receiver("plain")
        assert refused.value.condition == "amqp:unauthorized-access"
        with pytest.raises(LinkDetached) as refused:
            client.sender("plain")
        assert refused.value.condition == "amqp:unauthorized-access"
        # A token for one queue does not open another.
        client.authorize("other")
        with pytest.raises(LinkDetached) as refused:
            client.receiver("plain")
        assert refused.value.condition == "amqp:unauthorized-access"
        client.sender("other").close()


def test_idle_time_out_is_honoured_with_heartbeats(busd):
    """A client that asks for a 1 s idle time-out closes the connection unless busd sends a
    frame at least that often; idle for 3 s, the connection must still work."""
    with ProtonCbsClient(busd.port, heartbeat=1) as client:
        client.authorize("plain")
        assert client.conn.conn.remote_container  # open answered
        with pytest.raises(Timeout):
            client.conn.wait(lambda: False, timeout=3)  # nothing but heartbeats meanwhile
        sender = client.sender("plain")
        sender.send(Message(body="after idling"))
        receiver = client.receiver("plain")
        message = receiver.receive(timeout=5)
        assert message.body == "after idling"
        receiver.accept()
