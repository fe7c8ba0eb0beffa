"""Entities created, read, changed, listed and deleted with the official Python SDK's
ServiceBusAdministrationClient (sync and aio) over HTTPS: queues, topics, subscriptions, rules,
and the SDK's exceptions for what exists or does not."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.e2e.conftest import receive

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([])


@pytest.fixture(scope="module")
def admin(busd):
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as client:
        yield client


def _name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def test_queue_create_get_update_list_delete(busd, admin):
    name = _name("mq")
    created = admin.create_queue(
        name,
        lock_duration=dt.timedelta(seconds=30),
        requires_session=True,
        max_delivery_count=5,
        dead_lettering_on_message_expiration=True,
        default_message_time_to_live=dt.timedelta(hours=2),
        user_metadata="made by a test",
    )
    assert created.name == name and created.requires_session is True
    assert created.lock_duration == dt.timedelta(seconds=30)
    with pytest.raises(ResourceExistsError):
        admin.create_queue(name)
    got = admin.get_queue(name)
    assert (
        got.max_delivery_count,
        got.dead_lettering_on_message_expiration,
        got.default_message_time_to_live,
        got.user_metadata,
    ) == (5, True, dt.timedelta(hours=2), "made by a test")
    got.max_delivery_count = 8
    got.lock_duration = dt.timedelta(seconds=45)
    admin.update_queue(got)
    again = admin.get_queue(name)
    assert again.max_delivery_count == 8 and again.lock_duration == dt.timedelta(seconds=45)
    assert again.requires_session is True and again.user_metadata == "made by a test"
    assert name in [q.name for q in admin.list_queues()]

    # usable over AMQP at once
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender(name) as sender:
            sender.send_messages(ServiceBusMessage("hi", session_id="s"))
        assert admin.get_queue_runtime_properties(name).active_message_count == 1
        with client.get_queue_receiver(name, session_id="s") as receiver:
            (message,) = receive(receiver, 1)
            receiver.complete_message(message)

    admin.delete_queue(name)
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue(name)
    with pytest.raises(ResourceNotFoundError):
        admin.delete_queue(name)
    with pytest.raises(ResourceNotFoundError):
        admin.update_queue(again)


def test_paging_follows_the_next_link(admin):
    names = sorted(_name("pg") for _ in range(5))
    for name in names:
        admin.create_queue(name)
    try:
        listed = [q.name for q in admin.list_queues(max_page_size=2)]
        assert [n for n in listed if n in names] == names
        assert len(listed) == len(set(listed))
    finally:
        for name in names:
            admin.delete_queue(name)


def test_topic_subscription_and_rules(busd, admin):
    from azure.servicebus.management import (
        CorrelationRuleFilter,
        SqlRuleAction,
        SqlRuleFilter,
        TrueRuleFilter,
    )

    topic = _name("mt")
    created = admin.create_topic(topic, default_message_time_to_live=dt.timedelta(hours=1))
    assert created.name == topic
    assert admin.get_topic(topic).default_message_time_to_live == dt.timedelta(hours=1)
    with pytest.raises(ResourceExistsError):
        admin.create_topic(topic)
    with pytest.raises(ResourceExistsError):
        admin.create_queue(topic)  # one name, one entity
    assert topic in [t.name for t in admin.list_topics()]

    sub = admin.create_subscription(
        topic,
        "s1",
        requires_session=True,
        max_delivery_count=3,
        lock_duration=dt.timedelta(seconds=20),
    )
    assert (sub.name, sub.requires_session, sub.max_delivery_count) == ("s1", True, 3)
    got = admin.get_subscription(topic, "s1")
    assert got.lock_duration == dt.timedelta(seconds=20)
    got.max_delivery_count = 6
    admin.update_subscription(topic, got)
    assert admin.get_subscription(topic, "s1").max_delivery_count == 6
    assert [s.name for s in admin.list_subscriptions(topic)] == ["s1"]
    rt = admin.get_subscription_runtime_properties(topic, "s1")
    assert (rt.active_message_count, rt.total_message_count) == (0, 0)
    assert admin.get_topic_runtime_properties(topic).subscription_count == 1
    with pytest.raises(ResourceExistsError):
        admin.create_subscription(topic, "s1")
    with pytest.raises(ResourceNotFoundError):
        admin.create_subscription(_name("nosuch"), "s1")

    rules = {r.name: r for r in admin.list_rules(topic, "s1")}
    assert list(rules) == ["$Default"] and isinstance(rules["$Default"].filter, TrueRuleFilter)
    admin.create_rule(
        topic,
        "s1",
        "red",
        filter=SqlRuleFilter("color = @c", parameters={"@c": "red", "@n": 2}),
        action=SqlRuleAction("SET seen = true"),
    )
    admin.create_rule(
        topic,
        "s1",
        "corr",
        filter=CorrelationRuleFilter(
            session_id="s-9", label="L", properties={"kind": "blue", "big": 2**40}
        ),
    )
    red = admin.get_rule(topic, "s1", "red")
    assert red.filter.sql_expression == "color = @c"
    assert red.filter.parameters == {"@c": "red", "@n": 2}
    assert red.action.sql_expression == "SET seen = true"
    corr = admin.get_rule(topic, "s1", "corr")
    assert (corr.filter.session_id, corr.filter.label) == ("s-9", "L")
    assert corr.filter.properties == {"kind": "blue", "big": 2**40}
    with pytest.raises(ResourceExistsError):
        admin.create_rule(topic, "s1", "red")
    with pytest.raises(HttpResponseError) as refused:  # 400: the SQL does not parse
        admin.create_rule(topic, "s1", "broken", filter=SqlRuleFilter("color = = 'x'"))
    assert refused.value.status_code == 400
    assert sorted(r.name for r in admin.list_rules(topic, "s1")) == ["$Default", "corr", "red"]
    admin.delete_rule(topic, "s1", "red")
    with pytest.raises(ResourceNotFoundError):
        admin.get_rule(topic, "s1", "red")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_rule(topic, "s1", "red")

    admin.delete_subscription(topic, "s1")
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription(topic, "s1")
    admin.create_subscription(topic, "s2")
    admin.delete_topic(topic)  # takes its subscriptions along
    with pytest.raises(ResourceNotFoundError):
        admin.get_topic(topic)
    with pytest.raises(ResourceNotFoundError):
        admin.get_subscription(topic, "s2")


async def test_the_async_client_does_the_same(busd):
    from azure.servicebus.aio.management import (
        ServiceBusAdministrationClient as AsyncAdministrationClient,
    )

    name = _name("aq")
    async with AsyncAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as admin:
        created = await admin.create_queue(name, max_delivery_count=4)
        assert created.max_delivery_count == 4
        with pytest.raises(ResourceExistsError):
            await admin.create_queue(name)
        queue_props = await admin.get_queue(name)
        queue_props.max_delivery_count = 9
        await admin.update_queue(queue_props)
        assert (await admin.get_queue(name)).max_delivery_count == 9
        assert name in [q.name async for q in admin.list_queues()]
        rt = await admin.get_queue_runtime_properties(name)
        assert rt.active_message_count == 0 and rt.total_message_count == 0
        topic = _name("at")
        await admin.create_topic(topic)
        await admin.create_subscription(topic, "s")
        assert [s.name async for s in admin.list_subscriptions(topic)] == ["s"]
        await admin.delete_topic(topic)
        await admin.delete_queue(name)
        with pytest.raises(ResourceNotFoundError):
            await admin.get_queue(name)
        info = await admin.get_namespace_properties()
        assert info.name == "sbemulatorns"
