"""`busd serve --store-shards 3`: one command starts three valkey-servers as a local Cluster
under --data-dir, partitions the entities over them evenly, serves the SDK on a session
queue, keeps its data across a restart and stops its servers with it (docs/design.md §3.9)."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from click.testing import CliRunner

from busd.cli.main import cli
from tests.e2e.conftest import launch_busd, queue, receive, write_config

pytestmark = pytest.mark.timeout(180)
SHARDS, SESSIONS, PER_SESSION = 3, 12, 4


def shard_servers(data_dir: Path) -> list[tuple[int, int]]:
    """(pid, port) of each shard's valkey-server, from its data directory."""
    out = []
    for i in range(SHARDS):
        directory = data_dir / f"shard-{i}"
        pid = int((directory / "valkey.pid").read_text().strip())
        conf = (directory / "valkey.conf").read_text()
        port = next(int(line.split()[1]) for line in conf.splitlines() if line.startswith("port "))
        out.append((pid, port))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and b"zombie" not in Path(f"/proc/{pid}/status").read_bytes().lower()
    )


def start(tmp_path: Path, data_dir: Path):
    config = write_config(
        tmp_path / "Config.json", [queue("orders", RequiresSession=True, LockDuration="PT30S")]
    )
    return launch_busd(
        None,
        config,
        tmp_path,
        data_dir=data_dir,
        prefix="shards",
        # fsync: each shard waits for its own append-only file (docs/design.md §3.9)
        extra_env={"BUSD_STORE_SHARDS": str(SHARDS), "BUSD_DURABILITY": "fsync"},
    )


def take_sessions(busd, count: int) -> dict[str, list[str]]:
    """Accept `count` next-available sessions at once, each on a connection of its own, and
    complete all of each one's messages (concurrently: with --durability fsync each
    settlement waits for its shard's append-only file, and the waits overlap)."""

    def take_one(_: int) -> tuple[str, list[str]]:
        with ServiceBusClient.from_connection_string(busd.connection_string) as client:
            with client.get_queue_receiver(
                "orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
            ) as receiver:
                got = receive(receiver, PER_SESSION)
                for m in got:
                    receiver.complete_message(m)
                return receiver.session.session_id, [str(m) for m in got]

    with ThreadPoolExecutor(max_workers=count) as pool:
        pairs = list(pool.map(take_one, range(count)))
    taken = dict(pairs)
    assert len(taken) == count, f"a session was given to two receivers: {pairs}"
    return taken


def test_three_local_shards_from_one_command(tmp_path):
    data_dir = tmp_path / "data"
    busd = start(tmp_path, data_dir)
    try:
        assert "embedded Valkey Cluster of 3 shards" in busd.log_text()
        servers = shard_servers(data_dir)
        assert len({port for _, port in servers}) == SHARDS and all(alive(p) for p, _ in servers)

        sids = [f"s-{i}" for i in range(SESSIONS)]
        with ServiceBusClient.from_connection_string(busd.connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                for n in range(PER_SESSION):
                    sender.send_messages(
                        [ServiceBusMessage(f"{sid}:{n}", session_id=sid) for sid in sids]
                    )
        with ServiceBusAdministrationClient.from_connection_string(
            busd.admin_connection_string, connection_verify=busd.cert_path
        ) as admin:
            # the file did not ask for partitions: over local shards it gets them by default
            props = admin.get_queue("orders")
            assert props.enable_partitioning is True
            # the SDK knows no PartitionCount: an update that leaves it out keeps it
            props.max_delivery_count = 7
            admin.update_queue(props)
            assert admin.get_queue("orders").max_delivery_count == 7
        # 3 partitions (one per shard), one on each shard
        per_shard = Counter()
        waited = {}
        for _, port in servers:
            node = redis.Redis(host="127.0.0.1", port=port)
            try:
                tags = {k.split(b"}")[0] for k in node.scan_iter(match=b"{shards:orders:*")}
                waited[port] = node.info("commandstats").get("cmdstat_waitaof", {}).get("calls")
            finally:
                node.close()
            per_shard[port] = len(tags)
        # every shard took sends, and each waited for its own append-only file
        assert all(waited.values()), waited
        assert sorted(per_shard.values()) == [1, 1, 1], per_shard

        # busd shows the spread: `busd shards` and /metrics
        shown = CliRunner().invoke(cli, ["shards", "orders", "--json", "--url", busd.http_url])
        assert shown.exit_code == 0, shown.output
        (entity,) = json.loads(shown.output)
        rows = {r["shard"]: r for r in entity["shards"]}
        assert {int(a.rsplit(":", 1)[1]) for a in rows} == {port for _, port in servers}
        assert [r["partitions"] for r in rows.values()] == [1, 1, 1]
        assert sum(r["sessions"] for r in rows.values()) == SESSIONS
        assert sum(r["sent"] for r in rows.values()) == SESSIONS * PER_SESSION
        table = CliRunner().invoke(cli, ["shards", "--url", busd.http_url])
        assert table.exit_code == 0 and "SENT/EVEN" in table.output, table.output
        with urllib.request.urlopen(busd.http_url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        placed = re.findall(
            r'busd_entity_partitions\{entity="orders",shard="([^"]+)"\} (\S+)', metrics
        )
        assert sorted(float(n) for _, n in placed) == [1.0, 1.0, 1.0]
        assert {a for a, _ in placed} == set(rows)

        first = take_sessions(busd, SESSIONS // 2)
        for sid, bodies in first.items():
            assert bodies == [f"{sid}:{n}" for n in range(PER_SESSION)]
    finally:
        busd.stop(signal.SIGTERM)
    assert busd.proc.returncode == 0, busd.log_text()
    # its servers stopped with it
    assert not any(alive(pid) for pid, _ in servers)

    again = start(tmp_path, data_dir)
    try:
        rest = take_sessions(again, SESSIONS - len(first))
        assert not set(first) & set(rest)
        assert sorted([*first, *rest]) == sorted(sids)
        for sid, bodies in rest.items():
            assert bodies == [f"{sid}:{n}" for n in range(PER_SESSION)]
        with ServiceBusAdministrationClient.from_connection_string(
            again.admin_connection_string, connection_verify=again.cert_path
        ) as admin:
            assert admin.get_queue_runtime_properties("orders").total_message_count == 0
        servers = shard_servers(data_dir)
    finally:
        again.stop(signal.SIGTERM)
    assert again.proc.returncode == 0, again.log_text()
    assert not any(alive(pid) for pid, _ in servers)
