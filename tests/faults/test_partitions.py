"""Network partitions under session load: busd and each of the store's nodes on a host of
their own (network namespaces joined by a bridge, tests/faults/netns.py), and nftables rules
that cut a link in both directions or one, or drop a share of its packets.

- busd cut from its store's primary (both directions; the primary's answers only; busd's
  requests only): calls time out and are refused with server-busy, a send whose answer was
  lost may or may not be stored (never acknowledged), and service resumes once the link heals.
- the primary cut from its replicas (and from the Sentinels beside them, or from the rest of
  the Cluster) while busd still reaches it, until a replica is promoted; then the link heals
  and the old primary rejoins as a replica. With `--durability replicated` the old primary
  cannot confirm any write meanwhile (no replica answers its WAIT), so nothing acknowledged
  is lost. With `--durability local` it acknowledges writes that the promotion then discards:
  that loss is measured here, not asserted away (docs/operating.md, "Partitions"), and so is
  how far `min-replicas-to-write` on the nodes narrows it.
- a flapping link between busd and the primary: down, then half its packets dropped at
  random, in turn.

Every scenario is checked with tests/faults/load.py's checker: acknowledged but lost, stuck,
delivered after its complete was confirmed, order per session, two holders at once. Each
prints one row of the partition table. The suite runs a short version (the primary's answers
cut, both failovers with `replicated`, the flapping link); scripts/faults runs every scenario
(BUSD_FAULTS_PARTITIONS=all) with more messages.

Skipped, with the reason, where network namespaces cannot be made (not root, `ip netns add`
refused, nftables missing).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

from busd.storage.keys import key, partition_scope
from busd.storage.partitioned.routing import partition_of_key
from tests.e2e.conftest import launch_busd, queue, write_config
from tests.faults import load, netns
from tests.faults.partitioned import Cluster, ReplicaSet, Stores
from tests.faults.replicas import wait_until

pytestmark = pytest.mark.timeout(240)

SESSIONS = int(os.environ.get("BUSD_FAULTS_SESSIONS", "8"))
PER_SESSION = int(os.environ.get("BUSD_FAULTS_PER_SESSION", "20"))
EVERY = os.environ.get("BUSD_FAULTS_PARTITIONS") == "all"
# The sends span the cut, the failover and the heal (about ten seconds).
RATE_PER_S = max(20, SESSIONS * PER_SESSION // 10)
CUT_AFTER_S = 1.0
CUT_S = 6.0  # longer than a store call may take (5 s), shorter than the session locks
LOCK = "PT10S"
AFTER_FAILOVER_S = 1.0  # the old primary, still reached by busd, goes on alone this long
FLAP_S = 6.0
FLAP_PERIOD_S = 1.0  # a flapping link is down this long, then lossy this long, in turn
LOSS_PERCENT = 50
PARTITIONS = 6
QUIET_S = 12.0  # a run ends once nothing moved this long (more than a lock's duration)
RESUME_WITHIN_S = 15.0


# What narrows local's loss in a failover: a primary that heard from no replica for
# `min-replicas-max-lag` seconds refuses writes.
MIN_REPLICAS = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"]
LEVELS = {  # what a test's level names: busd's --durability, and every node's settings
    "replicated": ("replicated", []),
    "local": ("local", []),
    "local, min-replicas-to-write 1": ("local", MIN_REPLICAS),
}


def long_only(*values):
    return pytest.param(
        *values, marks=pytest.mark.skipif(not EVERY, reason="scripts/faults runs it")
    )


@pytest.fixture
def network(tmp_path):
    """`network(hosts)`: a Network of the test's own, closed (processes ended, namespaces
    deleted) whatever happens."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"partitions cannot be made here: {reason}")
    made: list[netns.Network] = []

    def make(hosts: list[str]) -> netns.Network:
        net = netns.Network(hosts)
        made.append(net)
        return net

    yield make
    for net in made:
        net.close()


def start_busd(net: netns.Network, tmp_path, url: str, durability: str, queues: list[dict]):
    config = write_config(tmp_path / f"config-{uuid.uuid4().hex[:6]}.json", queues)
    busd = launch_busd(
        url,
        config,
        tmp_path,
        extra_env={"BUSD_DURABILITY": durability},
        command_prefix=["ip", "netns", "exec", net.netns("busd")],
    )
    net.processes.append(busd.proc)  # ended with the network, if not before
    return busd


def run_load(net: netns.Network, busd, chaos, deadline_s: float):
    """tests/faults/load.py's session load, its clients on busd's host."""
    return net.inside(
        "busd",
        lambda: asyncio.run(
            load.run(
                load.plan(SESSIONS, PER_SESSION),
                busd.port,
                [busd.port],
                consumers=4,
                deadline_s=deadline_s,
                chaos=chaos,
                rate_per_s=RATE_PER_S,
                quiet_s=QUIET_S,
            )
        ),
    )


def report(
    scenario: str,
    durability: str,
    record: load.Record,
    verdict: load.Verdict,
    cut_off: tuple[float, float] | None = None,
    sessions: set[str] | None = None,
) -> None:
    """One row of the partition table; `cut_off`: while the old primary was cut off from its
    replicas, how many sends (to one of `sessions`, when given) busd acknowledged."""
    if cut_off is not None:
        alone = sum(
            1
            for (sid, _), t in record.acked_at.items()
            if cut_off[0] < t < cut_off[1] and (sessions is None or sid in sessions)
        )
        scenario += f", {alone} sends acknowledged while it was cut off"
    print(
        f"\npartition | {scenario} | {durability} | sent {len(record.sent) + record.send_failures}"
        f" | acknowledged {verdict.sent} | lost {verdict.lost} | stuck {verdict.stuck} | "
        f"duplicated after complete {verdict.duplicated_after_complete} | completed but back "
        f"{verdict.completed_but_back} | order "
        f"{verdict.order} | two holders {verdict.overlap}"
    )


def sessions_queue(**props) -> dict:
    return queue(load.ENTITY, RequiresSession=True, LockDuration=LOCK, **props)


@pytest.mark.parametrize(
    "direction",
    [long_only("both"), "answers", long_only("requests")],
)
def test_busd_cut_from_primary(network, tmp_path, capsys, direction):
    """busd loses its primary (both ways, or one way) for CUT_S under load: nothing
    acknowledged is lost, nothing is delivered after its complete, order and single holders
    hold, and busd serves again by itself once the link heals."""

    def cut(net: netns.Network) -> None:
        if direction == "answers":  # busd's calls run; their answers never come back
            net.cut("n0", "busd", both=False)
        elif direction == "requests":
            net.cut("busd", "n0", both=False)
        else:
            net.cut("busd", "n0")

    async def chaos(net: netns.Network) -> None:
        await asyncio.to_thread(cut, net)
        await asyncio.sleep(CUT_S)

    record, verdict, since, seconds = lone_primary(network, tmp_path, chaos)
    with capsys.disabled():
        report(f"busd cut from the primary ({direction})", "local", record, verdict)
        sent_again, received_again = load.recovered(
            f"cut ({direction})", record, verdict, since, seconds
        )
    assert sent_again is not None and sent_again < RESUME_WITHIN_S
    assert received_again is not None and received_again < RESUME_WITHIN_S
    assert verdict.violations == 0, verdict.summary()


def lone_primary(network, tmp_path, chaos):
    """busd and a lone primary, each on its host, and the session load, with `chaos(net)`
    done CUT_AFTER_S into it and the network healed after it. Returns what the load saw,
    its verdict, when the network healed and how long the load ran."""
    net = network(["busd", "n0"])
    store = Stores(net, tmp_path)
    store.node("n0")
    busd = start_busd(net, tmp_path, store.url("n0"), "local", [sessions_queue()])
    healed: list[float] = []

    async def then_heal() -> None:
        await asyncio.sleep(CUT_AFTER_S)
        await chaos(net)
        await asyncio.to_thread(net.heal)
        healed.append(time.monotonic())

    record, seconds = run_load(net, busd, then_heal, deadline_s=60)
    left = net.inside("busd", lambda: load.stored(store.url("n0"), busd.prefix))
    assert busd.proc.poll() is None  # the same busd process throughout
    return record, load.check(record, left), healed[0], seconds


@pytest.mark.parametrize(
    "level", ["replicated", long_only("local"), long_only("local, min-replicas-to-write 1")]
)
def test_primary_cut_from_replicas_sentinel(network, tmp_path, capsys, level):
    """The primary is cut from its replicas and their Sentinels, busd still reaching it, until
    the Sentinels promote a replica; then the link heals and the old primary becomes a
    replica of the new one, dropping what it took alone. `replicated`: nothing acknowledged
    is lost. `local`: what the old primary acknowledged alone is lost (measured)."""
    net = network(["busd", "n0", "n1", "n2"])
    durability, config = LEVELS[level]
    nodes = ReplicaSet(net, tmp_path, ["n0", "n1", "n2"], config)
    busd = start_busd(net, tmp_path, nodes.url, durability, [sessions_queue()])
    cut: list[float] = []
    chaos = cut_until_promoted(
        net, "n0", ["n1", "n2"], lambda: nodes.primary_named_by("n1") in ("n1", "n2"), cut
    )
    record, seconds = run_load(net, busd, chaos, deadline_s=90)
    primary = nodes.primary_named_by("n1")
    assert primary in ("n1", "n2") and len(cut) == 3
    wait_until(  # the old primary rejoined as a replica (what it took alone is gone)
        lambda: nodes.ask("n0", lambda c: c.info("replication")["role"]) == "slave",
        "the old primary did not become a replica",
    )
    left = nodes.ask(primary, lambda c: load.stored("redis://127.0.0.1:6379", busd.prefix))
    verdict = load.check(record, left)
    with capsys.disabled():
        report(
            f"primary cut from replicas, Sentinel failover ({cut[1] - cut[0]:.1f} s)",
            level,
            record,
            verdict,
            (cut[0], cut[2]),
        )
        sent_again, _ = load.recovered("sentinel partition", record, verdict, cut[2], seconds)
    assert busd.proc.poll() is None
    assert sent_again is not None and sent_again < RESUME_WITHIN_S
    if durability == "replicated":
        assert verdict.violations == 0, verdict.summary()


@pytest.mark.parametrize(
    "level", ["replicated", long_only("local"), long_only("local, min-replicas-to-write 1")]
)
def test_shard_primary_cut_from_cluster(network, tmp_path, capsys, level):
    """A Cluster shard's primary is cut from its replicas and the other primaries, busd still
    reaching it, until a replica takes its slots over; then the link heals and it rejoins as
    a replica. `replicated`: nothing acknowledged is lost. `local`: the old primary takes
    writes alone until it sees it lost the majority (node time-out), and those are lost."""
    primaries, replicas = 3, 2
    hosts = [f"c{i}" for i in range(primaries * (1 + replicas))]
    net = network(["busd", *hosts])
    durability, config = LEVELS[level]
    cluster = Cluster(net, tmp_path, hosts, primaries, config)
    sessions = sessions_queue(EnablePartitioning=True, PartitionCount=PARTITIONS)
    busd = start_busd(net, tmp_path, cluster.url, durability, [sessions])
    owners = [
        cluster.first_owner(key(busd.prefix, partition_scope(load.ENTITY, p, PARTITIONS), "q.body"))
        for p in range(PARTITIONS)
    ]
    old = owners[0]
    others = [h for h in hosts if h != old]
    watcher = next(h for h in cluster.primaries if h != old)
    cut: list[float] = []

    def taken_over() -> bool:
        serving = cluster.serving_primaries(watcher)
        return old not in serving and len(serving) == primaries

    chaos = cut_until_promoted(net, old, others, taken_over, cut)
    record, seconds = run_load(net, busd, chaos, deadline_s=90)
    assert len(cut) == 3
    wait_until(
        lambda: nodes_role(cluster, old) == "slave", "the old primary did not become a replica"
    )
    address = net.address(watcher)
    left = net.inside(
        "busd",
        lambda: load.stored(f"redis+cluster://{address}:6379", busd.prefix, PARTITIONS),
    )
    verdict = load.check(record, left)
    on_shard = {
        sid
        for sid in load.plan(SESSIONS, PER_SESSION)
        if owners[partition_of_key(sid, PARTITIONS)] == old
    }
    with capsys.disabled():
        report(
            f"shard primary cut from the Cluster ({cut[1] - cut[0]:.1f} s to take over)",
            level,
            record,
            verdict,
            (cut[0], cut[2]),
            on_shard,
        )
        sent_again, _ = load.recovered(
            "cluster partition", record, verdict, cut[2], seconds, on_shard
        )
    assert busd.proc.poll() is None
    assert sent_again is not None and sent_again < RESUME_WITHIN_S
    if durability == "replicated":
        assert verdict.violations == 0, verdict.summary()


def cut_until_promoted(net: netns.Network, old: str, others: list[str], promoted, cut: list):
    """The chaos of a failover: CUT_AFTER_S into the load `old` is cut from `others` (busd
    still reaches it) until `promoted()`, and AFTER_FAILOVER_S longer; then the network heals.
    `cut` gets the times of the cut, of the promotion and of the heal."""

    async def chaos() -> None:
        await asyncio.sleep(CUT_AFTER_S)
        await asyncio.to_thread(net.isolate, old, others)
        cut.append(time.monotonic())
        await asyncio.to_thread(wait_until, promoted, f"no replica of {old} was promoted")
        cut.append(time.monotonic())
        await asyncio.sleep(AFTER_FAILOVER_S)
        await asyncio.to_thread(net.heal)
        cut.append(time.monotonic())

    return chaos


def nodes_role(cluster: Cluster, host: str) -> str | None:
    return cluster.ask(host, lambda c: c.info("replication")["role"])


def test_flapping_link(network, tmp_path, capsys):
    """The link between busd and its primary flaps for FLAP_S: down for FLAP_PERIOD_S (every
    packet dropped, both ways), then LOSS_PERCENT of the packets dropped at random, in turn.
    Calls are slow or refused, none acknowledged is lost, and no invariant of the sessions
    breaks."""

    async def flap(net: netns.Network) -> None:
        for turn in range(int(FLAP_S / FLAP_PERIOD_S)):
            await asyncio.to_thread(net.heal)
            loss = 100 if turn % 2 == 0 else LOSS_PERCENT
            await asyncio.to_thread(net.cut, "busd", "n0", loss_percent=loss)
            await asyncio.sleep(FLAP_PERIOD_S)

    record, verdict, since, seconds = lone_primary(network, tmp_path, flap)
    with capsys.disabled():
        report(
            f"flapping link busd-primary (down, then {LOSS_PERCENT} % loss, each "
            f"{FLAP_PERIOD_S:.0f} s, for {FLAP_S:.0f} s)",
            "local",
            record,
            verdict,
        )
        sent_again, _ = load.recovered("flapping", record, verdict, since, seconds)
    assert sent_again is not None and sent_again < RESUME_WITHIN_S
    assert verdict.violations == 0, verdict.summary()
