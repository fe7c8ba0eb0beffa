"""Partitioned entities through the official azure-servicebus SDK on one Valkey: a session
queue spread over 4 partitions is one queue to its clients (docs/design.md §3.18)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from azure.core.exceptions import HttpResponseError
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
)
from azure.servicebus.exceptions import SessionCannotBeLockedError
from azure.servicebus.management import ServiceBusAdministrationClient
from click.testing import CliRunner
from proton import Message

from busd.cli.main import cli
from busd.storage.keys import hash_tag, partition_scope
from busd.storage.partitioned.routing import PARTITION_SHIFT, partition_of_key
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import launch_busd, queue, receive, subscription, topic, write_config
from tests.e2e.txn_client import Refused, Transactions, peek_all, send, settle, take

pytestmark = pytest.mark.timeout(120)
PARTITIONS = 4


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue(
                "orders",
                RequiresSession=True,
                EnablePartitioning=True,
                PartitionCount=PARTITIONS,
                LockDuration="PT10S",
            ),
            queue("spread", EnablePartitioning=True, PartitionCount=PARTITIONS),
            queue("other"),
        ],
        topics=[
            topic(
                "events",
                [subscription("by-session", RequiresSession=True), subscription("all")],
                EnablePartitioning=True,
                PartitionCount=PARTITIONS,
            )
        ],
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


@pytest.fixture(scope="module")
def admin(busd):
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as client:
        yield client


def sessions_in_every_partition(count_each: int = 2) -> list[str]:
    """Session ids, `count_each` of them in each partition."""
    found: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while any(len(v) < count_each for v in found.values()):
        sid = f"s-{i}"
        p = partition_of_key(sid, PARTITIONS)
        if len(found[p]) < count_each:
            found[p].append(sid)
        i += 1
    return [sid for ids in found.values() for sid in ids]


def test_sessions_keep_order_and_numbers_name_their_partition(busd, client, admin, redis_url):
    sids = sessions_in_every_partition()
    with client.get_queue_sender("orders") as sender:
        for n in range(5):
            sender.send_messages([ServiceBusMessage(f"{sid}:{n}", session_id=sid) for sid in sids])
    seen: dict[str, list[int]] = {}
    assert admin.get_queue_runtime_properties("orders").active_message_count == 5 * len(sids)
    for _ in sids:
        with client.get_queue_receiver(
            "orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver:
            sid = receiver.session.session_id
            got = receive(receiver, 5)
            assert [str(m) for m in got] == [f"{sid}:{n}" for n in range(5)]
            parts = {m.sequence_number >> PARTITION_SHIFT for m in got}
            assert parts == {partition_of_key(sid, PARTITIONS)}
            seen[sid] = [m.sequence_number for m in got]
            for m in got:
                receiver.complete_message(m)
    assert sorted(seen) == sorted(sids)
    # every partition has keys of its own hash tag
    r = redis.Redis.from_url(redis_url)
    tags = {k.split(b"}")[0] for k in r.scan_iter(match=f"{{{busd.prefix}:orders:*".encode())}
    assert tags == partition_tags(busd.prefix, "orders")


def partition_tags(prefix: str, entity: str) -> set[bytes]:
    """The hash tags of an entity's partitions, up to their `}` (busd.storage.keys)."""
    return {
        hash_tag(prefix, partition_scope(entity, p, PARTITIONS)).rstrip("}").encode()
        for p in range(PARTITIONS)
    }


def test_a_session_is_exclusive_across_partitions(busd, client):
    sids = sessions_in_every_partition(1)
    with client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage("x", session_id=sid) for sid in sids])
    receivers = [
        client.get_queue_receiver("orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5)
        for _ in sids
    ]
    try:
        for r in receivers:
            r.__enter__()
        held = [r.session.session_id for r in receivers]
        assert sorted(held) == sorted(sids)  # each acceptor got a different session
        with pytest.raises(SessionCannotBeLockedError):
            with client.get_queue_receiver("orders", session_id=sids[0], max_wait_time=2) as other:
                other.receive_messages(max_message_count=1, max_wait_time=1)
        for r in receivers:
            for m in receive(r, 1):
                r.complete_message(m)
    finally:
        for r in receivers:
            r.__exit__(None, None, None)


def test_a_waiting_acceptor_gets_a_session_freed_in_any_partition(busd, client):
    """Acceptors wait on an empty queue; a message in each partition wakes exactly one."""
    sids = sessions_in_every_partition(1)
    got: list[str] = []
    took: list[float] = []

    def accept() -> None:
        with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
            with sb.get_queue_receiver(
                "orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=20
            ) as receiver:
                for m in receive(receiver, 1):
                    receiver.complete_message(m)
                got.append(receiver.session.session_id)
                took.append(time.monotonic())

    threads = [threading.Thread(target=accept) for _ in sids]
    for t in threads:
        t.start()
    time.sleep(2)  # all waiting, registered in every partition
    with client.get_queue_sender("orders") as sender:
        for sid in sids:
            sender.send_messages(ServiceBusMessage("wake", session_id=sid))
    sent = time.monotonic()
    for t in threads:
        t.join(30)
    assert sorted(got) == sorted(sids)
    # woken, not found later when an acceptor's wait ran out
    assert max(took) - sent < 8


def test_deferral_scheduling_and_counts(busd, client, admin):
    sid = sessions_in_every_partition(1)[-1]  # a partition other than 0
    partition = partition_of_key(sid, PARTITIONS)
    assert partition != 0
    with client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage(f"d{n}", session_id=sid) for n in range(3)])
        later = datetime.now(UTC) + timedelta(hours=1)
        (scheduled,) = sender.schedule_messages(ServiceBusMessage("later", session_id=sid), later)
        assert scheduled >> PARTITION_SHIFT == partition
        props = admin.get_queue_runtime_properties("orders")
        assert (props.active_message_count, props.scheduled_message_count) == (3, 1)
        sender.cancel_scheduled_messages(scheduled)
    with client.get_queue_receiver("orders", session_id=sid, max_wait_time=5) as receiver:
        got = receive(receiver, 3)
        numbers = [m.sequence_number for m in got]
        for m in got:
            receiver.defer_message(m)
        props = admin.get_queue_runtime_properties("orders")
        assert (
            props.total_message_count,
            props.active_message_count,
            props.scheduled_message_count,
        ) == (3, 0, 0)  # the three deferred
        peeked = receiver.peek_messages(max_message_count=10, sequence_number=numbers[1])
        assert [m.sequence_number for m in peeked] == numbers[1:]
        deferred = receiver.receive_deferred_messages(numbers)
        assert [str(m) for m in deferred] == ["d0", "d1", "d2"]
        for m in deferred:
            receiver.complete_message(m)
    props = admin.get_queue_runtime_properties("orders")
    assert props.total_message_count == 0


def test_plain_receivers_are_fed_from_every_partition(busd, client):
    with client.get_queue_sender("spread") as sender:
        sender.send_messages([ServiceBusMessage(f"m{n}") for n in range(40)])
    with client.get_queue_receiver("spread", max_wait_time=3) as receiver:
        got = receive(receiver, 40)
        assert sorted(str(m) for m in got) == sorted(f"m{n}" for n in range(40))
        assert {m.sequence_number >> PARTITION_SHIFT for m in got} == set(range(PARTITIONS))
        for m in got:
            receiver.complete_message(m)


def test_sessions_are_listed_as_one_queue(busd, client):
    sids = sessions_in_every_partition(1)
    with client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage("l", session_id=sid) for sid in sids])
    assert sorted(client.list_queue_sessions("orders")) == sorted(sids)
    for sid in sids:
        with client.get_queue_receiver("orders", session_id=sid, max_wait_time=5) as r:
            for m in receive(r, 1):
                r.complete_message(m)


def test_the_management_api_creates_a_partitioned_queue(busd, client, admin):
    created = admin.create_queue(
        "made-partitioned", enable_partitioning=True, requires_session=True
    )
    assert created.enable_partitioning
    with client.get_queue_sender("made-partitioned") as sender:
        sender.send_messages(
            [ServiceBusMessage("p", session_id=sid) for sid in sessions_in_every_partition(1)]
        )
    with client.get_queue_receiver("made-partitioned", session_id="s-0") as receiver:
        (m,) = receive(receiver, 1)
        # 16 partitions by default
        assert m.sequence_number >> PARTITION_SHIFT == partition_of_key("s-0", 16)
        receiver.complete_message(m)
    changed = admin.get_queue("made-partitioned")
    changed.enable_partitioning = False
    with pytest.raises(HttpResponseError):
        admin.update_queue(changed)
    assert admin.get_queue("made-partitioned").enable_partitioning
    admin.delete_queue("made-partitioned")


def test_a_transaction_stays_in_one_partition(busd):
    """Work in the partition of the session received from commits together; work in another
    partition, or on another entity, is refused and the rest still commits."""
    sids = sessions_in_every_partition(2)
    here, same, elsewhere = sids[0], sids[1], sids[-1]
    assert (
        partition_of_key(here, PARTITIONS)
        == partition_of_key(same, PARTITIONS)
        != partition_of_key(elsewhere, PARTITIONS)
    )
    with ProtonCbsClient(busd.port) as c:
        for entity in ("orders", "other", "events"):
            c.authorize(entity)
        sender = c.sender("orders")
        sender.send(Message(body="in", group_id=here))
        receiver = c.receiver("orders", session=here)
        _, delivery = take(receiver)
        txns = Transactions(c)
        txn = txns.declare()
        settle(c, delivery, txn)
        send(c, sender, txn, Message(body="out", group_id=same))
        for refused_send in (
            lambda: send(c, sender, txn, Message(body="x", group_id=elsewhere)),
            lambda: send(c, c.sender("other"), txn, Message(body="y")),
            lambda: send(c, c.sender("events"), txn, Message(body="z")),
        ):
            with pytest.raises(Refused) as err:
                refused_send()
            assert err.value.condition == "amqp:not-allowed"
            assert "partition" in str(err.value)
        assert sorted(m.body for m in peek_all(c, "orders")) == ["in"]
        txns.commit(txn)
        receiver.close()
        bodies = {m.body: m.annotations["x-opt-sequence-number"] for m in peek_all(c, "orders")}
        assert sorted(bodies) == ["out"]
        assert {n >> PARTITION_SHIFT for n in bodies.values()} == {
            partition_of_key(here, PARTITIONS)
        }
        assert peek_all(c, "other") == []
    for sid in (same,):
        with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
            with sb.get_queue_receiver("orders", session_id=sid, max_wait_time=5) as r:
                for m in receive(r, 1):
                    r.complete_message(m)


def test_a_partitioned_topic_spreads_its_subscriptions(busd, client, admin, redis_url):
    sids = sessions_in_every_partition(1)
    with client.get_topic_sender("events") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"{sid}:{n}", session_id=sid) for n in range(3) for sid in sids]
        )
        later = datetime.now(UTC) + timedelta(hours=1)
        (scheduled,) = sender.schedule_messages(
            ServiceBusMessage("later", session_id=sids[-1]), later
        )
        assert scheduled >> PARTITION_SHIFT == partition_of_key(sids[-1], PARTITIONS)
        props = admin.get_subscription_runtime_properties("events", "all")
        assert (props.active_message_count, props.total_message_count) == (
            3 * len(sids),
            3 * len(sids) + 1,
        )  # and the scheduled one
        sender.cancel_scheduled_messages(scheduled)
    assert admin.get_subscription_runtime_properties(
        "events", "by-session"
    ).total_message_count == 3 * len(sids)
    for _ in sids:
        with client.get_subscription_receiver(
            "events", "by-session", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver:
            sid = receiver.session.session_id
            got = receive(receiver, 3)
            assert [str(m) for m in got] == [f"{sid}:{n}" for n in range(3)]
            assert {m.sequence_number >> PARTITION_SHIFT for m in got} == {
                partition_of_key(sid, PARTITIONS)
            }
            for m in got:
                receiver.complete_message(m)
    with client.get_subscription_receiver("events", "all", max_wait_time=3) as receiver:
        got = receive(receiver, 3 * len(sids))
        assert len(got) == 3 * len(sids)
        for m in got:
            receiver.complete_message(m)
    for name in ("all", "by-session"):
        assert admin.get_subscription_runtime_properties("events", name).total_message_count == 0
    r = redis.Redis.from_url(redis_url)
    tags = {k.split(b"}")[0] for k in r.scan_iter(match=f"{{{busd.prefix}:events:*".encode())}
    assert tags == partition_tags(busd.prefix, "events")


def test_a_partitioned_topic_is_deleted_with_every_partition(busd, admin, redis_url):
    admin.create_topic("gone", enable_partitioning=True)
    admin.create_subscription("gone", "s")
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_topic_sender("gone") as sender:
            sender.send_messages([ServiceBusMessage(str(n)) for n in range(20)])
    assert admin.get_subscription_runtime_properties("gone", "s").active_message_count == 20
    r = redis.Redis.from_url(redis_url)
    assert list(r.scan_iter(match=f"{{{busd.prefix}:gone:*".encode()))
    admin.delete_topic("gone")
    assert list(r.scan_iter(match=f"{{{busd.prefix}:gone:*:s:*".encode())) == []


def cli_tool(busd, *args: str):
    result = CliRunner().invoke(cli, [*args, "--url", busd.http_url], prog_name="busd")
    assert result.exit_code == 0, result.output
    return result


def test_the_tools_create_a_partitioned_queue_and_show_it_as_one(busd):
    cli_tool(
        busd,
        "queue",
        "create",
        "by-cli",
        "--partitioning",
        "--partitions",
        "4",
        "--requires-session",
    )
    sids = sessions_in_every_partition(1)
    for sid in sids:
        cli_tool(busd, "send", "by-cli", "--session", sid, f"from {sid}")
    found = {q["name"]: q for q in json.loads(cli_tool(busd, "queues", "--json").stdout)}
    assert found["by-cli"]["counts"]["active"] == len(sids)
    listed = json.loads(cli_tool(busd, "sessions", "by-cli", "--json").stdout)["sessions"]
    # the inspector merges the partitions' pages, in id order
    assert [s["session_id"] for s in listed] == sorted(sids)
    paged = json.loads(
        cli_tool(busd, "sessions", "by-cli", "--page", "1", "--all", "--json").stdout
    )["sessions"]
    assert [s["session_id"] for s in paged] == sorted(sids)
    peeked = json.loads(cli_tool(busd, "peek", "by-cli", "--json").stdout)
    assert sorted(m["body"] for m in peeked) == sorted(f"from {sid}" for sid in sids)
    assert cli_tool(busd, "purge", "by-cli").exit_code == 0
    found = {q["name"]: q for q in json.loads(cli_tool(busd, "queues", "--json").stdout)}
    assert found["by-cli"]["counts"]["active"] == 0


def test_the_entities_file_cannot_repartition_a_queue_with_messages(redis_url, tmp_path):
    """Its messages live in its partitions' keys: a file that changes the partitioning of a
    stored queue is warned about and the queue keeps its messages."""
    prefix = f"repart-{uuid.uuid4().hex[:8]}"
    for partitioned in (True, False):
        config = write_config(
            tmp_path / f"Config-{partitioned}.json",
            [queue("kept", EnablePartitioning=partitioned, PartitionCount=PARTITIONS)],
        )
        proc = launch_busd(redis_url, config, tmp_path, prefix=prefix)
        try:
            with ServiceBusClient.from_connection_string(proc.connection_string) as sb:
                if partitioned:
                    with sb.get_queue_sender("kept") as sender:
                        sender.send_messages([ServiceBusMessage(str(n)) for n in range(8)])
                    continue
                with sb.get_queue_receiver("kept", max_wait_time=3) as receiver:
                    got = receive(receiver, 8)
                    assert sorted(str(m) for m in got) == [str(n) for n in range(8)]
                    for m in got:
                        receiver.complete_message(m)
            assert "partitioning is fixed" in proc.log_text()
        finally:
            proc.stop()


def test_an_acceptor_woken_by_two_partitions_passes_one_wake_up_on(busd_factory):
    """Two sessions freed at once in two partitions both wake the oldest waiting acceptor; it
    takes one and hands the other partition's wake-up to the next waiter. (The sweep, which
    would also find them, is slowed down so that it cannot.)"""
    slow = busd_factory(
        [queue("pairs", RequiresSession=True, EnablePartitioning=True, PartitionCount=PARTITIONS)],
        extra_env={"BUSD_SWEEP_INTERVAL": "60"},
    )
    a, b = sessions_in_every_partition(1)[:2]
    got: dict[str, float] = {}

    def accept(name: str) -> None:
        with ServiceBusClient.from_connection_string(slow.connection_string) as sb:
            with sb.get_queue_receiver(
                "pairs", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=15
            ) as receiver:
                got[name] = time.monotonic()
                for m in receive(receiver, 1):
                    receiver.complete_message(m)

    threads = [threading.Thread(target=accept, args=(name,)) for name in ("older", "younger")]
    for t in threads:
        t.start()
        time.sleep(1.5)  # "older" waits first: the oldest waiter of every partition
    with ServiceBusClient.from_connection_string(slow.connection_string) as sb:
        with sb.get_queue_sender("pairs") as sender:
            sender.send_messages([ServiceBusMessage("x", session_id=sid) for sid in (a, b)])
    sent = time.monotonic()
    for t in threads:
        t.join(30)
    assert set(got) == {"older", "younger"}
    assert max(got.values()) - sent < 5


def test_peeking_page_by_page_goes_through_every_partition(busd, client):
    with client.get_queue_sender("spread") as sender:
        sender.send_messages([ServiceBusMessage(f"p{n}") for n in range(30)])
    with client.get_queue_receiver("spread", max_wait_time=3) as receiver:
        pages = []
        while True:  # the SDK goes on from the last number it saw + 1
            page = receiver.peek_messages(max_message_count=7)
            if not page:
                break
            pages.append([m.sequence_number for m in page])
        numbers = [n for page in pages for n in page]
        assert numbers == sorted(numbers) and len(numbers) == 30
        assert {n >> PARTITION_SHIFT for n in numbers} == set(range(PARTITIONS))
        got = receive(receiver, 30)
        for m in got:
            receiver.complete_message(m)


def test_a_transaction_on_a_partitioned_topic_stays_in_one_partition(busd):
    """A subscription's message completed with a send to its topic, in the partition of its
    session (a topic and its subscriptions are one entity to a transaction)."""
    sids = sessions_in_every_partition(2)
    here, same, elsewhere = sids[0], sids[1], sids[-1]
    with ProtonCbsClient(busd.port) as c:
        c.authorize("events")
        sender = c.sender("events")
        sender.send(Message(body="in", group_id=here))
        receiver = c.receiver("events/subscriptions/by-session", session=here)
        _, delivery = take(receiver)
        txns = Transactions(c)
        txn = txns.declare()
        settle(c, delivery, txn)
        send(c, sender, txn, Message(body="out", group_id=same))
        with pytest.raises(Refused) as err:
            send(c, sender, txn, Message(body="x", group_id=elsewhere))
        assert err.value.condition == "amqp:not-allowed"
        txns.commit(txn)
        receiver.close()
        for sub, bodies in (("by-session", ["out"]), ("all", ["in", "out"])):
            peeked = peek_all(c, f"events/subscriptions/{sub}")
            assert sorted(m.body for m in peeked) == bodies
            assert {m.annotations["x-opt-sequence-number"] >> PARTITION_SHIFT for m in peeked} == {
                partition_of_key(here, PARTITIONS)
            }
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_subscription_receiver(
            "events", "by-session", session_id=same, max_wait_time=5
        ) as r:
            for m in receive(r, 1):
                r.complete_message(m)
        with sb.get_subscription_receiver("events", "all", max_wait_time=3) as r:
            for m in receive(r, 2):
                r.complete_message(m)
