"""Topics in local transactions, from python-qpid-proton, against real busd processes over a
real Valkey: a send, a schedule and a cancel on a topic are staged with the copies the
subscriptions' rules make of them, fan out at the commit exactly as an ordinary send does, and
leave no trace after a rollback; a message settled in a transaction stays locked until the
discharge (docs/design.md §3.15)."""

from __future__ import annotations

import time

import pytest
from proton import Message, symbol, timestamp

from tests.conftest import start_valkey_cluster
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import launch_busd, queue, subscription, topic, write_config
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

JSON_ONLY = {
    "Name": "json-only",
    "Properties": {
        "FilterType": "Correlation",
        "CorrelationFilter": {"ContentType": "application/json"},
    },
}
BIG_TAGGED = {
    "Name": "big",
    "Properties": {
        "FilterType": "Sql",
        "SqlFilter": {"SqlExpression": "size > 5"},
        "Action": {"SqlExpression": "SET tag = 'big'"},
    },
}
SUBSCRIPTIONS = ("all", "json", "sql")


def orders_topic(name: str = "orders") -> dict:
    return topic(
        name,
        [
            subscription("all"),
            subscription("json", rules=[JSON_ONLY]),
            subscription("sql", rules=[BIG_TAGGED]),
        ],
        RequiresDuplicateDetection=True,
        DuplicateDetectionHistoryTimeWindow="PT1M",
    )


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [queue("input"), queue("short", LockDuration="PT1S")],
        topics=[orders_topic(), topic("late", [subscription("s")])],
        extra_env={"BUSD_TRANSACTION_TIMEOUT": "60"},
    )


@pytest.fixture
def client(busd):
    with ProtonCbsClient(busd.port) as c:
        for entity in ("input", "short", "orders", "late"):
            c.authorize(entity)
        yield c


def sub(name: str, topic_name: str = "orders") -> str:
    return f"{topic_name}/subscriptions/{name}"


def copies(client, topic_name: str = "orders", names=SUBSCRIPTIONS) -> dict[str, list]:
    """Every message of each subscription, in any state."""
    return {n: peek_all(client, sub(n, topic_name)) for n in names}


def seq(message: Message) -> int:
    return message.annotations["x-opt-sequence-number"]


def test_a_topic_send_fans_out_at_the_commit_under_one_number_per_message(client):
    sender = client.sender("orders")
    txns = Transactions(client)
    txn = txns.declare()
    big = Message(
        id="big-1", body="big json", content_type="application/json", properties={"size": 10}
    )
    small = Message(id="small-1", body="small", properties={"size": 1})
    for message in (big, small, Message(id="big-1", body="again")):  # the last: a duplicate
        answer = send(client, sender, txn, message)
        assert answer.remote_state == 0x34  # transactional-state(txn-id, accepted)
    assert copies(client) == {n: [] for n in SUBSCRIPTIONS}  # nothing until the discharge
    txns.commit(txn)
    got = copies(client)
    assert [m.body for m in got["all"]] == ["big json", "small"]
    assert [m.body for m in got["json"]] == ["big json"]
    (tagged,) = got["sql"]
    assert tagged.body == "big json" and tagged.properties["tag"] == "big"
    assert tagged.properties["RuleName"] == "big"
    # one topic number per message, the same in every subscription
    assert seq(got["all"][0]) == seq(got["json"][0]) == seq(tagged)
    assert seq(got["all"][1]) > seq(got["all"][0])
    for name in SUBSCRIPTIONS:
        drain(client, sub(name))


def test_a_rollback_leaves_nothing_in_any_subscription(client):
    sender = client.sender("orders")
    txns = Transactions(client)
    txn = txns.declare()
    send(
        client,
        sender,
        txn,
        Message(
            id="rolled-back", body="never", content_type="application/json", properties={"size": 10}
        ),
    )
    txns.rollback(txn)
    assert copies(client) == {n: [] for n in SUBSCRIPTIONS}
    # its message-id was never seen by duplicate detection: sent again, it is taken
    txn = txns.declare()
    send(
        client, sender, txn, Message(id="rolled-back", body="once", content_type="application/json")
    )
    txns.commit(txn)
    assert {n: [m.body for m in ms] for n, ms in copies(client).items()} == {
        "all": ["once"],
        "json": ["once"],
        "sql": [],
    }
    for name in SUBSCRIPTIONS:
        drain(client, sub(name))


def test_a_queue_input_completes_with_a_topic_send(client):
    client.sender("input").send(Message(body="work"))
    receiver = client.receiver("input", credit=1)
    _, delivery = take(receiver)
    txns = Transactions(client)
    txn = txns.declare()
    send(client, client.sender("orders"), txn, Message(body="result", properties={"size": 9}))
    settle(client, delivery, txn)
    assert [m.body for m in peek_all(client, "input")] == ["work"]  # locked, not gone
    assert copies(client) == {n: [] for n in SUBSCRIPTIONS}
    txns.commit(txn)
    assert peek_all(client, "input") == []
    assert {n: [m.body for m in ms] for n, ms in copies(client).items()} == {
        "all": ["result"],
        "json": [],
        "sql": ["result"],
    }
    receiver.close()
    for name in SUBSCRIPTIONS:
        drain(client, sub(name))


def test_scheduled_and_cancelled_on_a_topic_in_transactions(client):
    mgmt = Management(client, "orders")
    txns = Transactions(client)
    later = Message(
        body="later",
        content_type="application/json",
        annotations={
            symbol("x-opt-scheduled-enqueue-time"): timestamp(int(time.time() * 1000) + 3_600_000)
        },
    )
    txn = txns.declare()
    response = mgmt.request(
        "schedule-message",
        {"messages": [{"message-id": "sched-1", "message": later.encode()}]},
        txn,
    )
    assert response.properties["statusCode"] == 200
    (number,) = response.body["sequence-numbers"]
    assert copies(client) == {n: [] for n in SUBSCRIPTIONS}
    txns.commit(txn)
    got = copies(client)
    assert {n: [(m.body, seq(m)) for m in ms] for n, ms in got.items()} == {
        "all": [("later", number)],
        "json": [("later", number)],
        "sql": [],
    }
    assert got["all"][0].annotations["x-opt-message-state"] == 2  # scheduled
    txn = txns.declare()
    assert (
        mgmt.request("cancel-scheduled-message", {"sequence-numbers": [number]}, txn).properties[
            "statusCode"
        ]
        == 200
    )
    txns.rollback(txn)
    assert [len(ms) for ms in copies(client).values()] == [1, 1, 0]  # still scheduled
    txn = txns.declare()
    mgmt.request("cancel-scheduled-message", {"sequence-numbers": [number]}, txn)
    assert [len(ms) for ms in copies(client).values()] == [1, 1, 0]  # until the commit
    txns.commit(txn)
    assert copies(client) == {n: [] for n in SUBSCRIPTIONS}  # every copy went


def test_the_rules_of_the_moment_of_the_send_decide_the_copies(client):
    """A rule removed between the send and the commit: the staged send keeps the copy its
    rules gave it when it arrived; a send after the removal gets none."""
    txns = Transactions(client)
    txn = txns.declare()
    sender = client.sender("late")
    send(client, sender, txn, Message(body="before"))
    rules = Management(client, sub("s", "late"))
    assert rules.request("remove-rule", {"rule-name": "$Default"}).properties["statusCode"] == 200
    send(client, sender, txn, Message(body="after"))
    txns.commit(txn)
    assert [m.body for m in peek_all(client, sub("s", "late"))] == ["before"]


def test_a_settled_message_stays_locked_until_the_discharge(client):
    """LockDuration 1 s: the transaction holds the lock of what it settled until its
    discharge, so a commit long after the lock would have run out still applies; after a
    rollback the lock is the holder's again, for LockDuration from then."""
    sender = client.sender("short")
    sender.send(Message(body="slow work"))
    receiver = client.receiver("short", credit=1)
    _, delivery = take(receiver)
    txns = Transactions(client)
    txn = txns.declare()
    settle(client, delivery, txn)
    send(client, client.sender("orders"), txn, Message(body="done"))
    time.sleep(2.5)  # past the 1 s lock, twice over
    txns.commit(txn)
    assert peek_all(client, "short") == []
    assert [m.body for m in peek_all(client, sub("all"))] == ["done"]

    sender.send(Message(body="rolled back"))
    _, delivery = take(receiver)
    token = lock_token(delivery)
    txn = txns.declare()
    settle(client, delivery, txn)
    time.sleep(1.5)
    txns.rollback(txn)
    renewed = Management(client, "short").request("renew-lock", {"lock-tokens": [token]})
    assert renewed.properties["statusCode"] == 200  # same token, still locked
    receiver.close()  # (a plain queue's lock outlives its receiver link)
    other = client.receiver("short", credit=1)
    message = other.receive(timeout=10)  # back once that lock runs out
    assert (message.body, message.delivery_count) == ("rolled back", 1)
    other.accept()
    for name in SUBSCRIPTIONS:
        drain(client, sub(name))


def test_the_via_partition_key_is_taken_and_kept(client):
    """The .NET SDK's TransactionPartitionKey: `x-opt-via-partition-key` on a transactional
    send (and `via-partition-key` in a schedule-message entry). busd has no partitions: it
    takes them, and the annotation stays on the message as sent (docs/wire.md §10.3)."""
    txns = Transactions(client)
    txn = txns.declare()
    keyed = Message(
        body="keyed",
        annotations={symbol("x-opt-via-partition-key"): "pk", symbol("x-opt-partition-key"): "pk"},
    )
    send(client, client.sender("orders"), txn, keyed)
    later = Message(
        body="keyed later",
        annotations={
            symbol("x-opt-via-partition-key"): "pk",
            symbol("x-opt-scheduled-enqueue-time"): timestamp(int(time.time() * 1000) + 60_000),
        },
    )
    response = Management(client, "orders").request(
        "schedule-message",
        {
            "messages": [
                {
                    "message-id": "via-1",
                    "message": later.encode(),
                    "partition-key": "pk",
                    "via-partition-key": "pk",
                }
            ]
        },
        txn,
    )
    assert response.properties["statusCode"] == 200
    txns.commit(txn)
    got = {m.body: m for m in peek_all(client, sub("all"))}
    assert sorted(got) == ["keyed", "keyed later"]
    assert all(m.annotations["x-opt-via-partition-key"] == "pk" for m in got.values())
    assert got["keyed"].annotations["x-opt-partition-key"] == "pk"
    (number,) = response.body["sequence-numbers"]
    Management(client, "orders").request("cancel-scheduled-message", {"sequence-numbers": [number]})
    for name in SUBSCRIPTIONS:
        drain(client, sub(name))


def test_a_settlement_whose_lock_is_already_gone_is_refused_at_once(client):
    client.sender("short").send(Message(body="too slow"))
    receiver = client.receiver("short", credit=1)
    _, delivery = take(receiver)
    time.sleep(1.5)  # LockDuration 1 s: the lock is gone before the transaction sees it
    txns = Transactions(client)
    txn = txns.declare()
    with pytest.raises(Refused) as err:
        settle(client, delivery, txn)
    assert err.value.condition == "com.microsoft:message-lock-lost"
    receiver.close()
    message = client.receiver("short", credit=1).receive(timeout=10)
    assert message.body == "too slow"  # not completed: back when its locks ran out


# --- Redis Cluster: one script reaches one slot ----------------------------------------------
def test_on_a_cluster_a_transaction_keeps_to_one_topic_or_queue(tmp_path):
    """A topic and its subscriptions share one hash tag: a send to the topic and the
    completion of a subscription's message commit together; work on another queue is refused
    with not-allowed, as Service Bus refuses a second entity."""
    server = start_valkey_cluster(tmp_path / "cluster")
    config = write_config(tmp_path / "config.json", [queue("input")], [orders_topic()])
    proc = launch_busd(server.connection_url + "?cluster=true", config, tmp_path)
    try:
        with ProtonCbsClient(proc.port) as client:
            for entity in ("input", "orders"):
                client.authorize(entity)
            sender = client.sender("orders")
            sender.send(Message(body="event", content_type="application/json"))
            receiver = client.receiver(sub("json"), credit=1)
            _, delivery = take(receiver)
            txns = Transactions(client)
            txn = txns.declare()
            settle(client, delivery, txn)
            send(client, sender, txn, Message(body="handled", properties={"size": 7}))
            with pytest.raises(Refused) as err:
                send(client, client.sender("input"), txn, Message(body="elsewhere"))
            assert err.value.condition == "amqp:not-allowed"
            assert {n: [m.body for m in ms] for n, ms in copies(client).items()} == {
                "all": ["event"],
                "json": ["event"],
                "sql": [],
            }
            txns.commit(txn)
            assert {n: [m.body for m in ms] for n, ms in copies(client).items()} == {
                "all": ["event", "handled"],
                "json": [],
                "sql": ["handled"],
            }
            assert peek_all(client, "input") == []
            receiver.close()
    finally:
        proc.stop()
        server.stop()
