"""A partitioned session queue on a real Valkey Cluster (three primaries, each with a
replica, on loopback), served by two busd processes: its partitions' keys are on every
shard, and under many concurrent receivers each session still has one holder at a time and
its messages in order, with exact counts (docs/design.md §3.18)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest
import redis
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.conftest import start_valkey_shards
from tests.e2e.conftest import launch_busd, queue, write_config

pytestmark = pytest.mark.timeout(240)
PARTITIONS = 16
SESSIONS, PER_SESSION, RECEIVERS = 24, 8, 8


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    servers = start_valkey_shards(tmp_path_factory.mktemp("shards"), primaries=3, replicas=1)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def slot_ranges(url: str) -> list[tuple[int, int, int]]:
    """(first slot, last slot, port of the primary) of each shard."""
    client = redis.Redis.from_url(url)
    try:
        return [
            (int(first), int(last), int(node[1]))
            for first, last, node, *_ in client.execute_command("CLUSTER", "SLOTS")
        ]
    finally:
        client.close()


def test_a_partitioned_session_queue_on_a_three_shard_cluster(shards, tmp_path):
    url = shards[0].connection_url
    ranges = slot_ranges(url)
    assert len(ranges) == 3
    prefix = f"pc-{uuid.uuid4().hex[:8]}"  # any: the even layout puts partitions on every shard
    config = write_config(
        tmp_path / "Config.json",
        [queue("orders", RequiresSession=True, EnablePartitioning=True, LockDuration="PT30S")],
    )
    procs = [launch_busd(url + "?cluster=true", config, tmp_path, prefix=prefix) for _ in range(2)]
    try:
        run_the_load(procs, prefix, ranges)
    finally:
        for p in procs:
            p.stop()


def run_the_load(procs, prefix, ranges) -> None:
    sids = [f"order-{i}" for i in range(SESSIONS)]
    with ServiceBusClient.from_connection_string(procs[0].connection_string) as client:
        with client.get_queue_sender("orders") as sender:
            for n in range(PER_SESSION):  # interleaved: each batch spans partitions
                sender.send_messages(
                    [ServiceBusMessage(f"{sid}:{n}", session_id=sid) for sid in sids]
                )
    with ServiceBusAdministrationClient.from_connection_string(
        procs[1].admin_connection_string, connection_verify=procs[1].cert_path
    ) as admin:
        props = admin.get_queue_runtime_properties("orders")
        assert (props.active_message_count, props.total_message_count) == (
            SESSIONS * PER_SESSION,
            SESSIONS * PER_SESSION,
        )

        # every shard holds keys of the queue's partitions
        for _, _, port in ranges:
            node = redis.Redis(host="127.0.0.1", port=port)
            try:
                keys = list(node.scan_iter(match=f"{{{prefix}:orders:*".encode(), count=1000))
            finally:
                node.close()
            assert keys, f"no partition of the queue on the shard at port {port}"

        holds: list[tuple[str, float, float, list[str], list[int]]] = []
        lock = threading.Lock()
        done = threading.Event()
        errors: list[BaseException] = []

        def receiver(conn: str) -> None:
            try:
                with ServiceBusClient.from_connection_string(conn) as sb:
                    while not done.is_set():
                        try:
                            rx = sb.get_queue_receiver(
                                "orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                            )
                            rx.__enter__()
                        except (OperationTimeoutError, ServiceBusError):
                            continue  # none free right now
                        try:
                            taken = time.monotonic()
                            sid = rx.session.session_id
                            got = rx.receive_messages(max_message_count=3, max_wait_time=1)
                            for m in got:  # a few at a time: sessions change hands
                                rx.complete_message(m)
                            leaving = time.monotonic()
                        finally:
                            rx.__exit__(None, None, None)
                        with lock:
                            holds.append(
                                (
                                    sid,
                                    taken,
                                    leaving,
                                    [str(m) for m in got],
                                    [m.sequence_number for m in got],
                                )
                            )
                            if sum(len(h[3]) for h in holds) >= SESSIONS * PER_SESSION:
                                done.set()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                done.set()

        threads = [
            threading.Thread(target=receiver, args=(procs[i % 2].connection_string,))
            for i in range(RECEIVERS)
        ]
        for t in threads:
            t.start()
        done.wait(150)
        done.set()
        for t in threads:
            t.join(30)
        assert not errors, errors

        by_session: dict[str, list[tuple[float, float, list[str]]]] = defaultdict(list)
        for sid, taken, leaving, bodies, _ in holds:
            by_session[sid].append((taken, leaving, bodies))
        assert sorted(by_session) == sorted(sids)
        for sid, spans in by_session.items():
            spans.sort()
            # one holder at a time: a hold begins after the one before it ended
            for (_, left, _), (taken, _, _) in zip(spans, spans[1:]):
                assert taken >= left, f"{sid} had two holders at once"
            # in order, each message once
            assert [b for _, _, bodies in spans for b in bodies] == [
                f"{sid}:{n}" for n in range(PER_SESSION)
            ]
        numbers = [n for h in holds for n in h[4]]
        assert len(set(numbers)) == SESSIONS * PER_SESSION
        assert len({n >> 48 for n in numbers}) > 3  # from many partitions
        props = admin.get_queue_runtime_properties("orders")
        assert props.total_message_count == 0
