"""The ATOM XML layer against the official Python SDK's own (de)serializers: what busd writes
parses into the SDK's models with the values meant, and what the SDK writes parses in busd."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET

import pytest
from azure.servicebus.management import (
    CorrelationRuleFilter,
    QueueProperties,
    QueueRuntimeProperties,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    SubscriptionProperties,
    TopicProperties,
)
from azure.servicebus.management._generated.models import (
    CreateQueueBody,
    CreateQueueBodyContent,
    CreateRuleBody,
    CreateRuleBodyContent,
    CreateSubscriptionBody,
    CreateSubscriptionBodyContent,
    NamespacePropertiesEntry,
    QueueDescriptionEntry,
    QueueDescriptionFeed,
    RuleDescriptionEntry,
    SubscriptionDescriptionEntry,
    TopicDescriptionEntry,
)
from azure.servicebus.management._models import NamespaceProperties
from azure.servicebus.management._utils import (
    deserialize_rule_key_values,
    serialize_rule_key_values,
)

from busd.entities.property_types import UNBOUNDED, format_duration
from busd.http import atom_xml as ax

URL = "https://localhost:5300"


def _parse(data: bytes) -> ET.Element:
    return ET.fromstring(data)


def test_durations_round_trip_in_the_service_spelling():
    assert format_duration(60_000) == "PT1M"
    assert format_duration(30_000) == "PT30S"
    assert format_duration(14 * 86_400_000) == "P14D"
    assert format_duration(500) == "PT0.5S"
    assert format_duration(None) == UNBOUNDED
    assert format_duration(0) == "PT0S"
    assert format_duration(90_061_001) == "P1DT1H1M1.001S"


def test_a_queue_entry_reads_back_in_the_sdk_with_every_value():
    rt = ax.Runtime(
        active=3,
        dead_letter=1,
        scheduled=2,
        message_count=7,
        created_ms=1_700_000_000_000,
        updated_ms=1_700_000_001_000,
        accessed_ms=1_700_000_002_000,
    )
    props = {
        "LockDuration": 30_000,
        "RequiresSession": True,
        "MaxDeliveryCount": 5,
        "UserMetadata": "meta",
        "ForwardDeadLetteredMessagesTo": "sink",
    }
    data = ax.serialize(
        ax.entry(f"{URL}/q1?api-version=2024-05", "q1", ax.description("queue", props, rt))
    )
    entry = QueueDescriptionEntry.deserialize(_parse(data))
    queue = QueueProperties._from_internal_entity(entry.title, entry.content.queue_description)
    assert queue.name == "q1"
    assert queue.lock_duration == dt.timedelta(seconds=30)
    assert queue.requires_session is True
    assert queue.max_delivery_count == 5
    assert queue.user_metadata == "meta"
    assert queue.forward_dead_lettered_messages_to == "sb://localhost/sink"
    assert queue.default_message_time_to_live > dt.timedelta(days=10_000_000)
    assert queue.max_message_size_in_kilobytes == 1024
    runtime = QueueRuntimeProperties._from_internal_entity(
        entry.title, entry.content.queue_description
    )
    assert (
        runtime.active_message_count,
        runtime.dead_letter_message_count,
        runtime.scheduled_message_count,
        runtime.total_message_count,
    ) == (3, 1, 2, 7)
    assert runtime.created_at_utc == dt.datetime.fromtimestamp(1_700_000_000, dt.UTC)


def test_count_details_carries_one_prefix_declaration_and_prefixed_children():
    data = ax.serialize(ax.description("queue", {}, ax.Runtime(active=4)))
    text = data.decode()
    assert (
        '<CountDetails xmlns:d2p1="http://schemas.microsoft.com/netservices/2011/06/'
        'servicebus"><d2p1:ActiveMessageCount>4</d2p1:ActiveMessageCount>' in text
    )
    # the service's element order: LockDuration first, MaxMessageSizeInKilobytes last
    names = [c.tag.rpartition("}")[2] for c in _parse(data)]
    assert names[0] == "LockDuration" and names[-1] == "MaxMessageSizeInKilobytes"
    assert names.index("CountDetails") == names.index("SupportOrdering") + 1


def test_topic_and_subscription_entries_read_back_in_the_sdk():
    data = ax.serialize(
        ax.entry(
            f"{URL}/t1",
            "t1",
            ax.description(
                "topic", {"DefaultMessageTimeToLive": 3_600_000}, ax.Runtime(subscription_count=2)
            ),
        )
    )
    entry = TopicDescriptionEntry.deserialize(_parse(data))
    topic = TopicProperties._from_internal_entity(entry.title, entry.content.topic_description)
    assert topic.name == "t1" and topic.default_message_time_to_live == dt.timedelta(hours=1)
    data = ax.serialize(
        ax.entry(
            f"{URL}/t1/Subscriptions/s1",
            "s1",
            ax.description(
                "subscription", {"RequiresSession": True, "ForwardTo": "q2"}, ax.Runtime()
            ),
            author=None,
        )
    )
    entry = SubscriptionDescriptionEntry.deserialize(_parse(data))
    sub = SubscriptionProperties._from_internal_entity(
        entry.title, entry.content.subscription_description
    )
    assert (
        sub.name == "s1" and sub.requires_session is True and sub.forward_to == "sb://localhost/q2"
    )
    assert sub.dead_lettering_on_filter_evaluation_exceptions is True


def test_what_the_sdk_sends_for_a_queue_parses_order_free_ignoring_read_only_fields():
    queue = QueueProperties(
        "q1",
        authorization_rules=None,
        auto_delete_on_idle=None,
        dead_lettering_on_message_expiration=True,
        default_message_time_to_live=dt.timedelta(
            days=10675199, seconds=10085, microseconds=477539
        ),
        duplicate_detection_history_time_window=dt.timedelta(minutes=2),
        availability_status=None,
        enable_batched_operations=None,
        enable_express=None,
        enable_partitioning=None,
        lock_duration=dt.timedelta(seconds=45),
        max_delivery_count=7,
        max_size_in_megabytes=None,
        requires_duplicate_detection=True,
        requires_session=None,
        status=None,
        forward_to="sb://localhost:5300/q2",
        forward_dead_lettered_messages_to=None,
        user_metadata="m",
        max_message_size_in_kilobytes=None,
    )
    body = CreateQueueBody(
        content=CreateQueueBodyContent(
            queue_description=queue._to_internal_entity("localhost:5300")
        )
    ).serialize(is_xml=True)
    data = ET.tostring(body)
    parsed = ax.parse_description(data, "queue")
    assert parsed == {
        "LockDuration": 45_000,
        "RequiresDuplicateDetection": True,
        "DefaultMessageTimeToLive": None,
        "DeadLetteringOnMessageExpiration": True,
        "DuplicateDetectionHistoryTimeWindow": 120_000,
        "MaxDeliveryCount": 7,
        "ForwardTo": "q2",
        "UserMetadata": "m",
    }


def test_unknown_and_read_only_elements_are_ignored_and_bad_values_refused():
    body = (
        b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        b'<QueueDescription xmlns="' + ax.SB.encode() + b'"><Novel>1</Novel>'
        b"<MessageCount>9</MessageCount><RequiresSession>TRUE</RequiresSession>"
        b"</QueueDescription></content></entry>"
    )
    assert ax.parse_description(body, "queue") == {"RequiresSession": True}
    for bad in (
        b"<MaxDeliveryCount>ten</MaxDeliveryCount>",
        b"<LockDuration>1m</LockDuration>",
        b"<Status>Sleeping</Status>",
    ):
        with pytest.raises(ax.AtomError) as err:
            ax.parse_description(body.replace(b"<Novel>1</Novel>", bad), "queue")
        assert err.value.status == 400
    for broken in (
        b"",
        b"<entry",
        b"<feed/>",
        b'<!DOCTYPE x [<!ENTITY a "aaaa">]><entry>&a;</entry>',
    ):
        with pytest.raises(ax.AtomError) as err:
            ax.parse_description(broken, "queue")
        assert err.value.status == 400


def test_rules_round_trip_through_the_sdk_both_ways():
    from azure.servicebus.management._models import RuleProperties as Rule

    rule = Rule(
        "r2",
        filter=SqlRuleFilter(
            "color = @c", parameters={"@c": "red", "@n": 3, "@big": 2**40, "@f": 1.5}
        ),
        action=SqlRuleAction("SET a = 1"),
        created_at_utc=None,
    )
    internal = rule._to_internal_entity()
    body = CreateRuleBody(content=CreateRuleBodyContent(rule_description=internal))
    element = body.serialize(is_xml=True)
    serialize_rule_key_values(element, rule)
    parsed = ax.parse_rule(ET.tostring(element), "r2")
    assert parsed.filter_type == "SqlFilter" and parsed.sql == "color = @c"
    assert parsed.properties == {"@c": "red", "@n": 3, "@big": 2**40, "@f": 1.5}
    assert parsed.action_sql == "SET a = 1"

    data = ax.serialize(
        ax.entry(
            f"{URL}/t1/Subscriptions/s1/Rules/r2",
            "r2",
            ax.rule_description(parsed, 1_700_000_000_000),
            author=None,
        )
    )
    assert b'i:type="d6p1:string"' in data and b'i:type="d6p1:long"' in data
    element = _parse(data)
    entry = RuleDescriptionEntry.deserialize(element)
    back = RuleProperties._from_internal_entity(entry.title, entry.content.rule_description)
    deserialize_rule_key_values(element, back)
    assert back.name == "r2" and back.filter.sql_expression == "color = @c"
    assert back.filter.parameters == {"@c": "red", "@n": 3, "@big": 2**40, "@f": 1.5}
    assert back.action.sql_expression == "SET a = 1"

    corr = ax.RuleDescription(
        name="r1",
        filter_type="CorrelationFilter",
        correlation={"session_id": "s", "label": "L"},
        properties={"k": True},
    )
    element = _parse(ax.serialize(ax.entry(f"{URL}/x", "r1", ax.rule_description(corr, None))))
    entry = RuleDescriptionEntry.deserialize(element)
    back = RuleProperties._from_internal_entity(entry.title, entry.content.rule_description)
    deserialize_rule_key_values(element, back)
    assert isinstance(back.filter, CorrelationRuleFilter)
    assert (back.filter.session_id, back.filter.label, back.filter.properties) == (
        "s",
        "L",
        {"k": True},
    )


def test_true_and_false_filters_carry_their_expression():
    text = ax.serialize(ax.rule_description(ax.RuleDescription("$Default"), None)).decode()
    assert '<Filter i:type="TrueFilter"><SqlExpression>1=1</SqlExpression>' in text
    assert '<Action i:type="EmptyRuleAction" />' in text


def test_a_subscription_create_with_a_default_rule_parses_it():
    from azure.servicebus.management._models import RuleProperties as Rule

    sub = SubscriptionProperties(
        "s1",
        lock_duration=dt.timedelta(seconds=20),
        requires_session=True,
        default_message_time_to_live=None,
        dead_lettering_on_message_expiration=None,
        dead_lettering_on_filter_evaluation_exceptions=False,
        max_delivery_count=None,
        enable_batched_operations=None,
        status=None,
        forward_to=None,
        user_metadata=None,
        forward_dead_lettered_messages_to=None,
        auto_delete_on_idle=None,
        availability_status=None,
    )
    internal = sub._to_internal_entity("localhost:5300")
    internal.default_rule_description = Rule(
        "$Default", filter=CorrelationRuleFilter(label="x"), action=None, created_at_utc=None
    )._to_internal_entity()
    body = CreateSubscriptionBody(
        content=CreateSubscriptionBodyContent(subscription_description=internal)
    ).serialize(is_xml=True)
    parsed = ax.parse_description(ET.tostring(body), "subscription")
    assert parsed["LockDuration"] == 20_000 and parsed["RequiresSession"] is True
    assert parsed["DeadLetteringOnFilterEvaluationExceptions"] is False
    rule = parsed["DefaultRuleDescription"]
    assert rule.name == "$Default" and rule.filter_type == "CorrelationFilter"
    assert rule.correlation == {"label": "x"}


def test_feeds_page_and_the_not_found_feed_has_the_services_title():
    entries = [
        ax.entry(
            f"{URL}/q{i}",
            f"q{i}",
            ax.description("queue", {}, ax.Runtime()),
            base=f"{URL}/$Resources/queues",
        )
        for i in range(2)
    ]
    nxt = f"{URL}/$Resources/queues?$skip=2&$top=2&api-version=2024-05"
    element = _parse(ax.serialize(ax.feed("Queues", f"{URL}/$Resources/queues", entries, nxt)))
    feed = QueueDescriptionFeed.deserialize(element)
    assert [e.title for e in feed.entry] == ["q0", "q1"]
    assert len(feed.link) == 2 and feed.link[1].href == nxt
    missing = _parse(ax.serialize(ax.not_found_feed()))
    assert missing.find(f"{{{ax.ATOM}}}title").text == "Publicly Listed Services"
    assert QueueDescriptionEntry.deserialize(missing).content is None


def test_namespace_info_and_error_bodies():
    element = _parse(ax.serialize(ax.namespace_info(f"{URL}/$namespaceinfo", 1_700_000_000_000)))
    entry = NamespacePropertiesEntry.deserialize(element)
    info = NamespaceProperties._from_internal_entity(
        entry.title, entry.content.namespace_properties
    )
    assert info.name == "sbemulatorns" and info.messaging_sku == "Premium"
    err = _parse(ax.error(404, "SubCode=40400. Not Found."))
    assert [c.tag for c in err] == ["Code", "Detail"] and err[0].text == "404"
