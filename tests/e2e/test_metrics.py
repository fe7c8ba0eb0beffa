"""GET /metrics after a scripted workload with the official SDK shows exactly what happened."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusError
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("work"),
            queue("short-lock", LockDuration="PT1S"),
            queue("sessions", RequiresSession=True),
        ]
    )


def scrape(busd) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(busd.http_url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def receive(receiver, n: int):
    got = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=n - len(got), max_wait_time=3)
    assert len(got) == n
    return got


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_message_counters_equal_the_workload(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
            sender.send_messages(ServiceBusMessage("short", time_to_live=timedelta(seconds=1)))
        time.sleep(1.3)  # the short one expires: found by the sweep or by the next receive
        with sb.get_queue_receiver("work", max_wait_time=3) as receiver:
            got = receive(receiver, 6)
            for m in got[:3]:
                receiver.complete_message(m)
            receiver.abandon_message(got[3])
            for m in got[4:]:
                receiver.dead_letter_message(m, reason="test")

    m = scrape(busd)
    work = {"entity": "work"}
    assert value(m, "busd_messages_sent_total", **work) == 7
    assert value(m, "busd_messages_received_total", **work) == 6
    assert value(m, "busd_messages_completed_total", **work) == 3
    assert value(m, "busd_messages_abandoned_total", **work) == 1
    assert value(m, "busd_messages_dead_lettered_total", **work) == 2
    assert value(m, "busd_messages_expired_total", **work) == 1
    assert value(m, "busd_lock_expiries_total", **work) == 0
    assert value(m, "busd_entity_messages", entity="work", state="active") == 1
    assert value(m, "busd_entity_messages", entity="work", state="dead_letter") == 2
    assert value(m, "busd_entity_messages", entity="work", state="locked") == 0
    # this process's own share, from the links
    assert value(m, "busd_process_messages_sent_total", **work) == 7
    assert value(m, "busd_process_messages_received_total", **work) == 6

    # the dead-letter sub-queue has figures of its own
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("work", sub_queue="deadletter", max_wait_time=3) as receiver:
            for dead in receive(receiver, 2):
                receiver.complete_message(dead)
    m = scrape(busd)
    dlq = {"entity": "work/$deadletterqueue"}
    assert value(m, "busd_messages_received_total", **dlq) == 2
    assert value(m, "busd_messages_completed_total", **dlq) == 2
    assert value(m, "busd_messages_completed_total", **work) == 3
    assert value(m, "busd_entity_messages", entity="work", state="dead_letter") == 0


def test_connections_links_and_refused_authentication(busd):
    wait_for(lambda: value(scrape(busd), "busd_connections") == 0)  # earlier tests' are gone
    before = scrape(busd)
    bad = busd.connection_string.replace("SAS_KEY_VALUE", "wrong")
    with ServiceBusClient.from_connection_string(bad, retry_total=0) as sb:
        with pytest.raises((ServiceBusAuthenticationError, ServiceBusError)):
            with sb.get_queue_sender("work") as sender:
                sender.send_messages(ServiceBusMessage("x"))
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_sender("work") as sender:
            sender.send_messages(ServiceBusMessage("y"))
            during = scrape(busd)
            assert value(during, "busd_connections") == 1
            assert value(during, "busd_links") >= 1
    wait_for(lambda: value(scrape(busd), "busd_connections") == 0)
    after = scrape(busd)
    assert value(after, "busd_auth_refused_total") - value(before, "busd_auth_refused_total") == 1
    assert (
        value(after, "busd_connections_opened_total")
        - value(before, "busd_connections_opened_total")
    ) == 2
    assert value(after, "busd_links") == 0


def test_lock_expiry_is_counted_once(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_sender("short-lock") as sender:
            sender.send_messages(ServiceBusMessage("slow"))
        with sb.get_queue_receiver("short-lock", max_wait_time=3) as receiver:
            receive(receiver, 1)  # and never settled: the 1 s lock runs out
            wait_for(
                lambda: value(scrape(busd), "busd_lock_expiries_total", entity="short-lock") == 1
            )
            time.sleep(0.5)  # more sweeps pass
            m = scrape(busd)
    assert value(m, "busd_lock_expiries_total", entity="short-lock") == 1
    assert value(m, "busd_entity_messages", entity="short-lock", state="active") == 1
    assert value(m, "busd_sweep_seconds_count") > 0


def test_sessions_with_messages_and_locked_sessions(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_sender("sessions") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("a", session_id="a"),
                    ServiceBusMessage("a", session_id="a"),
                    ServiceBusMessage("b", session_id="b"),
                ]
            )
        with sb.get_queue_receiver("sessions", session_id="a", max_wait_time=3):
            m = scrape(busd)
            assert value(m, "busd_entity_sessions", entity="sessions", kind="with_messages") == 2
            assert value(m, "busd_entity_sessions", entity="sessions", kind="locked") == 1
            assert value(m, "busd_entity_sessions", entity="sessions", kind="free") == 1  # b
            time.sleep(1.1)
            age = value(scrape(busd), "busd_entity_oldest_message_age_seconds", entity="sessions")
            assert 1 <= age < 60
    assert (
        value(
            scrape(busd),
            "busd_entity_oldest_message_age_seconds",
            entity="sessions/$deadletterqueue",
        )
        == 0
    )
    wait_for(
        lambda: value(scrape(busd), "busd_entity_sessions", entity="sessions", kind="locked") == 0
    )
    assert value(scrape(busd), "busd_messages_sent_total", entity="sessions") == 3


OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def alert_selections() -> list[tuple[str, dict[str, str], set[str]]]:
    """Each busd metric an alert rule of docs/operating.md reads: its name, the label values
    it selects (`{state="dead_letter"}`) and the labels it groups by."""
    text = OPERATING.read_text()
    rules = text[text.index("Alert rules to start from") :]
    rules = rules[: rules.index("```", rules.index("```yaml") + 7)]
    found = []
    for expr in re.findall(r"expr: (.*)", rules):
        grouped = {
            label.strip()
            for labels in re.findall(r"by \(([^)]*)\)", expr)
            for label in labels.split(",")
        } - {"instance", "le"}  # Prometheus's own, and a histogram bucket's
        for name, selector in re.findall(r"(busd_\w+)(\{[^}]*\})?", expr):
            selected = dict(re.findall(r'(\w+)="([^"]*)"', selector or ""))
            found.append((name, selected, grouped))
    return found


def test_every_alert_rule_s_metric_is_there_at_zero_on_a_fresh_busd(busd_factory):
    fresh = busd_factory([queue("fresh"), queue("fresh-sessions", RequiresSession=True)])
    selections = alert_selections()
    assert {name for name, _, _ in selections} >= {
        "busd_entity_messages",
        "busd_settlements_refused_total",
        "busd_handshake_timeouts_total",
        "busd_sweep_seconds_bucket",
    }  # the rules are read
    samples = scrape(fresh)
    for name, selected, grouped in selections:
        matching = [
            dict(labels)
            for (sample, labels), _ in samples.items()
            if sample == name and selected.items() <= dict(labels).items()
        ]
        assert matching, f"no sample of {name}{selected or ''} on a fresh busd"
        assert all(grouped <= labels.keys() for labels in matching), (name, grouped)
    # what an alert counts has not happened yet: 0, not "no data"
    for name, labels in (
        ("busd_settlements_refused_total", {"entity": "fresh", "reason": "message_lock_lost"}),
        ("busd_handshake_timeouts_total", {"stage": "token"}),
        ("busd_unauthenticated_evicted_total", {"limit": "address"}),
        ("busd_entity_messages", {"entity": "fresh-sessions", "state": "dead_letter"}),
    ):
        assert samples[(name, frozenset(labels.items()))] == 0


def test_build_info_names_the_running_version(busd):
    m = scrape(busd)
    assert value(m, "busd_build_info", version=version("busd")) == 1
    assert [k for k in m if k[0] == "busd_build_info"] == [
        ("busd_build_info", frozenset({("version", version("busd"))}))
    ]
    with urllib.request.urlopen(busd.http_url + "/health/detail", timeout=10) as response:
        assert json.loads(response.read())["version"] == version("busd")
