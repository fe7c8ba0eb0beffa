"""Local transactions over the AMQP coordinator, from python-qpid-proton, against real busd
processes: transactional sends and settlements take effect at the commit, all together, and a
rollback leaves everything as it was (docs/wire.md §10)."""

from __future__ import annotations

import time
import uuid

import pytest
from proton import Message, Timeout, timestamp
from proton.utils import LinkDetached

from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue, subscription, topic
from tests.e2e.txn_client import (
    Management,
    Refused,
    Transactions,
    drain,
    lock_token,
    peek_all,
    send,
    settle,
    take,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("input"),
            queue("output"),
            queue("short", LockDuration="PT2S"),
            queue("sessions", RequiresSession=True, LockDuration="PT30S"),
        ],
        topics=[topic("events", [subscription("all")])],
        extra_env={"BUSD_TRANSACTION_TIMEOUT": "60"},
    )


@pytest.fixture
def client(busd):
    with ProtonCbsClient(busd.port) as c:
        for entity in ("input", "output", "short", "sessions", "events"):
            c.authorize(entity)
        yield c


def test_declare_answers_declared_with_either_descriptor_and_target(client):
    for capability in (True, False):
        txns = Transactions(client, capability=capability)
        a, b = txns.declare(), txns.declare(numeric=True)
        assert a != b and 0 < len(a) <= 32
        txns.rollback(a)
        txns.commit(b)  # nothing done: a commit with nothing to apply
        txns.close()


def test_sends_appear_at_the_commit_and_never_after_a_rollback(client):
    txns = Transactions(client)
    sender = client.sender("output")
    kept, dropped = txns.declare(), txns.declare()
    for i in range(3):
        answer = send(client, sender, kept, Message(body=f"kept-{i}"))
        assert answer.remote_state == 0x34  # transactional-state(txn-id, accepted)
        assert bytes(answer.remote.data[0]) == kept
        send(client, sender, dropped, Message(body=f"dropped-{i}"))
    assert peek_all(client, "output") == []  # invisible until the commit
    txns.rollback(dropped)
    assert peek_all(client, "output") == []
    txns.commit(kept)
    assert drain(client, "output") == ["kept-0", "kept-1", "kept-2"]


def test_complete_and_send_commit_together(client):
    client.sender("input").send(Message(body="work"))
    receiver = client.receiver("input", credit=1)
    message, delivery = take(receiver)
    txns = Transactions(client)
    txn = txns.declare()
    send(client, client.sender("output"), txn, Message(body=f"result of {message.body}"))
    answer = settle(client, delivery, txn)
    assert answer.remote_state == 0x34  # transactional-state(txn-id, accepted)
    # before the commit: the input is still there (locked), the output is not
    assert [m.body for m in peek_all(client, "input")] == ["work"]
    assert peek_all(client, "output") == []
    txns.commit(txn)
    assert peek_all(client, "input") == []
    assert drain(client, "output") == ["result of work"]
    receiver.close()


def test_rollback_keeps_the_input_locked_with_its_token_and_delivery_count(client):
    client.sender("input").send(Message(body="again"))
    receiver = client.receiver("input", credit=1)
    message, delivery = take(receiver)
    token = lock_token(delivery)
    txns = Transactions(client)
    txn = txns.declare()
    send(client, client.sender("output"), txn, Message(body="never"))
    settle(client, delivery, txn)
    txns.rollback(txn)
    # still locked by its receiver: no one else gets it, with the same token and count
    (peeked,) = peek_all(client, "input")
    assert peeked.delivery_count == message.delivery_count == 0
    other = client.receiver("input", credit=1)
    with pytest.raises(Timeout):
        other.receive(timeout=0.5)
    other.close()
    mgmt = Management(client, "input")
    renewed = mgmt.request("renew-lock", {"lock-tokens": [token]})
    assert renewed.properties["statusCode"] == 200
    # and it can be settled again, in a new transaction
    txn = txns.declare()
    done = mgmt.request(
        "update-disposition", {"disposition-status": "completed", "lock-tokens": [token]}, txn
    )
    assert done.properties["statusCode"] == 200
    assert len(peek_all(client, "input")) == 1
    txns.commit(txn)
    assert peek_all(client, "input") == []
    assert peek_all(client, "output") == []
    receiver.close()


def test_unknown_and_discharged_ids_are_refused(client):
    txns = Transactions(client)
    with pytest.raises(Refused) as err:
        txns.commit(b"no-such-transaction")
    assert err.value.condition == "amqp:transaction:unknown-id"
    txn = txns.declare()
    txns.commit(txn)
    with pytest.raises(Refused) as err:
        txns.commit(txn)
    assert err.value.condition == "amqp:transaction:unknown-id"
    with pytest.raises(Refused) as err:
        send(client, client.sender("output"), txn, Message(body="late"))
    assert err.value.condition == "amqp:transaction:unknown-id"
    assert peek_all(client, "output") == []


def test_a_transaction_is_valid_on_every_session_of_its_connection_only(busd, client):
    txns = Transactions(client)
    txn = txns.declare()
    # another AMQP session of the same connection
    session = client.conn.conn.session()
    session.open()
    sender = client.conn.create_sender("output", name=f"s-{uuid.uuid4()}")
    send(client, sender, txn, Message(body="same connection"))
    with ProtonCbsClient(busd.port) as other:
        other.authorize("output")
        with pytest.raises(Refused) as err:
            send(other, other.sender("output"), txn, Message(body="other connection"))
        assert err.value.condition == "amqp:transaction:unknown-id"
        with pytest.raises(Refused) as err:
            Transactions(other).commit(txn)
        assert err.value.condition == "amqp:transaction:unknown-id"
    txns.commit(txn)
    assert drain(client, "output") == ["same connection"]


def test_the_hundred_and_first_operation_is_refused(client):
    txns = Transactions(client)
    txn = txns.declare()
    sender = client.sender("output")
    answers = [send(client, sender, txn, Message(body=i), wait=False) for i in range(101)]
    client.conn.wait(lambda: all(a.settled for a in answers), timeout=30)
    refused = [a for a in answers if a.remote_state == 0x25]  # rejected
    assert len(refused) == 1
    assert refused[0].remote.condition.name == "amqp:resource-limit-exceeded"
    txns.commit(txn)
    assert len(drain(client, "output")) == 100


def test_detaching_the_coordinator_rolls_back_what_it_declared(busd, client):
    client.sender("short").send(Message(body="held"))
    receiver = client.receiver("short", credit=1)
    _, delivery = take(receiver)
    txns = Transactions(client)
    txn = txns.declare()
    send(client, client.sender("output"), txn, Message(body="lost"))
    settle(client, delivery, txn)
    receiver.close()  # (a plain queue's lock outlives its receiver link)
    txns.close()
    with pytest.raises(Refused) as err:
        Transactions(client).commit(txn)
    assert err.value.condition == "amqp:transaction:unknown-id"
    assert peek_all(client, "output") == []
    assert [m.body for m in peek_all(client, "short")] == ["held"]  # locked still, until its lock
    # expires (LockDuration 2 s): then it comes back, one delivery attempt counted
    message = client.receiver("short", credit=1).receive(timeout=10)
    assert (message.body, message.delivery_count) == ("held", 1)


def test_closing_the_connection_rolls_back_its_transactions(busd):
    with ProtonCbsClient(busd.port) as first:
        first.authorize("output")
        txns = Transactions(first)
        txn = txns.declare()
        send(first, first.sender("output"), txn, Message(body="gone"))
    with ProtonCbsClient(busd.port) as second:
        second.authorize("output")
        assert drain(second, "output", wait=1) == []


def test_session_work_commits_with_the_session_and_not_without_its_lock(client):
    sender = client.sender("sessions")
    for sid in ("s1", "s2"):
        sender.send(Message(body=f"{sid}-in", group_id=sid))
    mgmt = Management(client, "sessions")
    txns = Transactions(client)

    # committed: the complete, an output in another session, and the session state
    receiver = client.receiver("sessions", session="s1")
    _, delivery = take(receiver)
    txn = txns.declare()
    settle(client, delivery, txn)
    send(client, sender, txn, Message(body="s3-out", group_id="s3"))
    state = mgmt.request("set-session-state", {"session-id": "s1", "session-state": b"done"}, txn)
    assert state.properties["statusCode"] == 200
    before = mgmt.request("get-session-state", {"session-id": "s1"})
    assert before.body["session-state"] is None  # applied at the commit only
    txns.commit(txn)
    after = mgmt.request("get-session-state", {"session-id": "s1"})
    assert after.body["session-state"] == b"done"
    assert [m.body for m in peek_all(client, "sessions")] == ["s2-in", "s3-out"]
    receiver.close()

    # the session's lock lost before the commit: the discharge is refused, nothing applies
    receiver = client.receiver("sessions", session="s2")
    _, delivery = take(receiver)
    txn = txns.declare()
    settle(client, delivery, txn)
    send(client, sender, txn, Message(body="s4-out", group_id="s4"))
    receiver.close()  # releases the session: its lock is gone
    with pytest.raises(Refused) as err:
        txns.commit(txn)
    assert err.value.condition == "com.microsoft:session-lock-lost"
    assert [m.body for m in peek_all(client, "sessions")] == ["s2-in", "s3-out"]


def test_scheduled_and_cancelled_in_a_transaction(client):
    mgmt = Management(client, "output")
    txns = Transactions(client)
    from proton import symbol

    later = Message(
        body="later",
        annotations={
            symbol("x-opt-scheduled-enqueue-time"): timestamp(int(time.time() * 1000) + 3_600_000)
        },
    )
    txn = txns.declare()
    response = mgmt.request(
        "schedule-message", {"messages": [{"message-id": "m1", "message": later.encode()}]}, txn
    )
    assert response.properties["statusCode"] == 200
    (seq,) = response.body["sequence-numbers"]
    assert peek_all(client, "output") == []
    txns.commit(txn)
    assert [m.body for m in peek_all(client, "output")] == ["later"]
    txn = txns.declare()
    mgmt.request("cancel-scheduled-message", {"sequence-numbers": [seq]}, txn)
    txns.rollback(txn)
    assert len(peek_all(client, "output")) == 1  # the cancel was rolled back
    txn = txns.declare()
    mgmt.request("cancel-scheduled-message", {"sequence-numbers": [seq]}, txn)
    txns.commit(txn)
    assert peek_all(client, "output") == []


def test_cross_entity_session_pins_the_first_entity(client):
    """A coordinator first on an AMQP session: its first entity link is the send-via
    entity; receivers on other entities are refused (docs/wire.md §10.6)."""
    session = client.conn.conn.session()
    session.open()
    ctrl = session.sender(f"txn-ctrl-{uuid.uuid4()}")
    from tests.e2e.txn_client import Coordinator

    Coordinator().apply(ctrl)
    ctrl.open()
    out = session.sender(f"out-{uuid.uuid4()}")
    out.target.address = "output"
    out.open()
    client.conn.wait(lambda: out.remote_target.address is not None, timeout=10)
    refused = session.receiver(f"in-{uuid.uuid4()}")
    refused.source.address = "input"
    refused.open()
    with pytest.raises(LinkDetached):  # the blocking client's way of telling
        client.conn.wait(lambda: refused.state & refused.REMOTE_CLOSED, timeout=10)
    assert refused.remote_condition.name == "amqp:not-allowed"
    allowed = session.receiver(f"via-{uuid.uuid4()}")
    allowed.source.address = "output"
    allowed.open()
    client.conn.wait(
        lambda: allowed.state & (allowed.REMOTE_ACTIVE | allowed.REMOTE_CLOSED), timeout=10
    )
    assert allowed.state & allowed.REMOTE_ACTIVE


def test_a_subscription_message_completes_with_sends_to_its_topic_and_a_queue(client):
    """Service Bus's TransactionalSendAndReceiveSubscription: a topic and its subscription
    are one entity for a transaction."""
    client.sender("events").send(Message(body="event"))
    receiver = client.receiver("events/subscriptions/all", credit=1)
    _, delivery = take(receiver)
    txns = Transactions(client)
    txn = txns.declare()
    send(client, client.sender("events"), txn, Message(body="fan-out"))
    send(client, client.sender("output"), txn, Message(body="handled event"))
    settle(client, delivery, txn)
    assert [m.body for m in peek_all(client, "events/subscriptions/all")] == ["event"]
    txns.commit(txn)
    assert [m.body for m in peek_all(client, "events/subscriptions/all")] == ["fan-out"]
    assert drain(client, "output") == ["handled event"]
    receiver.close()
