"""Topics and subscriptions through the official azure-servicebus SDK (sync): fan-out under one
sequence number, subscriptions with and without sessions, dead letters, deferral, scheduling
at the topic, peek, session listing, rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import ServiceBusError

from tests.e2e.conftest import receive, subscription, topic

pytestmark = pytest.mark.timeout(120)

CORRELATION = {
    "Name": "json-only",
    "Properties": {
        "FilterType": "Correlation",
        "CorrelationFilter": {"ContentType": "application/json"},
    },
}
SQL_WITH_ACTION = {
    "Name": "sql-1",
    "Properties": {
        "FilterType": "Sql",
        "SqlFilter": {"SqlExpression": "sys.MessageId = '123456' AND userProp1 = 'value1'"},
        "Action": {"SqlExpression": "SET sys.To = 'Entity'"},
    },
}


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [],
        topics=[
            topic(
                "orders",
                [
                    subscription("all"),
                    subscription("audit"),
                    subscription("sessions", RequiresSession=True),
                ],
            ),
            topic(
                "filtered",
                [
                    subscription("json", rules=[CORRELATION]),
                    subscription("sql", rules=[SQL_WITH_ACTION]),
                    subscription("everything"),
                ],
            ),
            topic("ns/with/slashes", [subscription("s")]),
            topic(
                "dedup",
                [subscription("a"), subscription("b")],
                RequiresDuplicateDetection=True,
                DuplicateDetectionHistoryTimeWindow="PT1M",
            ),
        ],
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


def drain(client, topic_name, sub, count, **kwargs):
    with client.get_subscription_receiver(topic_name, sub, max_wait_time=3, **kwargs) as rx:
        got = receive(rx, count)
        for m in got:
            rx.complete_message(m)
        return got


def test_every_subscription_gets_a_copy_under_one_sequence_number(client):
    with client.get_topic_sender("orders") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{i}", session_id="k", message_id=f"id{i}") for i in range(3)]
        )
    copies = {sub: drain(client, "orders", sub, 3) for sub in ("all", "audit")}
    with client.get_subscription_receiver(
        "orders", "sessions", session_id="k", max_wait_time=3
    ) as rx:
        copies["sessions"] = receive(rx, 3)
        for m in copies["sessions"]:
            rx.complete_message(m)
    seen = {
        sub: [(str(m), m.sequence_number, m.message_id, m.enqueued_time_utc) for m in got]
        for sub, got in copies.items()
    }
    assert [body for body, *_ in seen["all"]] == ["m0", "m1", "m2"]
    assert seen["all"] == seen["audit"] == seen["sessions"]


def test_next_available_session_listing_and_session_state(client):
    with client.get_topic_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage("x", session_id=s) for s in ("a", "b")])
    sessions = (
        client.list_subscription_sessions("orders", "sessions")
        if hasattr(client, "list_subscription_sessions")
        else None
    )
    got = set()
    for _ in range(2):
        with client.get_subscription_receiver(
            "orders", "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as rx:
            rx.session.set_state(b"seen")
            assert rx.session.get_state() == b"seen"
            (m,) = receive(rx, 1)
            rx.complete_message(m)
            got.add(rx.session.session_id)
    assert got == {"a", "b"}
    drain(client, "orders", "all", 2)
    drain(client, "orders", "audit", 2)
    if sessions is not None:
        assert {"a", "b"} <= set(sessions)


def test_dead_letter_defer_peek_and_receive_deferred(client):
    with client.get_topic_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage("dl"), ServiceBusMessage("defer")])
    with client.get_subscription_receiver("orders", "all", max_wait_time=3) as rx:
        dl, deferred = receive(rx, 2)
        rx.dead_letter_message(dl, reason="bad", error_description="really")
        rx.defer_message(deferred)
        peeked = rx.peek_messages(max_message_count=10, sequence_number=deferred.sequence_number)
        assert [str(m) for m in peeked] == ["defer"]
        (again,) = rx.receive_deferred_messages([deferred.sequence_number])
        rx.complete_message(again)
    with client.get_subscription_receiver(
        "orders", "all", max_wait_time=3, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        (dead,) = receive(dlq, 1)
        assert (str(dead), dead.dead_letter_reason) == ("dl", "bad")
        dlq.complete_message(dead)
    assert [str(m) for m in drain(client, "orders", "audit", 2)] == ["dl", "defer"]


def test_a_message_without_session_id_is_dead_lettered_in_a_session_subscription(client):
    with client.get_topic_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("no-session"))
    with client.get_subscription_receiver(
        "orders", "sessions", max_wait_time=3, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        # and the earlier tests' messages without a session id
        dead = receive(dlq, 3, patience=5)
        assert "no-session" in [str(m) for m in dead]
        assert {m.dead_letter_reason for m in dead} == {"Session ID is null."}
        for m in dead:
            dlq.complete_message(m)
    drain(client, "orders", "all", 1)
    drain(client, "orders", "audit", 1)


def test_schedule_and_cancel_on_a_topic(client):
    soon = datetime.now(UTC) + timedelta(seconds=2)
    later = datetime.now(UTC) + timedelta(hours=1)
    with client.get_topic_sender("orders") as sender:
        (keep,) = sender.schedule_messages(ServiceBusMessage("soon"), soon)
        (cancel,) = sender.schedule_messages(ServiceBusMessage("later"), later)
        sender.cancel_scheduled_messages(cancel)
    for sub in ("all", "audit"):
        (m,) = drain(client, "orders", sub, 1)
        assert (str(m), m.sequence_number) == ("soon", keep)
        with client.get_subscription_receiver("orders", sub) as rx:
            assert rx.peek_messages(max_message_count=10, sequence_number=cancel) == []


def test_rules_route_copies_and_a_message_no_rule_takes_is_dropped(client):
    with client.get_topic_sender("filtered") as sender:
        sender.send_messages(
            [
                ServiceBusMessage("json", content_type="application/json"),
                ServiceBusMessage(
                    "sql", message_id="123456", application_properties={"userProp1": "value1"}
                ),
            ]
        )
    (json_copy,) = drain(client, "filtered", "json", 1)
    assert str(json_copy) == "json"
    (sql_copy,) = drain(client, "filtered", "sql", 1)
    assert (str(sql_copy), sql_copy.to, sql_copy.application_properties[b"RuleName"]) == (
        "sql",
        "Entity",
        b"sql-1",
    )
    assert [str(m) for m in drain(client, "filtered", "everything", 2)] == ["json", "sql"]
    with client.get_subscription_receiver("filtered", "json", max_wait_time=1) as rx:
        assert rx.receive_messages(max_wait_time=1) == []


def test_topic_names_with_slashes_and_duplicate_detection(client):
    with client.get_topic_sender("ns/with/slashes") as sender:
        sender.send_messages(ServiceBusMessage("deep"))
    assert [str(m) for m in drain(client, "ns/with/slashes", "s", 1)] == ["deep"]
    with client.get_topic_sender("dedup") as sender:
        sender.send_messages(ServiceBusMessage("first", message_id="same"))
        sender.send_messages(ServiceBusMessage("second", message_id="same"))
    for sub in ("a", "b"):
        assert [str(m) for m in drain(client, "dedup", sub, 1)] == ["first"]
        # The duplicate was dropped, not merely slower: nothing else is stored there.
        with client.get_subscription_receiver("dedup", sub) as rx:
            assert rx.peek_messages(max_message_count=10) == []


def test_wrong_way_links_are_refused(client):
    with pytest.raises(ServiceBusError):
        with client.get_queue_sender("orders/Subscriptions/all") as sender:
            sender.send_messages(ServiceBusMessage("x"))
    with pytest.raises(ServiceBusError):
        with client.get_queue_receiver("orders", max_wait_time=1) as rx:
            rx.receive_messages(max_wait_time=1)
    with pytest.raises(ServiceBusError):
        with client.get_subscription_receiver("orders", "nope", max_wait_time=1) as rx:
            rx.receive_messages(max_wait_time=1)


def test_metrics_count_per_subscription(busd, client):
    import urllib.request

    with client.get_topic_sender("dedup") as sender:
        sender.send_messages(ServiceBusMessage("counted"))
    with urllib.request.urlopen(busd.http_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for sub in ("a", "b"):
        assert (
            f'busd_entity_messages{{entity="dedup/subscriptions/{sub}",state="active"}} 1.0' in text
        )
    drain(client, "dedup", "a", 1)
    drain(client, "dedup", "b", 1)


def test_deleting_a_subscription_detaches_its_receivers_and_drops_its_messages(busd, client):
    from azure.servicebus.exceptions import MessagingEntityNotFoundError
    from azure.servicebus.management import ServiceBusAdministrationClient

    admin = ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    )
    admin.create_subscription("orders", "doomed")
    with client.get_topic_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("kept"))
    with client.get_subscription_receiver("orders", "doomed", max_wait_time=3) as rx:
        (m,) = receive(rx, 1)  # attached and holding a lock
        admin.delete_subscription("orders", "doomed")
        with pytest.raises(MessagingEntityNotFoundError):
            for _ in range(10):  # the detach reaches the client's next call
                rx.receive_messages(max_wait_time=1)
    admin.create_subscription("orders", "doomed")
    assert admin.get_subscription_runtime_properties("orders", "doomed").total_message_count == 0
    admin.delete_subscription("orders", "doomed")
    for sub in ("all", "audit"):
        drain(client, "orders", sub, 1)
    with client.get_subscription_receiver(
        "orders", "sessions", max_wait_time=2, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        for m in receive(dlq, 1, patience=3):
            dlq.complete_message(m)
