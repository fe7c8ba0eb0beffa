"""Auto-forwarding through the official azure-servicebus SDK: ForwardTo and
ForwardDeadLetteredMessagesTo on queues and subscriptions, set in the entities file or at run
time with ServiceBusAdministrationClient (absolute URLs, as the SDK sends them); the
NServiceBus topology; chains, hop limit, refusals; two busd processes forwarding one queue."""

from __future__ import annotations

import time
import urllib.request
import uuid

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import OperationTimeoutError
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    ServiceBusAdministrationClient,
)

from tests.conftest import start_valkey_cluster
from tests.e2e.conftest import launch_busd, queue, receive, subscription, topic, write_config

pytestmark = pytest.mark.timeout(120)

HOPS_DESCRIPTION = (
    "The maximum number of allowed hops when forwarding between queues has been "
    "exceeded. This value is set to 4."
)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("file-in", ForwardTo="file-out"), queue("file-out")])


@pytest.fixture(scope="module")
def admin(busd):
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as client:
        yield client


@pytest.fixture(scope="module")
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


def _name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def _url(busd, name: str) -> str:
    return f"sb://localhost:{busd.port}/{name}"


def drain_queue(client, name: str, count: int, **kwargs) -> list:
    with client.get_queue_receiver(name, max_wait_time=2, **kwargs) as rx:
        got = receive(rx, count, wait=2, patience=10)
        for m in got:
            rx.complete_message(m)
        return got


def peek_all(client, name: str, **kwargs) -> list:
    with client.get_queue_receiver(name, **kwargs) as rx:
        return rx.peek_messages(max_message_count=100)


def test_entities_file_forwarding_moves_each_message_as_a_new_one(busd, admin, client):
    # a receiver may attach to a forwarding source (the SDKs open one to peek): it gets nothing
    with client.get_queue_receiver("file-in", max_wait_time=1) as rx:
        with client.get_queue_sender("file-in") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(f"m{i}", message_id=f"id{i}", application_properties={"k": i})
                    for i in range(3)
                ]
            )
        assert rx.receive_messages(max_wait_time=1) == []
    got = drain_queue(client, "file-out", 3)
    assert [(str(m), m.message_id, m.application_properties[b"k"]) for m in got] == [
        (f"m{i}", f"id{i}", i) for i in range(3)
    ]
    # new numbers at the destination; the source's first numbers carried along
    assert [m.enqueued_sequence_number for m in got] == [1, 2, 3]
    assert all(m.delivery_count == 0 for m in got)
    assert admin.get_queue_runtime_properties("file-in").total_message_count == 0
    metrics = urllib.request.urlopen(f"{busd.http_url}/metrics", timeout=5).read().decode()
    assert 'busd_messages_forwarded_total{entity="file-in"} 3.0' in metrics


def test_nservicebus_subscription_forwards_what_its_rules_take(busd, admin, client):
    bundle, endpoint = _name("bundle"), _name("endpoint")
    admin.create_topic(bundle)
    admin.create_queue(endpoint)
    admin.create_subscription(
        bundle,
        endpoint,
        forward_to=_url(busd, endpoint),
        lock_duration="PT5M",
        max_delivery_count=2_147_483_647,
        dead_lettering_on_filter_evaluation_exceptions=False,
    )
    admin.create_subscription(bundle, "audit")  # sees the topic's numbers
    admin.delete_rule(bundle, endpoint, "$Default")
    admin.create_rule(bundle, endpoint, "$default", filter=FalseRuleFilter())
    admin.create_rule(
        bundle,
        endpoint,
        "my-event",
        filter=CorrelationRuleFilter(properties={"NServiceBus.EnclosedMessageTypes": "MyEvent"}),
    )
    assert admin.get_subscription(bundle, endpoint).forward_to.endswith(endpoint)
    with client.get_topic_sender(bundle) as sender:
        for i, kind in enumerate(["Other", "MyEvent", "Other", "MyEvent"]):
            sender.send_messages(
                ServiceBusMessage(
                    f"e{i}", application_properties={"NServiceBus.EnclosedMessageTypes": kind}
                )
            )
    with client.get_subscription_receiver(bundle, "audit", max_wait_time=2) as rx:
        topic_seq = {str(m): m.sequence_number for m in receive(rx, 4)}
    got = drain_queue(client, endpoint, 2)
    assert admin.get_queue_runtime_properties(endpoint).total_message_count == 0
    assert [str(m) for m in got] == ["e1", "e3"]
    assert [m.sequence_number for m in got] == [1, 2]  # the endpoint queue's own numbers
    assert [m.enqueued_sequence_number for m in got] == [topic_seq["e1"], topic_seq["e3"]]
    assert topic_seq["e3"] > 2


def test_a_chain_of_queue_queue_topic(busd, admin, client):
    q1, q2, t = _name("c1"), _name("c2"), _name("ct")
    admin.create_topic(t)
    admin.create_subscription(t, "s")
    admin.create_queue(q2, forward_to=_url(busd, t))
    admin.create_queue(q1, forward_to=_url(busd, q2))
    with client.get_queue_sender(q1) as sender:
        sender.send_messages([ServiceBusMessage(f"x{i}", session_id="ignored") for i in range(5)])
    with client.get_subscription_receiver(t, "s", max_wait_time=2) as rx:
        got = receive(rx, 5)
        for m in got:
            rx.complete_message(m)
    assert [str(m) for m in got] == [f"x{i}" for i in range(5)]  # in the order received
    assert [m.enqueued_sequence_number for m in got] == [1, 2, 3, 4, 5]
    assert [m.session_id for m in got] == ["ignored"] * 5  # the message's group-id, unchanged


def test_dead_letters_are_forwarded_with_their_source_and_reason(busd, admin, client):
    src, sink = _name("dsrc"), _name("dsink")
    admin.create_queue(sink)
    admin.create_queue(
        src, max_delivery_count=2, forward_dead_lettered_messages_to=_url(busd, sink)
    )
    with client.get_queue_sender(src) as sender:
        sender.send_messages([ServiceBusMessage("explicit"), ServiceBusMessage("poison")])
    with client.get_queue_receiver(src, max_wait_time=2) as rx:
        first, second = receive(rx, 2)
        rx.dead_letter_message(first, reason="bad", error_description="why")
        rx.abandon_message(second)
        (again,) = receive(rx, 1)
        rx.abandon_message(again)  # the second failed delivery: MaxDeliveryCountExceeded
    got = {str(m): m for m in drain_queue(client, sink, 2)}
    assert set(got) == {"explicit", "poison"}
    assert got["explicit"].dead_letter_source == src
    assert (got["explicit"].dead_letter_reason, got["explicit"].dead_letter_error_description) == (
        "bad",
        "why",
    )
    assert got["poison"].dead_letter_source == src
    assert got["poison"].dead_letter_reason == "MaxDeliveryCountExceeded"
    assert got["explicit"].enqueued_sequence_number == 1
    assert admin.get_queue_runtime_properties(src).total_message_count == 0


def test_a_cycle_stops_after_four_hops(busd, admin, client):
    a, b = _name("ca"), _name("cb")
    admin.create_queue(a)
    admin.create_queue(b, forward_to=_url(busd, a))
    found = admin.get_queue(a)
    found.forward_to = _url(busd, b)
    admin.update_queue(found)
    with client.get_queue_sender(a) as sender:
        sender.send_messages(ServiceBusMessage("loop"))
    # a -> b -> a -> b -> a: four hops; the fifth is refused where the message sits
    (dead,) = drain_queue(client, a, 1, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert str(dead) == "loop"
    assert dead.dead_letter_reason == "MaxTransferHopCountExceeded"
    assert dead.dead_letter_error_description == HOPS_DESCRIPTION
    assert dead.enqueued_sequence_number == 1
    assert admin.get_queue_runtime_properties(b).total_message_count == 0


def test_a_six_entity_chain_ends_in_the_fifth_entitys_dead_letters(busd, admin, client):
    names = [_name(f"h{i}") for i in range(6)]
    admin.create_queue(names[-1])
    for i in range(4, -1, -1):
        admin.create_queue(names[i], forward_to=_url(busd, names[i + 1]))
    with client.get_queue_sender(names[0]) as sender:
        sender.send_messages(ServiceBusMessage("far"))
    (dead,) = drain_queue(client, names[4], 1, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert dead.dead_letter_reason == "MaxTransferHopCountExceeded"
    assert admin.get_queue_runtime_properties(names[5]).total_message_count == 0


def test_a_dead_letter_cycle_does_not_loop(busd, admin, client):
    a, b = _name("da"), _name("db")
    admin.create_queue(a)
    admin.create_queue(b, forward_to=_url(busd, a), forward_dead_lettered_messages_to=_url(busd, a))
    found = admin.get_queue(a)
    found.forward_to = found.forward_dead_lettered_messages_to = _url(busd, b)
    admin.update_queue(found)
    with client.get_queue_sender(a) as sender:
        sender.send_messages(ServiceBusMessage("stuck"))
    deadline = time.monotonic() + 10
    while admin.get_queue_runtime_properties(a).dead_letter_message_count == 0:
        assert time.monotonic() < deadline, "the message never came to rest"
        time.sleep(0.05)
    # it stays in a's dead letters (deferred: its forwarder does not take it again)
    time.sleep(0.3)
    (parked,) = peek_all(client, a, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert parked.dead_letter_reason == "MaxTransferHopCountExceeded"
    assert parked.enqueued_sequence_number == 1
    assert admin.get_queue_runtime_properties(a).dead_letter_message_count == 1
    assert admin.get_queue_runtime_properties(b).total_message_count == 0


def test_a_deleted_destination_sends_messages_to_the_sources_dead_letters(busd, admin, client):
    src, dst = _name("gsrc"), _name("gdst")
    admin.create_queue(dst)
    admin.create_queue(src, forward_to=_url(busd, dst))
    admin.delete_queue(dst)
    with client.get_queue_sender(src) as sender:
        sender.send_messages(ServiceBusMessage("orphan"))
    (dead,) = drain_queue(client, src, 1, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert str(dead) == "orphan" and dead.dead_letter_reason == "MessagingEntityNotFound"


def test_forwarding_to_what_does_not_exist_is_refused(busd, admin):
    missing = _url(busd, _name("missing"))
    with pytest.raises(HttpResponseError) as refused:
        admin.create_queue(_name("bad"), forward_to=missing)
    assert refused.value.status_code == 400 and "is not a queue or topic" in str(refused.value)
    ok = _name("ok")
    admin.create_queue(ok)
    found = admin.get_queue(ok)
    found.forward_dead_lettered_messages_to = missing
    with pytest.raises(HttpResponseError) as refused:
        admin.update_queue(found)
    assert refused.value.status_code == 400
    assert admin.get_queue(ok).forward_dead_lettered_messages_to is None


def test_a_session_queue_forwards_and_its_messages_keep_their_session_ids(busd, admin, client):
    """Service Bus takes ForwardTo on a session-enabled queue or subscription: each message
    moves with its session id, in its session's order."""
    src, dst, plain = _name("ssrc"), _name("sdst"), _name("splain")
    admin.create_queue(dst, requires_session=True)
    admin.create_queue(plain)
    admin.create_queue(src, requires_session=True, forward_to=_url(busd, dst))
    with client.get_queue_sender(src) as sender:
        sender.send_messages(
            [
                ServiceBusMessage("a1", session_id="a"),
                ServiceBusMessage("b1", session_id="b"),
                ServiceBusMessage("a2", session_id="a"),
            ]
        )
    # its sessions cannot be locked: the forwarder takes every message
    with pytest.raises(OperationTimeoutError):
        with client.get_queue_receiver(
            src, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
        ) as rx:
            rx.receive_messages(max_wait_time=1)
    for session, bodies in (("a", ["a1", "a2"]), ("b", ["b1"])):
        got = drain_queue(client, dst, len(bodies), session_id=session)
        assert [str(m) for m in got] == bodies
        assert {m.session_id for m in got} == {session}
    assert admin.get_queue_runtime_properties(src).total_message_count == 0

    # to a plain queue, and from a session subscription, the session id goes along
    admin.create_topic(topic := _name("stopic"))
    admin.create_subscription(topic, "s", requires_session=True, forward_to=_url(busd, plain))
    with client.get_topic_sender(topic) as sender:
        sender.send_messages(ServiceBusMessage("t1", session_id="c"))
    (got,) = drain_queue(client, plain, 1)
    assert (str(got), got.session_id) == ("t1", "c")
    assert admin.get_subscription(topic, "s").forward_to.endswith(f"/{plain}")


def test_a_queue_naming_itself_keeps_its_messages(busd, admin, client):
    """Service Bus takes a queue that names itself as ForwardTo (and as
    ForwardDeadLetteredMessagesTo); busd keeps such messages where they are rather than loop
    them (docs/design.md §2.15)."""
    name = _name("self")
    admin.create_queue(
        name, forward_to=_url(busd, name), forward_dead_lettered_messages_to=_url(busd, name)
    )
    found = admin.get_queue(name)
    answered = f"sb://localhost:{busd.http_port}/{name}"  # the URL on the host addressed
    assert found.forward_to == found.forward_dead_lettered_messages_to == answered
    admin.update_queue(found)  # as the SDK's tests do: the definition is taken again
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage("kept"), ServiceBusMessage("dead")])
    with client.get_queue_receiver(name) as rx:
        got = {str(m): m for m in receive(rx, 2)}
        rx.complete_message(got["kept"])
        rx.dead_letter_message(got["dead"], reason="test")
    (dead,) = drain_queue(client, name, 1, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert (str(dead), dead.dead_letter_reason) == ("dead", "test")
    assert admin.get_queue_runtime_properties(name).total_message_count == 0


def test_two_processes_forward_one_queue_in_order_exactly_once(busd_factory):
    entities = [queue("two-in", ForwardTo="two-out"), queue("two-out")]
    first = busd_factory(entities, prefix=(prefix := f"e2e-{uuid.uuid4().hex[:10]}"))
    busd_factory(entities, prefix=prefix)
    n = 400
    with ServiceBusClient.from_connection_string(first.connection_string) as client:
        with client.get_queue_sender("two-in") as sender:
            for start in range(0, n, 50):
                sender.send_messages(
                    [ServiceBusMessage(str(i), message_id=str(i)) for i in range(start, start + 50)]
                )
        with client.get_queue_receiver("two-out", max_wait_time=2, prefetch_count=100) as rx:
            got = receive(rx, n, wait=2, patience=20)
            for m in got:
                rx.complete_message(m)
            got += rx.receive_messages(max_wait_time=1)
    assert [str(m) for m in got] == [str(i) for i in range(n)]
    assert [m.enqueued_sequence_number for m in got] == list(range(1, n + 1))


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory):
    """A one-node Valkey cluster: every entity in a slot of its own tag."""
    server = start_valkey_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield server.connection_url + "?cluster=true"
    finally:
        server.stop()


def test_forwarding_over_a_redis_cluster(tmp_path, cluster_url):
    config = write_config(
        tmp_path / "Config.json",
        [queue("k-in", ForwardTo="k-mid"), queue("k-mid", ForwardTo="k-t")],
        [topic("k-t", [subscription("s")])],
    )
    busd = launch_busd(cluster_url, config, tmp_path)
    try:
        with ServiceBusClient.from_connection_string(busd.connection_string) as client:
            with client.get_queue_sender("k-in") as sender:
                sender.send_messages([ServiceBusMessage(str(i)) for i in range(50)])
            with client.get_subscription_receiver("k-t", "s", max_wait_time=2) as rx:
                got = receive(rx, 50)
                for m in got:
                    rx.complete_message(m)
                got += rx.receive_messages(max_wait_time=0.5)
        assert [str(m) for m in got] == [str(i) for i in range(50)]
        assert [m.enqueued_sequence_number for m in got] == list(range(1, 51))
    finally:
        busd.stop()
