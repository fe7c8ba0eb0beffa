"""Transactions when things fail: the timeout, a busd process killed with SIGKILL between
declare and discharge or in the middle of many commits (sends to a queue and to a topic's
subscriptions), and transactions used from another process. Every transaction is applied whole
or not at all (docs/design.md §3.15)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis
from proton import Message

from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import launch_busd, queue, subscription, topic, write_config
from tests.e2e.txn_client import (
    Refused,
    Transactions,
    drain,
    peek_all,
    send,
    settle,
    take,
)

pytestmark = pytest.mark.timeout(180)

# "work" has a long lock: the crash test's check must not depend on how fast a loaded machine
# runs its clients.
QUEUES = [queue("input", LockDuration="PT2S"), queue("output"), queue("work")]
# The crash test's results also fan out: to every subscription, one of them through a rule.
PARTS = {
    "Name": "parts",
    "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "part = 'b'"}},
}
TOPICS = [topic("results", [subscription("x"), subscription("y", rules=[PARTS])])]


@pytest.fixture
def pair(redis_url, tmp_path):
    """Start busd processes over one store (same key prefix); all stopped at the end."""
    config = write_config(tmp_path / "config.json", QUEUES, TOPICS)
    prefix = f"txn-{uuid.uuid4().hex[:8]}"
    started = []

    def start(timeout_s: float = 60):
        proc = launch_busd(
            redis_url,
            config,
            tmp_path,
            prefix=prefix,
            extra_env={"BUSD_TRANSACTION_TIMEOUT": str(timeout_s)},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def client_of(proc) -> ProtonCbsClient:
    client = ProtonCbsClient(proc.port)
    client.authorize("input")
    client.authorize("output")
    client.authorize("work")
    client.authorize("results")
    return client


def staged_keys(redis_url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [k for k in client.scan_iter(match=f"{{{prefix}:*}}:tx*")]
    finally:
        client.close()


def test_a_transaction_times_out_after_its_first_operation(pair):
    busd = pair(timeout_s=2)
    with client_of(busd) as client:
        txns = Transactions(client)
        txn = txns.declare()
        time.sleep(2.5)  # the clock starts with the first operation, not the declare
        sender = client.sender("output")
        send(client, sender, txn, Message(body="first"))
        time.sleep(2.5)
        with pytest.raises(Refused) as err:
            send(client, sender, txn, Message(body="too late"))
        assert err.value.condition == "amqp:transaction:timeout"
        with pytest.raises(Refused) as err:
            txns.commit(txn)
        assert err.value.condition == "amqp:transaction:timeout"
        assert drain(client, "output") == []


def test_sigkill_between_declare_and_discharge_applies_nothing(pair, redis_url):
    a, b = pair(timeout_s=3), pair()
    with client_of(a) as client:
        client.sender("input").send(Message(body="input"))
        receiver = client.receiver("input", credit=1)
        _, delivery = take(receiver)
        txns = Transactions(client)
        txn = txns.declare()
        send(client, client.sender("output"), txn, Message(body="output"))
        settle(client, delivery, txn)
        # another one staged under a topic (its first entity)
        send(client, client.sender("results"), txns.declare(), Message(body="fanned"))
        keys = staged_keys(redis_url, a.prefix)
        assert {k.split(b"}")[0] for k in keys} == {
            f"{{{a.prefix}:{e}".encode() for e in ("output", "results")
        }
        # staged in the store, not only in memory
        a.proc.kill()  # SIGKILL: no rollback, no goodbye
        a.proc.wait()
        try:
            client.close()
        except Exception:
            pass
    with client_of(b) as other:
        assert drain(other, "output") == []
        assert peek_all(other, "results/subscriptions/x") == []
        # the input was never completed: it comes back when its lock (2 s) expires
        receiver = other.receiver("input", credit=1)
        message = receiver.receive(timeout=10)
        assert (message.body, message.delivery_count) == ("input", 1)
        receiver.accept()
        receiver.close()
    # what the dead process staged is dropped by the sweep once the transaction's time is up
    deadline = time.monotonic() + 15
    while staged_keys(redis_url, a.prefix) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert staged_keys(redis_url, a.prefix) == []


def test_a_transaction_of_one_process_is_unknown_on_another(pair):
    a, b = pair(), pair()
    with client_of(a) as first, client_of(b) as second:
        txn = Transactions(first).declare()
        with pytest.raises(Refused) as err:
            send(second, second.sender("output"), txn, Message(body="elsewhere"))
        assert err.value.condition == "amqp:transaction:unknown-id"
        with pytest.raises(Refused) as err:
            Transactions(second).commit(txn)
        assert err.value.condition == "amqp:transaction:unknown-id"


INPUTS = 150
WORKERS = 6


def _worker(port: int, stop: threading.Event, taken: list, done: list, errors: list) -> None:
    """Take an input, send two results to a queue and one to a topic (a copy in each of its
    subscriptions), complete the input, commit; until the process dies. Every refusal or
    failure is kept in `errors`."""
    try:
        client = client_of(type("P", (), {"port": port})())
        receiver = client.receiver("work", credit=1)
        sender = client.sender("output")
        fan_out = client.sender("results")
        txns = Transactions(client)
        while not stop.is_set():
            message, delivery = take(receiver, timeout=5)
            taken.append(message.body)
            txn = txns.declare()
            answers = [
                send(client, sender, txn, Message(body=f"{message.body}/{part}"), wait=False)
                for part in ("a", "b")
            ]
            answers.append(
                send(
                    client,
                    fan_out,
                    txn,
                    Message(body=f"{message.body}/t", properties={"part": "b"}),
                    wait=False,
                )
            )
            answers.append(settle(client, delivery, txn, wait=False))
            # the discharge goes once every operation is answered, as the .NET SDK awaits
            # each operation of a transaction scope before completing it
            client.conn.wait(lambda answers=answers: all(a.settled for a in answers), timeout=10)
            txns.commit(txn)
            done.append(message.body)
    except Exception as exc:  # the process was killed: stop
        errors.append(repr(exc))


def test_commits_under_a_sigkill_are_whole_or_absent(pair):
    """Many transactions commit concurrently while their busd process is killed; then every
    input is either gone with each of its outputs present once, in the queue and in both of
    the topic's subscriptions (committed), or back with no output anywhere (rolled back):
    half-applied must be 0."""
    a, b = pair(), pair()
    with client_of(a) as feeder:
        sender = feeder.sender("work")
        for i in range(INPUTS):
            sender.send(Message(body=f"in-{i}"))
    stop = threading.Event()
    taken: list[str] = []
    done: list[str] = []
    errors: list[str] = []
    workers = [
        threading.Thread(target=_worker, args=(a.port, stop, taken, done, errors), daemon=True)
        for _ in range(WORKERS)
    ]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 30
    while len(done) < INPUTS // 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    a.proc.kill()  # mid-stream: commits are in flight
    a.proc.wait()
    stop.set()
    for w in workers:
        w.join(timeout=20)
    with client_of(b) as checker:  # in any state: locked by the dead process's receivers too
        inputs = [m.body for m in peek_all(checker, "work")]
        outputs = [m.body for m in peek_all(checker, "output")]
        fanned = {
            s: [m.body for m in peek_all(checker, f"results/subscriptions/{s}")] for s in ("x", "y")
        }
    left = set(inputs)
    committed = rolled_back = untouched = half = 0
    for i in range(INPUTS):
        body = f"in-{i}"
        parts = sorted(o for o in outputs if o.rsplit("/", 1)[0] == body)
        copies = [[o for o in fanned[s] if o == f"{body}/t"] for s in ("x", "y")]
        if (
            body not in left
            and parts == [f"{body}/a", f"{body}/b"]
            and copies == [[f"{body}/t"]] * 2
        ):
            committed += 1
        elif body in left and not parts and copies == [[], []]:
            if body in taken:
                rolled_back += 1  # taken into a transaction the kill cut short
            else:
                untouched += 1
        else:
            half += 1
    print(
        f"\ncrash test: {committed} committed, {rolled_back} rolled back, "
        f"{half} half-applied ({untouched} inputs never taken; clients heard of "
        f"{len(done)} commits before the kill)"
    )
    assert half == 0
    # before the kill nothing was refused: the workers stopped on the lost connection only
    assert not [e for e in errors if "Refused" in e], errors
    assert committed >= len(done)  # every commit a client heard of is there
    assert len(outputs) == 2 * committed  # no output twice
    assert len(fanned["x"]) == len(fanned["y"]) == committed
    assert committed > 0 and rolled_back + untouched > 0
