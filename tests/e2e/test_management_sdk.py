"""The official Python SDK's ServiceBusAdministrationClient (sync and aio) against busd over
HTTPS, trusting busd's certificate with `connection_verify=`: what frameworks call at start-up
and what autoscalers read (docs/management.md)."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError
from azure.servicebus.management import (
    AccessRights,
    AuthorizationRule,
    CorrelationRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("kq-plain"), queue("kq-sessions", RequiresSession=True)])


@pytest.fixture(scope="module")
def admin(busd):
    assert busd.cert_path, "busd printed no certificate path"
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as client:
        yield client


def test_namespace_properties(admin):
    """Premium: the tier whose message sizes busd serves."""
    info = admin.get_namespace_properties()
    assert info.name == "sbemulatorns" and info.messaging_sku == "Premium"
    assert info.messaging_units == 1


def test_message_sizes_follow_premiums_rules(busd, admin):
    """MaxMessageSizeInKilobytes as a Premium namespace takes it: 1024 (the default) to
    102400, answered for queues and topics, changeable, and what a sender meets."""
    admin.create_queue("kq-size", max_message_size_in_kilobytes=2048)
    assert admin.get_queue("kq-size").max_message_size_in_kilobytes == 2048
    admin.create_topic("kt-size", max_message_size_in_kilobytes=12345)
    topic = admin.get_topic("kt-size")
    assert topic.max_message_size_in_kilobytes == 12345
    topic.max_message_size_in_kilobytes = 54321
    admin.update_topic(topic)
    assert admin.get_topic("kt-size").max_message_size_in_kilobytes == 54321
    admin.create_queue("kq-size-default")
    assert admin.get_queue("kq-size-default").max_message_size_in_kilobytes == 1024
    for refused in (1023, 102401):
        with pytest.raises(HttpResponseError) as caught:
            admin.create_queue("kq-size-bad", max_message_size_in_kilobytes=refused)
        assert caught.value.status_code == 400
        with pytest.raises(HttpResponseError):
            admin.create_topic("kt-size-bad", max_message_size_in_kilobytes=refused)
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("kq-size-bad")
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("kq-size") as sender:
            sender.send_messages(ServiceBusMessage(b"x" * (1536 * 1024)))  # over 1 MiB
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"x" * (2049 * 1024)))


def test_entities_from_the_file_are_listed_with_their_properties(admin):
    names = [q.name for q in admin.list_queues()]
    assert {"kq-plain", "kq-sessions"} <= set(names)
    props = admin.get_queue("kq-sessions")
    assert props.requires_session is True
    assert props.lock_duration == dt.timedelta(minutes=1)
    assert props.default_message_time_to_live == dt.timedelta(hours=1)


def test_runtime_counts_after_a_known_workload(busd, admin):
    """Each count the SDK (and KEDA: only active_message_count) reads, one by one."""
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("kq-plain") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
            due = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            sender.schedule_messages([ServiceBusMessage("later"), ServiceBusMessage("later")], due)
        with client.get_queue_receiver("kq-plain") as receiver:
            got = receive(receiver, 4)
            assert len(got) == 4
            receiver.complete_message(got[0])
            receiver.dead_letter_message(got[1], reason="test")
            receiver.defer_message(got[2])
            # got[3] stays locked while the counts are read
            rt = admin.get_queue_runtime_properties("kq-plain")
            assert rt.active_message_count == 3  # 2 available + 1 locked
            assert rt.dead_letter_message_count == 1
            assert rt.scheduled_message_count == 2
            assert rt.transfer_message_count == 0
            assert rt.transfer_dead_letter_message_count == 0
            assert rt.total_message_count == 7  # + the deferred one
            listed = {q.name: q for q in admin.list_queues_runtime_properties()}
            assert listed["kq-plain"].active_message_count == 3
            assert listed["kq-plain"].total_message_count == 7

        with client.get_queue_sender("kq-sessions") as sender:
            sender.send_messages(
                [ServiceBusMessage("a", session_id="a") for _ in range(3)]
                + [ServiceBusMessage("b", session_id="b")]
            )
        with client.get_queue_receiver("kq-sessions", session_id="a") as receiver:
            (held,) = receive(receiver, 1)
            rt = admin.get_queue_runtime_properties("kq-sessions")
            assert rt.active_message_count == 4  # 3 available + 1 locked in a locked session
            assert rt.total_message_count == 4
            receiver.complete_message(held)
        rt = admin.get_queue_runtime_properties("kq-sessions")
        assert (rt.active_message_count, rt.total_message_count) == (3, 3)


def test_names_with_a_tilde_serve_as_masstransit_makes_them(busd, admin):
    """Service Bus takes '~' in queue and topic names (MassTransit: `Namespace~Message`)."""
    admin.create_queue("kq~tilde")
    assert admin.get_queue("kq~tilde").name == "kq~tilde"
    admin.create_topic("contracts~ordersubmitted")
    admin.create_subscription("contracts~ordersubmitted", "billing")
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("kq~tilde") as sender:
            sender.send_messages(ServiceBusMessage("to the queue"))
        with client.get_topic_sender("contracts~ordersubmitted") as sender:
            sender.send_messages(ServiceBusMessage("to the topic"))
        with client.get_queue_receiver("kq~tilde", max_wait_time=5) as receiver:
            (got,) = receive(receiver, 1)
            assert str(got) == "to the queue"
            receiver.complete_message(got)
        with client.get_subscription_receiver(
            "contracts~ordersubmitted", "billing", max_wait_time=5
        ) as receiver:
            (got,) = receive(receiver, 1)
            assert str(got) == "to the topic"
            receiver.complete_message(got)
    assert "kq~tilde" in {q.name for q in admin.list_queues()}


def test_authorization_rules_are_kept_and_answered_as_service_bus_does(admin):
    """Sent with a queue or topic, the rules came back as nothing; they are kept and answered
    with the keys busd made for a rule that had none (tokens signed with them:
    tests/e2e/test_entity_keys.py)."""
    created = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    given = AuthorizationRule(
        type="SharedAccessAuthorizationRule",
        claim_type="SharedAccessKey",
        claim_value="None",
        rights=[AccessRights.LISTEN, AccessRights.SEND],
        key_name="app",
        primary_key="primary-app",
        secondary_key="second",
        created_at_utc=created,
    )
    bare = AuthorizationRule(
        rights=[AccessRights.MANAGE, AccessRights.SEND, AccessRights.LISTEN], key_name="ops"
    )
    admin.create_queue("kq-rules", authorization_rules=[given, bare])
    app, ops = admin.get_queue("kq-rules").authorization_rules
    assert (
        app.type,
        app.claim_type,
        app.claim_value,
        app.key_name,
        app.primary_key,
        app.secondary_key,
        app.created_at_utc,
        app.modified_at_utc,
    ) == (
        "SharedAccessAuthorizationRule",
        "SharedAccessKey",
        "None",
        "app",
        "primary-app",
        "second",
        created,
        created,
    )
    assert app.rights == ["Listen", "Send"]
    assert ops.key_name == "ops" and ops.rights == ["Manage", "Send", "Listen"]
    assert len(base64.b64decode(ops.primary_key)) == 32 != ops.secondary_key
    assert ops.created_at_utc > dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)

    queue = admin.get_queue("kq-rules")  # an update sends them back: they stay as they were
    queue.max_delivery_count = 7
    admin.update_queue(queue)
    again = admin.get_queue("kq-rules").authorization_rules
    assert [(r.key_name, r.primary_key, r.secondary_key, r.rights) for r in again] == [
        (r.key_name, r.primary_key, r.secondary_key, r.rights) for r in (app, ops)
    ]

    admin.create_topic("kt-rules", authorization_rules=[given])
    (rule,) = admin.get_topic("kt-rules").authorization_rules
    assert (rule.key_name, rule.primary_key) == ("app", "primary-app")
    with pytest.raises(HttpResponseError) as caught:
        admin.create_queue("kq-rules-twice", authorization_rules=[bare, bare])
    assert "'ops' is given twice" in str(caught.value)


def test_missing_entities_raise_resource_not_found(admin):
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("kq-nosuch")
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue_runtime_properties("kq-nosuch")
    with pytest.raises(ResourceNotFoundError):
        admin.get_topic("kq-nosuch")
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription("kq-nosuch", "s")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_queue("kq-nosuch")


def test_forwarding_destinations_are_answered_as_urls_on_the_namespace_host(busd, admin):
    """The service answers ForwardTo and ForwardDeadLetteredMessagesTo as the destination's URL
    (`sb://<host>/<name>`), whether the request named it by URL (as the SDK does) or bare."""
    host = f"localhost:{busd.http_port}"
    admin.create_queue("kq-fwd-dest")
    admin.create_queue(
        "kq-fwd-src",
        forward_to="kq-fwd-dest",
        forward_dead_lettered_messages_to=f"sb://{host}/kq-fwd-dest",
    )
    found = admin.get_queue("kq-fwd-src")
    assert found.forward_to == f"sb://{host}/kq-fwd-dest"
    assert found.forward_dead_lettered_messages_to == f"sb://{host}/kq-fwd-dest"
    admin.create_topic("kt-fwd")
    admin.create_subscription("kt-fwd", "s", forward_to="kq-fwd-dest")
    assert admin.get_subscription("kt-fwd", "s").forward_to == f"sb://{host}/kq-fwd-dest"
    listed = {q.name: q for q in admin.list_queues()}
    assert listed["kq-fwd-src"].forward_to == f"sb://{host}/kq-fwd-dest"


def test_an_update_replaces_the_whole_description(busd, admin):
    """What the updated description leaves out is cleared to its default, as in Service Bus:
    the model's forward_to=None sends no ForwardTo, and the forwarding stops."""
    host = f"localhost:{busd.http_port}"
    admin.create_queue("kq-upd-dest")
    admin.create_queue(
        "kq-upd",
        forward_to="kq-upd-dest",
        user_metadata="kept",
        forward_dead_lettered_messages_to="kq-upd-dest",
    )
    found = admin.get_queue("kq-upd")
    assert found.forward_to == f"sb://{host}/kq-upd-dest"
    found.forward_to = None
    admin.update_queue(found)
    again = admin.get_queue("kq-upd")
    assert again.forward_to is None
    assert again.forward_dead_lettered_messages_to == f"sb://{host}/kq-upd-dest"
    assert again.user_metadata == "kept"
    admin.update_queue(again, forward_dead_lettered_messages_to=None, user_metadata=None)
    last = admin.get_queue("kq-upd")
    assert (last.forward_dead_lettered_messages_to, last.user_metadata) == (None, None)
    # and the queue no longer forwards: a message sent stays there
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("kq-upd") as sender:
            sender.send_messages(ServiceBusMessage("stays"))
        with client.get_queue_receiver("kq-upd") as receiver:
            (got,) = receive(receiver, 1)
            assert str(got) == "stays"
            receiver.complete_message(got)

    admin.create_topic("kt-upd")
    admin.create_subscription("kt-upd", "s", forward_to="kq-upd-dest")
    sub = admin.get_subscription("kt-upd", "s")
    sub.forward_to = None
    admin.update_subscription("kt-upd", sub)
    assert admin.get_subscription("kt-upd", "s").forward_to is None


def test_rule_parameters_may_be_date_times_and_time_spans(busd, admin):
    """SqlRuleFilter and SqlRuleAction parameters and correlation properties of type datetime
    (sent without a zone: UTC) and timedelta are kept, answered as sent, and evaluated."""
    since = dt.datetime(2020, 7, 5, 11, 12, 13)
    span = dt.timedelta(days=1, hours=2, minutes=3)
    admin.create_topic("kt-dates")
    admin.create_subscription("kt-dates", "sql")
    admin.delete_rule("kt-dates", "sql", "$Default")
    admin.create_rule(
        "kt-dates",
        "sql",
        "after",
        filter=SqlRuleFilter("sent > @since", parameters={"@since": since}),
        action=SqlRuleAction(
            "SET sys.TimeToLive = @span; SET stamped = @stamp",
            parameters={"@span": span, "@stamp": since},
        ),
    )
    admin.create_subscription("kt-dates", "corr")
    admin.delete_rule("kt-dates", "corr", "$Default")
    admin.create_rule(
        "kt-dates",
        "corr",
        "exact",
        filter=CorrelationRuleFilter(properties={"sent": since, "key_duration": span}),
    )
    admin.create_subscription("kt-dates", "corr-date")
    admin.delete_rule("kt-dates", "corr-date", "$Default")
    admin.create_rule(
        "kt-dates", "corr-date", "exact", filter=CorrelationRuleFilter(properties={"sent": since})
    )

    rule = admin.get_rule("kt-dates", "sql", "after")
    assert rule.filter.parameters == {"@since": since}
    assert rule.action.parameters == {"@span": span, "@stamp": since}
    corr = admin.get_rule("kt-dates", "corr", "exact")
    assert corr.filter.properties == {"sent": since, "key_duration": span}

    utc = dt.UTC
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_topic_sender("kt-dates") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(
                        "before",
                        application_properties={"sent": dt.datetime(2019, 1, 1, tzinfo=utc)},
                    ),
                    ServiceBusMessage(
                        "at", application_properties={"sent": since.replace(tzinfo=utc)}
                    ),
                    ServiceBusMessage(
                        "after",
                        application_properties={"sent": dt.datetime(2021, 1, 1, tzinfo=utc)},
                    ),
                ]
            )
        with client.get_subscription_receiver("kt-dates", "sql") as receiver:
            (got,) = receive(receiver, 1)
            assert str(got) == "after"
            assert got.time_to_live == span
            # a timestamp: the SDK hands it over as milliseconds since the epoch
            stamped = got.application_properties[b"stamped"]
            assert stamped == since.replace(tzinfo=utc).timestamp() * 1000
            receiver.complete_message(got)
        with client.get_subscription_receiver("kt-dates", "corr-date") as receiver:
            (got,) = receive(receiver, 1)
            assert str(got) == "at"
            receiver.complete_message(got)
    assert admin.get_subscription_runtime_properties("kt-dates", "sql").total_message_count == 0
    # no message carries the time span property: the two-property filter matches none
    assert admin.get_subscription_runtime_properties("kt-dates", "corr").total_message_count == 0
