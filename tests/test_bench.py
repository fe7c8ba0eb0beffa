"""scripts/bench's session churn: a tiny real run (its own busd, embedded Valkey, two client
processes) must pass every check and print the cost figures; and the checks themselves must
see each kind of violation in recorded events. Nothing here is about speed."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_churn as churn  # noqa: E402
import bench_peer as peer  # noqa: E402
import bench_steps as steps  # noqa: E402

NUMBER = r"(nan|[\d.]+)"
STEP_ROW = re.compile(r"^  (\S.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+|-)  (.*)$", re.M)


def bench(*args: str, timeout: float = 150) -> str:
    """What `scripts/bench *args` printed; it must have exited 0."""
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run.stdout


def test_small_churn_run_passes_its_checks_and_prints_the_costs() -> None:
    out = bench(
        "--mode",
        "churn",
        "--messages",
        "300",
        "--sessions",
        "30",
        "--per-session",
        "5-15",
        "--receivers",
        "6",
        "--client-procs",
        "2",
        "--senders",
        "2",
        "--timeout",
        "90",
    )
    assert re.search(
        r"^checks \(churn: .*\): 0 violations \(order 0, delivered after complete "
        r"0, lost 0, two holders 0, wrong session 0\)",
        out,
        re.M,
    ), out
    # The store's commandstats were read, and the probe said how to read them.
    assert re.search(r"^store: Valkey .*, pid \d+; its INFO commandstats counts", out, re.M), out
    row = re.search(
        rf"^churn: 6 rx / 2 procs\s+(\d+)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}"
        rf"\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s",
        out,
        re.M,
    )
    assert row, out
    msgs, _secs, _rate, busd, store, total, cmds, calls = row.groups()
    plan = churn.make_plan(30, 300, "5-15", 1)
    assert int(msgs) == sum(plan.values())
    for figure in (busd, store, total, cmds, calls):
        assert figure != "nan", out
    # store calls (script runs) are round trips; commands include those run inside them
    assert 0 < float(calls) < float(cmds)
    assert re.search(r"store commands per message: [\d.]+ script runs \(fcall", out), out
    # where the store's time went: in scripts, of which in the commands they called
    timed = re.search(
        r"store time per message: ([\d.]+) µs in script runs, of which commands "
        r"([\d.]+) µs; \w+ [\d.]+",
        out,
    )
    assert timed is not None, out
    assert 0 < float(timed[2]) < float(timed[1]), out
    assert "sessions accepted" in out
    # Messages sent before the receivers came: sent, taken with each accept and settled; each
    # of the 30 sessions accepted and let go.
    ran = per_step(out, f"churn: 6 rx / 2 procs, {msgs} messages")
    assert ran.keys() >= {"send", "settle", "accept", "release"}, ran
    assert round(ran["accept"][0] * int(msgs)) >= 30, ran  # (printed to 3 places)
    assert round(ran["release"][0] * int(msgs)) >= 30, ran


def test_small_steady_run_reports_latency_and_passes_its_checks() -> None:
    """--scenario steady-32, 2 s of it: sends at the rate, send-to-delivery latency taken."""
    out = bench(
        "--scenario",
        "steady-32",
        "--messages",
        "2000",
        "--client-procs",
        "2",
        "--timeout",
        "90",
    )
    row = re.search(
        rf"^steady: 32 rx / 2 procs\s+2000\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s.*"
        r"sent 2000 at (\d+) msg/s \(--rate 1000\); send-to-delivery p50 ([\d.]+) ms, "
        r"p99 ([\d.]+) ms",
        out,
        re.M,
    )
    assert row, out
    _secs, rate, busd, store, sent_rate, p50, p99 = row.groups()
    assert "nan" not in (busd, store), out
    # paced at the rate at most; how close it comes depends on the machine's load, which a
    # test does not judge (scripts/bench reports it)
    assert 0 < int(sent_rate) <= 1100 and 0 < float(rate) <= 1100, out
    assert 0 < float(p50) <= float(p99), out
    assert re.search(r"^checks \(steady: .*\): 0 violations \(order 0,", out, re.M), out
    # The embedded store keeps an AOF: the bytes it appended per message are counted.
    aof = re.search(r"^steady: .*\s([\d.]+)\s+(\d+)  sent 2000", out, re.M)
    assert aof and 200 < int(aof.group(2)) < 20000, out
    assert "AOF on (appendfsync everysec)" in out, out
    whole = re.search(
        r"^whole load \(2000 messages, every phase above\): store ([\d.]+) µs/msg, "
        r"([\d.]+) cmds/msg, ([\d.]+) scripts/msg, AOF (\d+) B/msg$",
        out,
        re.M,
    )
    assert whole and float(whole.group(1)) > 0 and 0 < float(whole.group(3)), out
    ran = per_step(out, "steady: 32 rx / 2 procs, 2000 messages")
    # Every message was sent (with or without a hand-over), settled; each session accepted
    # and let go at the end.
    assert ran.keys() >= {"settle", "accept", "release"}, ran
    assert ran.keys() & {"send", "hand-over"}, ran
    # The MONITOR run's commands are what the server counted, within the noise of a run
    assert abs(sum(cmds for _, cmds in ran.values()) / float(whole.group(2)) - 1) < 0.35, out


def test_store_rtt_puts_a_delaying_proxy_between_busd_and_its_store() -> None:
    """--store-rtt 5: busd's store calls go through a proxy adding 5 ms to each round trip;
    the churn still passes every check, and the round trip is measured and printed."""
    out = bench(
        "--mode", "churn", "--messages", "60", "--sessions", "6", "--receivers", "3",
        "--client-procs", "1", "--store-rtt", "5", "--no-steps", "--timeout", "90",
    )  # fmt: skip
    rtt = re.search(
        r"store RTT ([\d.]+) ms \(PING p50 through a proxy adding 5 ms; ([\d.]+) ms without\); "
        r"it carried (\d+) connections, ([\d.]+) MB",
        out,
    )
    assert rtt and float(rtt.group(1)) >= 5.0 > float(rtt.group(2)), out
    # busd's own connections (not only the PING's) went through it, with its calls' bytes
    assert int(rtt.group(3)) >= 2 and float(rtt.group(4)) >= 0.1, out
    assert re.search(r"^checks \(churn: .*\): 0 violations \(order 0,", out, re.M), out
    assert re.search(r"^churn: .* accept p50 [\d.]+ ms, p99 [\d.]+ ms", out, re.M), out


@pytest.mark.skipif(
    shutil.which("go") is None and not (SCRIPTS / "loadgen" / "loadgen").exists(),
    reason="Go is not installed, so scripts/loadgen cannot be built for --client go",
)
def test_go_clients_take_the_churn_and_pass_its_checks() -> None:
    """--client go: the receivers are scripts/loadgen's Go processes (built when missing),
    speaking bench_churn.py's worker protocol: the same checks, their own CPU reported."""
    out = bench(
        "--mode", "churn", "--messages", "300", "--sessions", "30", "--per-session", "5-15",
        "--receivers", "6", "--client-procs", "2", "--senders", "2", "--client", "go",
        "--no-steps", "--timeout", "90",
    )  # fmt: skip
    plan = churn.make_plan(30, 300, "5-15", 1)
    row = re.search(
        r"^churn: 6 rx / 2 procs \(go\)\s+(\d+)\s.*accept p50 [\d.]+ ms.*"
        r"Go receivers ([\d.]+) µs/msg \(getrusage\)",
        out,
        re.M,
    )
    assert row and int(row.group(1)) == sum(plan.values()) and float(row.group(2)) > 0, out
    assert re.search(
        r"^checks \(churn: .*\(go\)\): 0 violations \(order 0, delivered after complete "
        rf"0, lost 0, two holders 0, wrong session 0\); {sum(plan.values())} deliveries",
        out,
        re.M,
    ), out


@pytest.mark.skipif(
    shutil.which("go") is None, reason="Go is not installed, so scripts/loadgen cannot be built"
)
def test_loadgen_runs_a_whole_churn_on_its_own(busd_test_broker, busd_queue_factory) -> None:
    """`loadgen run`: its Go senders and session receivers against a busd, its own checks."""
    build = subprocess.run([str(SCRIPTS / "loadgen" / "build")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    queue = busd_queue_factory(requires_session=True)
    run = subprocess.run(
        [str(SCRIPTS / "loadgen" / "loadgen"), "run", "-port", str(busd_test_broker.port),
         "-entity", queue, "-sessions", "12", "-per-session", "1-15", "-receivers", "4",
         "-senders", "2", "-idle-ms", "100", "-timeout", "60s"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    done = re.search(
        r"^churn: 4 rx, (\d+) completed .* client CPU ([\d.]+) µs/msg$", run.stdout, re.M
    )
    assert done and int(done.group(1)) > 0 and float(done.group(2)) > 0, run.stdout
    assert re.search(
        r"^checks: 0 violations \(order 0, delivered after complete 0, lost 0, two holders 0, "
        rf"wrong session 0\); (\d+) deliveries, {done.group(1)} completed, 0 errors$",
        run.stdout,
        re.M,
    ), run.stdout


def test_senders_spread_over_processes_send_every_message_once() -> None:
    """--sender-procs 2: the steady load's 4 sender connections run in 2 child processes; every
    message is sent once, the acks they saw come back (ack-to-delivery is a figure), the checks
    pass and the row says where the sends came from."""
    out = bench(
        *"--scenario steady-32 --messages 2000 --client-procs 2 --sender-procs 2".split(),
        "--no-steps",
        "--timeout",
        "90",
    )
    row = re.search(
        r"^steady: 32 rx / 2 procs\s+2000\s.*sent 2000 at (\d+) msg/s \(--rate 1000\) from 2 "
        r"processes; .*ack-to-delivery p50 (-?[\d.]+) ms, p99 (-?[\d.]+) ms",
        out,
        re.M,
    )
    assert row, out
    assert 0 < int(row.group(1)) <= 1100, out  # the rate is shared out, not doubled
    assert re.search(r"^checks \(steady: .*\): 0 violations \(order 0,", out, re.M), out
    assert re.search(r"2000 deliveries, 2000 completed", out), out


def test_plain_receivers_take_the_steady_load_from_a_queue_without_sessions() -> None:
    """--plain-receivers: busd's receivers are competing consumers of its plain queue; the
    checks that apply (loss, delivery after a complete) pass, and the row says so."""
    out = bench(
        *"--scenario steady-32 --messages 1000 --client-procs 2".split(),
        "--plain-receivers",
        "--no-steps",
        "--timeout",
        "90",
    )
    assert re.search(
        r"^steady: 32 rx / 2 procs \(plain receivers\)\s+1000\s.*sent 1000 at", out, re.M
    ), out
    assert re.search(
        r"^checks \(steady: .*\): 0 violations \(delivered after complete 0, lost 0,", out, re.M
    ), out
    assert "1000 deliveries, 1000 completed" in out, out


def per_step(out: str, title: str) -> dict[str, tuple[float, float]]:
    """The steps that ran in the table titled `title`: calls and commands per message; each
    one plausible (a call runs its script and at least one command inside), adding up."""
    start = out.index(f"store commands per step ({title}): ")
    section = out[start:].split("\n", 2)[2].split("\n  (", 1)[0]
    rows = {m[0]: m for m in STEP_ROW.findall(section)}
    assert set(steps.STEPS) <= rows.keys() and "all" not in rows, section
    total = re.search(r"^  all\s+([\d.]+)\s+([\d.]+)$", section, re.M)
    assert total, section
    ran = {}
    for name, (_, calls, cmds, per_call, text) in rows.items():
        if per_call == "-":
            assert float(calls) == float(cmds) == 0 and text == "did not run", section
            continue
        # a step's script runs at least one command inside (TIME, at the least)
        assert float(per_call) >= (2 if name in steps.STEPS else 1), section
        assert float(cmds) >= float(calls) > 0, section
        ran[name] = (float(calls), float(cmds))
    scripts = [c for name, (c, _) in ran.items() if name != steps.OUTSIDE]
    assert abs(sum(scripts) - float(total[1])) < 0.01 * len(ran), section
    assert abs(sum(c for _, c in ran.values()) - float(total[2])) < 0.01 * len(ran), section
    return ran


def test_small_release_run_lets_sessions_go_and_takes_the_next() -> None:
    """--scenario release-32, 2 s of it: sessions sent in bursts go quiet, their receivers let
    them go and take the next; the latency of each hold's first message is printed apart."""
    out = bench(
        "--scenario",
        "release-32",
        "--messages",
        "2000",
        "--client-procs",
        "2",
        "--no-steps",
        "--timeout",
        "90",
    )
    row = re.search(
        r"^steady: 32 rx / 2 procs\s+2000\s.*send-to-delivery p50 ([\d.]+) ms, p99 ([\d.]+) ms"
        r".*; first of a hold p50 ([\d.]+) ms, p99 ([\d.]+) ms; (\d+) sessions accepted",
        out,
        re.M,
    )
    assert row, out
    p50, p99, first50, first99, accepted = row.groups()
    assert 0 < float(p50) <= float(p99) and 0 < float(first50) <= float(first99), out
    # Each of the 32 sessions had several bursts over the 2 s: held, let go and taken again.
    assert int(accepted) > 32, out
    # from each send's answer to its delivery: negative when the delivery came first
    ack = re.search(r"ack-to-delivery p50 (-?[\d.]+) ms, p99 (-?[\d.]+) ms", out)
    assert ack and float(ack.group(1)) <= float(ack.group(2)), out
    assert re.search(r"^checks \(steady: .*\): 0 violations \(order 0,", out, re.M), out


@pytest.mark.skipif(
    not any(os.access(server, os.X_OK) for server in peer.SERVERS) or not shutil.which("epmd"),
    reason="RabbitMQ is not installed here",
)
@pytest.mark.parametrize(
    "scenario, row_name",
    [("churn-100x16", "consume: 16 rx / 2 procs"), ("steady-32", "steady: 32 rx / 2 procs")],
)
def test_small_peer_run_against_rabbitmq_prints_its_cpu(scenario: str, row_name: str) -> None:
    """--peer rabbitmq: its own node, the same load as plain consumers, its CPU per message."""
    out = bench(
        "--scenario",
        scenario,
        "--peer",
        "rabbitmq",
        "--messages",
        "2000",
        "--client-procs",
        "2",
        "--timeout",
        "60",
        timeout=120,
    )
    assert re.search(r"^rabbitmq bench \(peer\): .*RabbitMQ [\d.]+ .*beam.smp pid \d+", out, re.M)
    assert re.search(r"^phase .* rabbitmq µs/msg ", out, re.M), out
    row = re.search(
        rf"^{re.escape(row_name)} \(rabbitmq\)\s+2000\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s",
        out,
        re.M,
    )
    assert row, out
    assert row.group(3) != "nan" and float(row.group(3)) > 0, out
    assert re.search(
        r"^checks \(.*\(rabbitmq\)\): 0 violations \(delivered after complete 0, lost 0, "
        r"not sent by us 0\); order and two holders not checked",
        out,
        re.M,
    ), out
    if scenario == "steady-32":
        assert re.search(r"send-to-delivery p50 [\d.]+ ms, p99 [\d.]+ ms", out), out


def test_small_fanout_run_compares_a_topic_with_a_queue() -> None:
    out = bench(
        "--mode",
        "fanout",
        "--messages",
        "3000",
        "--timeout",
        "90",
    )
    for phase in (
        "send to a queue",
        r"send to a topic \(3 subs\)",
        "receive from one subscription",
    ):
        assert re.search(rf"^{phase}\s+3000\s", out, re.M), out
    assert re.search(r"busd\+store CPU per message [\d.]+x the queue's", out), out


def test_workers_over_a_cluster_it_started_with_partitioned_queues() -> None:
    """--workers: busd's CPU is the parent's and the workers' together, each printed; a
    Cluster started here: each node's CPU and each primary's share of the calls and keys."""
    out = bench(
        "--messages",
        "300",
        "--workers",
        "2",
        "--senders",
        "2",
        "--start-store",
        "cluster",
        "--partitioned",
        "--timeout",
        "90",
    )
    assert re.search(
        r"\(2 workers, durability local, queues in 16 partitions\).*; \d+ cores", out
    ), out
    assert re.search(r"^store: Valkey .*, 6 nodes \(3 serving\)", out, re.M), out
    row = re.search(rf"^send\s+300\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s", out, re.M)
    assert row, out
    send = out[row.start() :].split("\nreceive", 1)[0]
    processes = re.search(
        r"busd per process: parent \d+ ([\d.]+) µs/msg, worker \d+ ([\d.]+) "
        r"µs/msg, worker \d+ ([\d.]+) µs/msg$",
        send,
        re.M,
    )
    assert processes, send
    assert abs(sum(map(float, processes.groups())) - float(row.group(3))) < 0.2, send
    nodes = re.search(r"store per node: (.*) \(calls, keys: % of an even share\)$", send, re.M)
    assert nodes, send
    shares = re.findall(r"primary :\d+ [\d.]+ µs/msg, calls (\d+)%, keys (\d+)%", nodes[1])
    assert len(shares) == 3 and len(re.findall(r"replica :\d+ [\d.]+ µs/msg", nodes[1])) == 3
    assert sum(int(calls) for calls, _keys in shares) in range(298, 303), shares  # of 300%
    assert_per_shard(send, 3)


# "store per shard: a / b / c µs/msg (:p / :q / :r, INFO CPU), s summed, busiest n% of an
# even share; calls x / y / z % of an even share"
PER_SHARD = re.compile(
    r"^    store per shard: ([\d. /]+) µs/msg \(([:\d /]+), INFO CPU\), ([\d.]+) summed, "
    r"busiest (\d+)% of an even share; calls ([\d /]+) % of an even share$",
    re.M,
)


def assert_per_shard(row: str, shards: int) -> None:
    """A row's per-shard line: each primary's own CPU per message (INFO CPU), adding up to
    the sum, the busiest one's share, and each one's share of the calls."""
    line = PER_SHARD.search(row)
    assert line, row
    cpus = [float(x) for x in line[1].split(" / ")]
    assert len(cpus) == len(line[2].split(" / ")) == shards, row
    assert abs(sum(cpus) - float(line[3])) < 0.2 * shards, row
    assert int(line[4]) >= 100, row  # the busiest has at least an even share
    calls = [int(x) for x in line[5].split(" / ")]
    assert len(calls) == shards and abs(sum(calls) - 100 * shards) <= shards, row


def test_store_shards_run_prints_each_shards_figures() -> None:
    """--store-shards: busd's embedded store as a local Cluster, its queues partitioned over
    the shards by default; each row gives each shard's CPU, calls and keys."""
    out = bench("--messages", "300", "--store-shards", "3", "--timeout", "90")
    assert re.search(
        r"store embedded Cluster of 3 local shards \(--store-shards\).*\(1 process, "
        r"durability local, queues partitioned over the shards \(busd's default\)\)",
        out,
    ), out
    assert re.search(r"^store: Valkey .*, 3 nodes \(3 serving\)", out, re.M), out
    for phase in ("send", "receive peek-lock \\+ complete"):
        row = re.search(rf"^{phase}\s+300\s", out, re.M)
        assert row, out
        _row, *lines = out[row.start() :].splitlines()
        detail = "\n".join(itertools.takewhile(lambda line: line.startswith("    "), lines))
        assert_per_shard(detail, 3)


def test_failover_run_kills_the_primary_and_finds_no_violation() -> None:
    """A Sentinel set started here, --durability replicated, its primary killed mid-run."""
    out = bench(
        "--scenario",
        "failover-sentinel",
        "--messages",
        "240",
        "--kill-after",
        "1",
        "--timeout",
        "90",
    )
    assert "(1 process, durability replicated)" in out, out
    assert re.search(
        r"^failover: primary :\d+ killed\s+2[34]\d\s.*served again [\d.]+ s "
        r"\(send\) / [\d.]+ s \(receive\) after the kill; .*lost 0, stuck 0, "
        r"duplicated after complete 0, completed but back 0, order 0, overlap 0",
        out,
        re.M,
    ), out


# --- the store's commands by step, from MONITOR lines ---------------------------------------------
SHA = b"a" * 40


def monitor_lines(*lines: str) -> list[bytes]:
    return [f"+1795769569.25{i:04d} [0 {line}".encode() for i, line in enumerate(lines)]


LOADED = steps.Scripts(
    names={SHA: "sendMessages", b"b" * 40: "settleMessages"}, offers_argv={"sendMessages": 2}
)


def test_each_script_call_gets_the_commands_monitor_shows_after_it() -> None:
    lines = monitor_lines(
        '127.0.0.1:1] "EVALSHA" "' + "b" * 40 + '" "0"',  # before the start: not counted
        'lua] "zrem" "x"',
        '127.0.0.1:2] "EVAL" "return redis.call(\'ping\')" "0" "START"',
        'lua] "ping"',
        f'127.0.0.1:1] "EVALSHA" "{SHA.decode()}" "1" "k" "ctx" "0" "x\\"y"',  # no offers
        'lua] "zadd" "k" "1" "m"',
        'lua] "hset" "k" "f" "v"',
        f'127.0.0.1:1] "EVALSHA" "{SHA.decode()}" "1" "k" "ctx" "2" "s1"',  # two offers
        'lua] "zadd" "k" "1" "m"',
        '127.0.0.1:1] "EVALSHA" "' + "b" * 40 + '" "0"',
        'lua] "zrem" "x"',
        'lua] "hdel" "x" "f"',
        '127.0.0.1:1] "FCALL" "sweepQueue" "0"',
        'lua] "zrangebyscore" "x" "0" "1"',
        '127.0.0.1:1] "EVALSHA" "' + "c" * 40 + '" "0"',  # a script busd does not load
        '127.0.0.1:1] "PUBLISH" "chan" "1"',
        '127.0.0.1:1] "ECHO" "END"',
        'lua] "zrem" "after the end"',
    )
    result = steps.attribute(lines, LOADED, b"START", b"END")
    assert not result.inner_first and result.orphans == 0
    got = {name: (s.calls, dict(s.commands)) for name, s in result.steps.items()}
    assert got == {
        "send": (1, {"evalsha": 1, "zadd": 1, "hset": 1}),
        "hand-over": (1, {"evalsha": 1, "zadd": 1}),
        "settle": (1, {"evalsha": 1, "zrem": 1, "hdel": 1}),
        "sweep": (1, {"fcall": 1, "zrangebyscore": 1}),
        "other": (1, {"evalsha": 1}),
        "not in a script": (1, {"publish": 1}),
    }
    assert result.steps["other"].scripts == {"sha cccccccc": 1}
    assert result.calls == 5 and result.commands == 12
    table = "\n".join(steps.table(result, 2))
    assert re.search(r"^  settle\s+0\.500\s+1\.50\s+3\.0  settleMessages 1; ", table, re.M)
    assert re.search(r"^  renew\s+0\.000\s+0\.00\s+-  did not run$", table, re.M)
    assert re.search(r"^  all\s+2\.500\s+6\.00$", table, re.M)


def test_a_server_that_shows_inner_commands_first_is_read_the_other_way() -> None:
    lines = monitor_lines(
        'lua] "ping"',
        '127.0.0.1:2] "EVAL" "return redis.call(\'ping\')" "0" "START"',
        'lua] "zrem" "x"',
        'lua] "hdel" "x" "f"',
        '127.0.0.1:1] "EVALSHA" "' + "b" * 40 + '" "0"',
        'lua] "zadd" "k" "1" "m"',
        f'127.0.0.1:1] "EVALSHA" "{SHA.decode()}" "1" "k" "ctx" "0"',
        '127.0.0.1:1] "ECHO" "END"',
    )
    result = steps.attribute(lines, LOADED, b"START", b"END")
    assert result.inner_first and result.orphans == 0
    assert dict(result.steps["settle"].commands) == {"evalsha": 1, "zrem": 1, "hdel": 1}
    assert dict(result.steps["send"].commands) == {"evalsha": 1, "zadd": 1}


def test_busds_scripts_are_named_by_their_hash() -> None:
    from busd.storage.redis.scripts import load_sources

    found = steps.Scripts.of_busd()
    assert set(found.names.values()) == set(load_sources())
    assert "sendMessages" in found.offers_argv  # where its hand-over offers are counted


# --- the checks, on recorded events -------------------------------------------------------------
def events(deliveries, intervals) -> list[dict]:
    return [{"deliveries": deliveries, "intervals": intervals}]


PLAN = {"a": 3, "b": 1}
CLEAN_INTERVALS = [[1, "a", 0.0, 1.0], [2, "b", 0.0, 1.0]]
CLEAN = [(0.1, 1, "a", 0), (0.2, 1, "a", 1), (0.3, 1, "a", 2), (0.1, 2, "b", 0)]


def test_clean_events_have_no_violation() -> None:
    verdict = churn.check(PLAN, events(CLEAN, CLEAN_INTERVALS))
    assert verdict.violations == 0, verdict.examples
    assert verdict.completed == 4 and verdict.sessions_accepted == 2


def test_a_message_first_delivered_before_the_one_ahead_of_it_is_out_of_order() -> None:
    swapped = [(0.1, 1, "a", 1), (0.2, 1, "a", 0), (0.3, 1, "a", 2), (0.1, 2, "b", 0)]
    verdict = churn.check(PLAN, events(swapped, CLEAN_INTERVALS))
    assert verdict.order == 2  # across receivers (a/1 before a/0) and on the link (0 after 1)
    assert verdict.violations == 2


def test_a_delivery_after_the_complete_is_counted() -> None:
    again = CLEAN + [(2.5, 3, "a", 2)]
    intervals = CLEAN_INTERVALS + [[3, "a", 2.0, 3.0]]
    verdict = churn.check(PLAN, events(again, intervals))
    assert verdict.after_complete == 1 and verdict.violations == 1


def test_a_message_never_completed_is_lost() -> None:
    verdict = churn.check(PLAN, events(CLEAN[:-1], CLEAN_INTERVALS))
    assert verdict.lost == 1 and verdict.violations == 1


def test_overlapping_holders_of_a_session_are_counted() -> None:
    intervals = CLEAN_INTERVALS + [[3, "a", 0.5, 2.0]]
    verdict = churn.check(PLAN, events(CLEAN, intervals))
    assert verdict.two_holders == 1 and verdict.violations == 1


def test_a_message_of_another_session_is_counted() -> None:
    wrong = CLEAN[:3] + [(0.4, 1, "b", 0)]  # b/0 on the link holding a
    verdict = churn.check(PLAN, events(wrong, CLEAN_INTERVALS))
    assert verdict.wrong_session == 1 and verdict.violations == 1


def test_plain_consumers_are_checked_for_loss_and_redelivery_only() -> None:
    """--peer: competing consumers of one queue, no sessions: any order on any link is fine."""
    plain = [[1, None, 0.0, 1.0], [2, None, 0.0, 1.0]]
    shuffled = [(0.1, 2, "a", 2), (0.2, 1, "a", 0), (0.3, 2, "b", 0)]
    verdict = churn.check(PLAN, events(shuffled + [(0.4, 1, "a", 1)], plain), sessions=False)
    assert verdict.violations == 0, verdict.examples
    assert "order and two holders not checked" in verdict.summary()
    verdict = churn.check(PLAN, events(shuffled + [(0.5, 1, "a", 0)], plain), sessions=False)
    assert verdict.lost == 1 and verdict.after_complete == 1 and verdict.violations == 2


def test_events_of_several_workers_are_merged() -> None:
    first = {"deliveries": CLEAN[:2], "intervals": [[1, "a", 0.0, 0.25]]}
    second = {
        "deliveries": [(0.5, 7, "a", 2), (0.6, 8, "b", 0)],
        "intervals": [[7, "a", 0.4, 1.0], [8, "b", 0.0, 1.0]],
        "accept_timeouts": 2,
    }
    verdict = churn.check(PLAN, [first, second])
    assert verdict.violations == 0, verdict.examples
    assert verdict.accept_timeouts == 2


def test_bursts_keep_each_session_in_order_on_one_sender() -> None:
    plan = churn.make_plan(4, 20, None, 1)  # 5 messages each
    lists = churn.sender_payloads(plan, 64, 2, burst=2)
    sent = [[churn.parse(p) for p in payloads] for payloads in lists]
    # sender 0 has s0 and s2: two of s0, two of s2, two of s0 ... (the last burst short)
    assert sent[0][:6] == [
        ("s000000", 0),
        ("s000000", 1),
        ("s000002", 0),
        ("s000002", 1),
        ("s000000", 2),
        ("s000000", 3),
    ]
    for sid in plan:
        mine = [i for payloads in sent for s, i in payloads if s == sid]
        assert mine == list(range(plan[sid]))
    assert not {s for s, _ in sent[0]} & {s for s, _ in sent[1]}


def test_messages_carry_their_session_and_index() -> None:
    payload = churn.encode("s000042", 17, 64)
    assert churn.parse(payload) == ("s000042", 17)
    assert churn.sent_at(payload) is None
    stamped = churn.encode("s000042", 17, 64, stamped=True)
    assert churn.sent_at(stamped) is None  # the placeholder, not a time yet
    before = time.monotonic()
    sent = churn.stamp(stamped)
    assert len(sent) == len(stamped) and churn.parse(sent) == ("s000042", 17)
    assert before <= churn.sent_at(sent) <= time.monotonic()
    plan = churn.make_plan(10, 0, "1-5", 3)
    assert len(plan) == 10 and all(1 <= n <= 5 for n in plan.values())
    assert churn.make_plan(10, 0, "1-5", 3) == plan  # seeded
    assert sum(churn.make_plan(7, 100, None, 1).values()) == 100
    lists = churn.sender_payloads({"a": 2, "b": 1}, 16, 2)
    assert [[churn.parse(p) for p in lst] for lst in lists] == [[("a", 0), ("a", 1)], [("b", 0)]]
