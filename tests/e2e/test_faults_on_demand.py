"""Faults on demand (docs/faults.md) against the official SDK over real TCP: each fault makes the
SDK raise or retry as it does against Service Bus, and busd serves normally once the fault is
over, every message received exactly once in the end."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    MessageLockLostError,
    ServiceBusServerBusyError,
    SessionLockLostError,
)
from click.testing import CliRunner

from busd.cli.main import cli
from tests.e2e.conftest import queue, receive, subscription, topic
from tests.e2e.test_admin_cli import admin_token, http

pytestmark = pytest.mark.timeout(180)

FAULTS_ON = {"BUSD_FAULTS": "1"}  # off unless asked for (docs/faults.md)
FAST_RETRIES = {"retry_backoff_factor": 0.05, "retry_backoff_max": 0.2}


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("busy"),
            queue("busy-sessions", RequiresSession=True),
            queue("locks", LockDuration="PT30S"),
            queue("session-locks", RequiresSession=True, LockDuration="PT30S"),
            queue("detached"),
            queue("slow", RequiresSession=True),
            queue("untouched"),
            queue("capped"),
        ],
        topics=[topic("events", [subscription("audit")])],
        extra_env=FAULTS_ON,
    )


def fault(busd, **document) -> dict:
    status, answer = http(busd, "POST", "/admin/faults", json.dumps(document).encode())
    assert status == 201, answer
    return answer  # type: ignore[return-value]


def faults(busd) -> list[dict]:
    status, answer = http(busd, "GET", "/admin/faults")
    assert status == 200, answer
    return answer  # type: ignore[return-value]


def drain(client, name: str, count: int, patience: float = 15, **receiver) -> list[str]:
    with client.get_queue_receiver(name, **receiver) as r:
        got = receive(r, count, wait=1, patience=patience)
        for m in got:
            r.complete_message(m)
    return sorted(str(m) for m in got)


def metric(busd, kind: str, operation: str, entity: str) -> float:
    with urllib.request.urlopen(busd.http_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("busd_faults_injected_total{")
            and f'kind="{kind}"' in line
            and f'operation="{operation}"' in line
            and f'entity="{entity}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_server_busy_fewer_than_the_retries_is_retried_away(busd):
    fault(busd, kind="server-busy", entity="busy", operations=["send"], count=2)
    started = time.monotonic()
    with ServiceBusClient.from_connection_string(
        busd.connection_string, retry_total=3, **FAST_RETRIES
    ) as client:
        with client.get_queue_sender("busy") as sender:
            sender.send_messages(ServiceBusMessage("after-two-refusals"))
        assert drain(client, "busy", 1) == ["after-two-refusals"]
    assert time.monotonic() - started < 30
    assert metric(busd, "server-busy", "send", "busy") == 2
    assert not [f for f in faults(busd) if f["entity"] == "busy"]  # its count is spent
    assert "fault on demand" in busd.log_text()


def test_server_busy_more_than_the_retries_raises_then_serves(busd):
    fault(busd, kind="server-busy", entity="busy", operations=["send"], count=3)
    with ServiceBusClient.from_connection_string(
        busd.connection_string, retry_total=1, **FAST_RETRIES
    ) as client:
        with client.get_queue_sender("busy") as sender:
            with pytest.raises(ServiceBusServerBusyError):
                sender.send_messages(ServiceBusMessage("refused"))  # 2 tries, both refused
            sender.send_messages(ServiceBusMessage("third-refused-then-stored"))  # 1 + 1 retry
            sender.send_messages(ServiceBusMessage("served"))
        assert drain(client, "busy", 2) == ["served", "third-refused-then-stored"]


def test_server_busy_on_receive_is_retried(busd):
    with ServiceBusClient.from_connection_string(
        busd.connection_string, retry_total=3, **FAST_RETRIES
    ) as client:
        with client.get_queue_sender("busy") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
        fault(busd, kind="server-busy", entity="busy", operations=["receive"], count=2)
        assert drain(client, "busy", 5) == [f"m{i}" for i in range(5)]
        assert drain(client, "busy", 1, patience=1) == []  # exactly once
    assert metric(busd, "server-busy", "receive", "busy") == 2


def test_server_busy_on_settle(busd):
    with (
        ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client,
        ServiceBusClient.from_connection_string(
            busd.connection_string, retry_total=3, **FAST_RETRIES
        ) as patient,
    ):
        with client.get_queue_sender("busy") as sender:
            sender.send_messages(ServiceBusMessage("settled-late"))
        with client.get_queue_receiver("busy") as receiver:
            (message,) = receive(receiver, 1)
            fault(busd, kind="server-busy", entity="busy", operations=["settle"], count=1)
            with pytest.raises(ServiceBusServerBusyError):
                receiver.complete_message(message)
            # refused, nothing changed: the message is still locked by this receiver
            receiver.renew_message_lock(message)
            receiver.complete_message(message)
        # with retries, the SDK settles it again and succeeds
        with patient.get_queue_sender("busy") as sender:
            sender.send_messages(ServiceBusMessage("settled-on-retry"))
        with patient.get_queue_receiver("busy") as receiver:
            (message,) = receive(receiver, 1)
            fault(busd, kind="server-busy", entity="busy", operations=["settle"], count=1)
            receiver.complete_message(message)
        assert drain(client, "busy", 1, patience=1) == []
    assert metric(busd, "server-busy", "settle", "busy") == 2
    status, info = http(busd, "GET", "/admin/queues/busy")
    assert info["counts"]["active"] + info["counts"]["locked"] == 0, info


def test_timeout_for_a_time_window(busd):
    fault(busd, kind="timeout", entity="busy", operations=["send"], duration_ms=1500)
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with client.get_queue_sender("busy") as sender:
            with pytest.raises(Exception) as raised:
                sender.send_messages(ServiceBusMessage("in-the-window"))
            assert "timeout" in str(raised.value).lower()
            time.sleep(1.6)
            sender.send_messages(ServiceBusMessage("after-the-window"))
        assert drain(client, "busy", 1) == ["after-the-window"]


def test_message_lock_lost(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("locks") as sender:
            sender.send_messages(ServiceBusMessage("held"))
        with client.get_queue_receiver("locks") as receiver:
            (message,) = receive(receiver, 1)
            assert message.delivery_count == 0
            fault(busd, kind="message-lock-lost", entity="locks")
            time.sleep(0.5)
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(message)
            # it comes back at once, its attempt counted (as after its lock expired)
            (again,) = receive(receiver, 1)
            assert str(again) == "held" and again.delivery_count == 1
            receiver.complete_message(again)
        assert drain(client, "locks", 1, patience=1) == []
    assert metric(busd, "message-lock-lost", "lock", "locks") == 1


def test_session_lock_lost(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("session-locks") as sender:
            sender.send_messages([ServiceBusMessage(f"s{i}", session_id="a") for i in range(2)])
        with client.get_queue_receiver("session-locks", session_id="a") as receiver:
            first = receive(receiver, 2)
            assert len(first) == 2
            answer = fault(busd, kind="session-lock-lost", entity="session-locks", session="a")
            assert answer["released"] is True
            with pytest.raises(SessionLockLostError):
                receiver.complete_message(first[0])
        # the next holder takes the session at once; the messages come back counted, in order
        with client.get_queue_receiver("session-locks", session_id="a") as receiver:
            again = receive(receiver, 2)
            assert [str(m) for m in again] == ["s0", "s1"]
            assert [m.delivery_count for m in again] == [1, 1]
            for m in again:
                receiver.complete_message(m)
        assert drain(client, "session-locks", 1, patience=1, session_id="a") == []


def test_detached_link_is_recreated(busd):
    with ServiceBusClient.from_connection_string(
        busd.connection_string, retry_total=3, **FAST_RETRIES
    ) as client:
        with client.get_queue_sender("detached") as sender:
            sender.send_messages(ServiceBusMessage("before"))
            fault(busd, kind="detach", entity="detached")
            time.sleep(0.5)
            sender.send_messages(ServiceBusMessage("after-detach"))
            fault(busd, kind="close-connection", entity="detached")
            time.sleep(0.5)
            sender.send_messages(ServiceBusMessage("after-close"))
        assert drain(client, "detached", 3) == ["after-close", "after-detach", "before"]
        # a receiver detached while it waits attaches again and receives what comes next
        with client.get_queue_receiver("detached") as receiver:
            assert receiver.receive_messages(max_wait_time=0.5) == []
            fault(busd, kind="detach", entity="detached", condition="amqp:link:detach-forced")
            time.sleep(0.5)
            with client.get_queue_sender("detached") as sender:
                sender.send_messages(ServiceBusMessage("to-the-new-link"))
            (message,) = receive(receiver, 1)
            receiver.complete_message(message)
            assert str(message) == "to-the-new-link"
    assert metric(busd, "detach", "detach", "detached") >= 2  # the sender, the receiver
    assert metric(busd, "close-connection", "close-connection", "detached") >= 1


def test_delays_accept_session_and_deliveries(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("slow") as sender:
            sender.send_messages(ServiceBusMessage("late", session_id="s"))
        fault(busd, kind="delay", entity="slow", operations=["accept"], delay_ms=1500, count=1)
        started = time.monotonic()
        with client.get_queue_receiver("slow", session_id="s") as receiver:
            accepted = time.monotonic() - started
            fault(busd, kind="delay", entity="slow", operations=["deliver"], delay_ms=1200)
            fetch = time.monotonic()
            (message,) = receive(receiver, 1, wait=5)
            delivered = time.monotonic() - fetch
            receiver.complete_message(message)
        assert accepted >= 1.4, accepted
        assert delivered >= 1.1, delivered
        # both spent: the session is accepted at once again, and it is empty (exactly once)
        started = time.monotonic()
        with client.get_queue_receiver("slow", session_id="s") as receiver:
            accepted = time.monotonic() - started
            assert receiver.receive_messages(max_wait_time=0.5) == []
        assert accepted < 1.0, accepted


def test_faults_are_listed_and_deleted(busd):
    made = fault(busd, kind="server-busy", entity="untouched", duration_ms=60_000, fraction=0.5)
    assert made["entity"] == "untouched" and made["fraction"] == 0.5
    assert made["id"] in [f["id"] for f in faults(busd)]
    status, answer = http(busd, "DELETE", f"/admin/faults/{made['id']}")
    assert status == 200, answer
    assert made["id"] not in [f["id"] for f in faults(busd)]
    assert http(busd, "DELETE", f"/admin/faults/{made['id']}")[0] == 404
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with client.get_queue_sender("untouched") as sender:
            for i in range(10):
                sender.send_messages(ServiceBusMessage(f"u{i}"))
        assert len(drain(client, "untouched", 10)) == 10


def test_a_topic_and_a_subscription_are_scoped_by_their_names(busd):
    # a send to the topic, a settlement on one of its subscriptions (named as the SDK does)
    fault(busd, kind="server-busy", entity="events", operations=["send"], count=1)
    fault(busd, kind="server-busy", entity="Events/Subscriptions/Audit", operations=["settle"])
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with client.get_topic_sender("events") as sender:
            with pytest.raises(ServiceBusServerBusyError):
                sender.send_messages(ServiceBusMessage("refused"))
            sender.send_messages(ServiceBusMessage("published"))
        with client.get_subscription_receiver("events", "audit") as receiver:
            (message,) = receive(receiver, 1)
            with pytest.raises(ServiceBusServerBusyError):
                receiver.complete_message(message)
            receiver.complete_message(message)
            assert str(message) == "published"
            assert receiver.receive_messages(max_wait_time=0.5) == []
    assert metric(busd, "server-busy", "settle", "events/subscriptions/audit") == 1


@pytest.mark.parametrize(
    "document, status",
    [
        ({"kind": "server-busy", "entity": "nowhere"}, 404),
        ({"kind": "explode", "entity": "busy"}, 400),
        ({"kind": "server-busy", "entity": "busy", "count": 0}, 400),
        ({"kind": "server-busy", "entity": "busy", "fraction": 0.5}, 400),
        ({"kind": "server-busy", "entity": "busy", "operations": ["accept"]}, 400),
        ({"kind": "session-lock-lost", "entity": "busy-sessions"}, 400),
        ({"kind": "session-lock-lost", "entity": "busy", "session": "a"}, 400),
        ({"kind": "detach", "entity": "busy", "condition": "no:such"}, 400),
        ({"kind": "delay", "entity": "busy"}, 400),
        ({"kind": "server-busy", "entity": "busy", "colour": "red"}, 400),
        # a dead-letter queue's address names its parent's sub-queue: refused, not set there
        ({"kind": "server-busy", "entity": "busy/$DeadLetterQueue"}, 400),
        ({"kind": "detach", "entity": "events/Subscriptions/audit/$deadletterqueue"}, 400),
    ],
)
def test_bad_faults_are_refused_and_nothing_is_set(busd, document, status):
    before = faults(busd)
    got, answer = http(busd, "POST", "/admin/faults", json.dumps(document).encode())
    assert got == status and "error" in answer, answer
    # nothing was added (a fault of an earlier test may have run out meanwhile)
    assert all(f in before for f in faults(busd))


def test_a_dead_letter_queue_is_refused_with_a_clear_error(busd):
    got, answer = http(
        busd,
        "POST",
        "/admin/faults",
        json.dumps({"kind": "server-busy", "entity": "busy/$DeadLetterQueue"}).encode(),
    )
    assert got == 400 and "dead-letter queue" in answer["error"], answer
    assert not [f for f in faults(busd) if f["entity"] == "busy"]


def test_every_fault_ends_a_count_alone_within_an_hour(busd):
    made = fault(busd, kind="server-busy", entity="untouched", operations=["send"], count=5)
    try:
        assert made["until_ms"] - made["created_ms"] == 3600 * 1000
        (listed,) = [f for f in faults(busd) if f["id"] == made["id"]]
        assert listed["until_ms"] == made["until_ms"]
    finally:
        http(busd, "DELETE", f"/admin/faults/{made['id']}")


def test_one_entity_takes_at_most_a_hundred_faults(busd):
    made = [
        fault(busd, kind="delay", entity="capped", operations=["accept"], delay_ms=1, count=1)
        for _ in range(100)
    ]
    try:
        document = {"kind": "server-busy", "entity": "capped", "duration_ms": 60_000}
        got, answer = http(busd, "POST", "/admin/faults", json.dumps(document).encode())
        assert got == 403 and "100" in answer["error"] and "capped" in answer["error"], answer
        assert len([f for f in faults(busd) if f["entity"] == "capped"]) == 100
        # another entity is not held back; one removed makes room
        other = fault(busd, kind="server-busy", entity="untouched", operations=["send"], count=1)
        http(busd, "DELETE", f"/admin/faults/{other['id']}")
        http(busd, "DELETE", f"/admin/faults/{made.pop()['id']}")
        made.append(fault(busd, **document))
    finally:
        for f in made:
            http(busd, "DELETE", f"/admin/faults/{f['id']}")
    assert not [f for f in faults(busd) if f["entity"] == "capped"]


def test_faults_are_off_unless_busd_was_started_with_them(busd_factory, monkeypatch):
    plain = busd_factory([queue("busy")])
    document = {"kind": "server-busy", "entity": "busy", "operations": ["send"], "count": 1}
    got, answer = http(plain, "POST", "/admin/faults", json.dumps(document).encode())
    assert got == 403 and "--faults" in answer["error"], answer
    assert faults(plain) == []
    with ServiceBusClient.from_connection_string(plain.connection_string, retry_total=0) as client:
        with client.get_queue_sender("busy") as sender:
            sender.send_messages(ServiceBusMessage("served"))
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey=SAS_KEY_VALUE")
    refused = CliRunner().invoke(
        cli, ["faults", "add", "server-busy", "busy", "--url", plain.http_url], prog_name="busd"
    )
    assert refused.exit_code != 0 and "--faults" in refused.output, refused.output


def test_faults_need_the_manage_right(busd):
    got, _ = http(
        busd,
        "POST",
        "/admin/faults",
        json.dumps({"kind": "server-busy", "entity": "busy"}).encode(),
        token=admin_token("wrong-key"),
    )
    assert got == 401


def test_the_command_line_sets_lists_and_removes_faults(busd, monkeypatch):
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey=SAS_KEY_VALUE")

    def run(*args: str):
        result = CliRunner().invoke(cli, [*args, "--url", busd.http_url], prog_name="busd")
        assert result.exit_code == 0, result.output
        return result.output

    made = json.loads(
        run(
            "faults",
            "add",
            "server-busy",
            "untouched",
            "--operation",
            "send",
            "--count",
            "3",
            "--json",
        )
    )
    assert made["operations"] == ["send"] and made["count"] == 3
    assert made["id"] in run("faults", "list")
    assert "removed" in run("faults", "remove", made["id"])
    assert made["id"] not in run("faults", "list")
    refused = CliRunner().invoke(
        cli, ["faults", "add", "delay", "untouched", "--url", busd.http_url], prog_name="busd"
    )
    assert refused.exit_code != 0 and "delay_ms" in refused.output


@pytest.fixture(scope="module")
def busd_workers(busd_factory):
    return busd_factory([queue("busy")], extra_env={"BUSD_WORKERS": "2", **FAULTS_ON})


def _send_on_new_connections(busd, bodies: list[str], *, at_once: bool = False) -> int:
    """Send each body on a connection of its own (landing on either worker, SO_REUSEPORT),
    one after another or all at once; how many were refused with server-busy."""

    def refused(body: str) -> bool:
        with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as c:
            with c.get_queue_sender("busy") as sender:
                try:
                    sender.send_messages(ServiceBusMessage(body))
                except ServiceBusServerBusyError:
                    return True
        return False

    if not at_once:
        return sum(refused(body) for body in bodies)
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return sum(pool.map(refused, bodies))


def test_faults_hold_for_every_worker(busd_workers):
    # a count is shared by the workers: 12 connections (on both workers but with a chance of
    # 2**-11) meet exactly 4 refusals, one after another and all at once (the worker that
    # spends the count must not restart the other's)
    fault(busd_workers, kind="server-busy", entity="busy", operations=["send"], count=4)
    assert _send_on_new_connections(busd_workers, [f"c{i}" for i in range(12)]) == 4
    fault(busd_workers, kind="server-busy", entity="busy", operations=["send"], count=4)
    time.sleep(0.3)  # the other worker hears of it over the catalog's channel
    assert _send_on_new_connections(busd_workers, [f"d{i}" for i in range(12)], at_once=True) == 4
    # a window holds in every worker, and ends for every worker when removed
    made = fault(busd_workers, kind="server-busy", entity="busy", duration_ms=60_000)
    time.sleep(0.3)  # the other worker hears of it over the catalog's channel
    assert _send_on_new_connections(busd_workers, [f"w{i}" for i in range(6)], at_once=True) == 6
    assert http(busd_workers, "DELETE", f"/admin/faults/{made['id']}")[0] == 200
    time.sleep(0.3)
    assert _send_on_new_connections(busd_workers, [f"a{i}" for i in range(6)], at_once=True) == 0
    with ServiceBusClient.from_connection_string(busd_workers.connection_string) as client:
        got = drain(client, "busy", 22)
    # exactly once: the 16 the counts let through and the 6 after the window, nothing refused
    assert len(got) == len(set(got)) == 22
    assert {b for b in got if b.startswith("a")} == {f"a{i}" for i in range(6)}
