"""Redelivery backoff (busd's own entity properties, docs/design.md §2.17) through the unchanged
official SDK: an abandoned or lock-expired message comes back only after a delay that grows
with its delivery count up to a maximum; a session waits for its first message's delay, in
order, whoever receives it; the properties are set in Config.json or over the management API,
kept through the SDK's get/update, and refused out of bounds."""

from __future__ import annotations

import datetime as dt
import http.client
import ssl
import threading
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from click.testing import CliRunner

from busd.auth.sas import generate_sas_token
from busd.cli.main import cli
from tests.e2e.conftest import queue, subscription, topic

pytestmark = pytest.mark.timeout(120)

# the sweep (BUSD_SWEEP_INTERVAL 0.2 s in these tests) or the next receive makes a message due
LATE_S = 1.0
SESSION_DELAY_S = 4  # bo-sessions' first delay: long enough to open SDK links within it


def backoff(minimum: str, maximum: str, factor: float = 2) -> dict:
    return {
        "RedeliveryBackoffMinimum": minimum,
        "RedeliveryBackoffMaximum": maximum,
        "RedeliveryBackoffFactor": factor,
    }


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("bo-plain", **backoff("PT1S", "PT2S")),
            queue("bo-lock", LockDuration="PT1S", **backoff("PT1S", "PT4S")),
            queue("bo-sessions", RequiresSession=True, **backoff("PT4S", "PT8S")),
            queue("bo-off"),
        ],
        topics=[topic("bo-topic", [subscription("bo-sub", **backoff("PT1S", "PT1S"))])],
    )


@pytest.fixture(scope="module")
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as c:
        yield c


@pytest.fixture(scope="module")
def admin(busd):
    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as a:
        yield a


def next_one(receiver, limit_s: float = 15):
    """The next message the receiver gets, and the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        got = receiver.receive_messages(max_message_count=1, max_wait_time=0.2)
        if got:
            return got[0], time.monotonic() - started
    raise AssertionError(f"nothing within {limit_s} s")


def test_abandoned_message_comes_back_after_a_growing_delay(client, admin):
    with client.get_queue_sender("bo-plain") as sender:
        sender.send_messages(ServiceBusMessage("retry me"))
    with client.get_queue_receiver("bo-plain") as receiver:
        message, _ = next_one(receiver)
        assert message.delivery_count == 0  # failed deliveries so far, as Service Bus counts
        for delivery, delay_s in ((1, 1), (2, 2), (3, 2)):  # capped at PT2S, not 4 s
            receiver.abandon_message(message)
            runtime = admin.get_queue_runtime_properties("bo-plain")
            assert (runtime.active_message_count, runtime.scheduled_message_count) == (1, 0)
            message, took = next_one(receiver)
            assert str(message) == "retry me" and message.delivery_count == delivery
            assert delay_s - 0.1 <= took <= delay_s + LATE_S, (delivery, took)
        receiver.complete_message(message)


def test_without_backoff_an_abandoned_message_is_back_at_once(client):
    with client.get_queue_sender("bo-off") as sender:
        sender.send_messages(ServiceBusMessage("now"))
    with client.get_queue_receiver("bo-off") as receiver:
        message, _ = next_one(receiver)
        receiver.abandon_message(message)
        message, took = next_one(receiver)
        assert message.delivery_count == 1 and took < 0.5
        receiver.complete_message(message)


def test_waiting_message_is_peeked_as_active(client):
    with client.get_queue_sender("bo-plain") as sender:
        sender.send_messages(ServiceBusMessage("peek me"))
    with client.get_queue_receiver("bo-plain") as receiver:
        message, _ = next_one(receiver)
        receiver.abandon_message(message)
        (peeked,) = receiver.peek_messages(1, sequence_number=message.sequence_number)
        assert peeked.sequence_number == message.sequence_number
        assert peeked.state.name == "ACTIVE" and peeked.delivery_count == 1
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        again, _ = next_one(receiver)
        receiver.complete_message(again)


def test_lock_expiry_waits_the_delay_too(client):
    with client.get_queue_sender("bo-lock") as sender:
        sender.send_messages(ServiceBusMessage("slow"))
    with client.get_queue_receiver("bo-lock") as receiver:
        message, _ = next_one(receiver)
        # the lock (1 s) runs out, then the backoff of the 1st and 2nd failure (1 s, 2 s)
        for delivery, wait_s in ((1, 1 + 1), (2, 1 + 2)):
            message, took = next_one(receiver)
            assert message.delivery_count == delivery
            assert wait_s - 0.1 <= took <= wait_s + LATE_S, (delivery, took)
        receiver.complete_message(message)


def test_subscription_backoff(client):
    with client.get_topic_sender("bo-topic") as sender:
        sender.send_messages(ServiceBusMessage("sub"))
    with client.get_subscription_receiver("bo-topic", "bo-sub") as receiver:
        message, _ = next_one(receiver)
        receiver.abandon_message(message)
        message, took = next_one(receiver)
        assert message.delivery_count == 1 and 0.9 <= took <= 1 + LATE_S
        receiver.complete_message(message)


def test_sessions_wait_for_their_first_message_in_order(client):
    """Each of three concurrent next-available receivers abandons its session's first message
    once: the next thing it gets from its session is that message again, after the delay,
    never the second before it; every session is received in order."""
    sessions = ["sa", "sb", "sc"]
    with client.get_queue_sender("bo-sessions") as sender:
        sender.send_messages(
            [ServiceBusMessage(f"{s}-{i}", session_id=s) for i in (1, 2, 3) for s in sessions]
        )
    seen: dict[str, list[tuple[str, int]]] = {}
    waited: dict[str, float] = {}
    failures: list[BaseException] = []

    def run() -> None:
        try:
            with client.get_queue_receiver(
                "bo-sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
            ) as receiver:
                sid = receiver.session.session_id
                got = seen.setdefault(sid, [])
                first, _ = next_one(receiver)
                got.append((str(first), first.delivery_count))
                receiver.abandon_message(first)
                while len(got) < 4:
                    message, took = next_one(receiver)
                    if len(got) == 1:
                        waited[sid] = took
                    got.append((str(message), message.delivery_count))
                    receiver.complete_message(message)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    assert sorted(seen) == sessions
    for sid, got in seen.items():
        assert got == [(f"{sid}-1", 0), (f"{sid}-1", 1), (f"{sid}-2", 0), (f"{sid}-3", 0)]
        assert SESSION_DELAY_S - 0.1 <= waited[sid] <= SESSION_DELAY_S + LATE_S, (sid, waited)


def test_next_available_does_not_pick_a_waiting_session(client):
    """A session left with its first message waiting is not accepted by next-available
    receivers until the message is due, though its messages are older than another session's;
    a message sent to it meanwhile does not overtake the waiting one."""
    with client.get_queue_sender("bo-sessions") as sender:
        sender.send_messages([ServiceBusMessage(f"w-{i}", session_id="w") for i in (1, 2)])
    with client.get_queue_receiver("bo-sessions", session_id="w", max_wait_time=5) as receiver:
        first, _ = next_one(receiver)
        receiver.abandon_message(first)
        abandoned = time.monotonic()
    with client.get_queue_sender("bo-sessions") as sender:
        sender.send_messages(ServiceBusMessage("w-3", session_id="w"))
        sender.send_messages(ServiceBusMessage("o-1", session_id="o"))
    with client.get_queue_receiver(
        "bo-sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == "o"
        assert time.monotonic() - abandoned < SESSION_DELAY_S, "too slow to tell"
        receiver.complete_message(next_one(receiver)[0])
    with client.get_queue_receiver(
        "bo-sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == "w"
        assert time.monotonic() - abandoned >= SESSION_DELAY_S - 0.1
        got = [next_one(receiver)[0] for _ in range(3)]
        assert [(str(m), m.delivery_count) for m in got] == [("w-1", 1), ("w-2", 0), ("w-3", 0)]
        for m in got:
            receiver.complete_message(m)


# --- the properties over the management API ---------------------------------------------------

NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"


def call(busd, method: str, name: str, body: bytes | None = None, change: bool = False):
    """(status, text) of a management request for queue `name`, with a root token."""
    token = generate_sas_token(
        f"https://localhost:{busd.http_port}",
        "RootManageSharedAccessKey",
        "SAS_KEY_VALUE",
        int(time.time()) + 600,
    )
    headers = {"Authorization": token, "Content-Type": "application/atom+xml"}
    if change:
        headers["If-Match"] = "*"
    context = ssl.create_default_context(cafile=busd.cert_path)
    conn = http.client.HTTPSConnection("localhost", busd.http_port, context=context, timeout=10)
    try:
        conn.request(method, f"/{name}?api-version=2021-05", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def put_queue(busd, name: str, elements: str, *, change: bool = False) -> tuple[int, str]:
    body = (
        '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        f'<QueueDescription xmlns="{NS}">{elements}</QueueDescription></content></entry>'
    ).encode()
    return call(busd, "PUT", name, body, change)


def get_queue(busd, name: str) -> str:
    status, text = call(busd, "GET", name)
    assert status == 200, text
    return text


def test_set_over_the_api_and_kept_through_the_sdks_update(busd, admin):
    status, text = put_queue(
        busd,
        "bo-api",
        "<LockDuration>PT30S</LockDuration>"
        "<RedeliveryBackoffMinimum>PT0.5S</RedeliveryBackoffMinimum>"
        "<RedeliveryBackoffMaximum>PT1M</RedeliveryBackoffMaximum>"
        "<RedeliveryBackoffFactor>1.5</RedeliveryBackoffFactor>",
    )
    assert status == 201, text
    kept = (
        "<RedeliveryBackoffMinimum>PT0.5S</RedeliveryBackoffMinimum>"
        "<RedeliveryBackoffMaximum>PT1M</RedeliveryBackoffMaximum>"
        "<RedeliveryBackoffFactor>1.5</RedeliveryBackoffFactor>"
    )
    assert kept in text
    # the SDK's model knows nothing of them: its update leaves them out, and they stay
    props = admin.get_queue("bo-api")
    props.max_delivery_count = 7
    admin.update_queue(props)
    assert admin.get_queue("bo-api").max_delivery_count == 7
    assert kept in get_queue(busd, "bo-api")
    # a queue that does not set them answers none of them (the service's description)
    assert "RedeliveryBackoff" not in get_queue(busd, "bo-off")
    # and turned off by the management API
    status, text = put_queue(
        busd,
        "bo-api",
        "<RedeliveryBackoffMinimum>P10675199DT2H48M5.4775807S</RedeliveryBackoffMinimum>",
        change=True,
    )
    assert status == 200 and "RedeliveryBackoffMinimum" not in text, text
    assert admin.get_queue("bo-api").lock_duration == dt.timedelta(minutes=1)


def test_file_values_are_answered(busd):
    text = get_queue(busd, "bo-sessions")
    assert "<RedeliveryBackoffMinimum>PT4S</RedeliveryBackoffMinimum>" in text
    assert "<RedeliveryBackoffMaximum>PT8S</RedeliveryBackoffMaximum>" in text
    # the default factor (2) is not written
    assert "RedeliveryBackoffFactor" not in text


@pytest.mark.parametrize(
    "elements, why",
    [
        ("<RedeliveryBackoffMinimum>-PT1S</RedeliveryBackoffMinimum>", "ISO 8601 duration"),
        ("<RedeliveryBackoffMinimum>PT0S</RedeliveryBackoffMinimum>", "longer than zero"),
        ("<RedeliveryBackoffMaximum>P8D</RedeliveryBackoffMaximum>", "at most 7 days"),
        ("<RedeliveryBackoffFactor>0.5</RedeliveryBackoffFactor>", "1 to 1000"),
        ("<RedeliveryBackoffFactor>-2</RedeliveryBackoffFactor>", "1 to 1000"),
        ("<RedeliveryBackoffFactor>fast</RedeliveryBackoffFactor>", "must be a number"),
        (
            "<RedeliveryBackoffMinimum>PT10S</RedeliveryBackoffMinimum>"
            "<RedeliveryBackoffMaximum>PT5S</RedeliveryBackoffMaximum>",
            "must not be longer than RedeliveryBackoffMaximum",
        ),
    ],
)
def test_bad_values_are_refused(busd, elements, why):
    status, text = put_queue(busd, "bo-bad", elements)
    assert status == 400 and why in text, (status, text)
    status, _ = put_queue(busd, "bo-api-bad", "", change=False)
    assert status == 201
    status, text = put_queue(busd, "bo-api-bad", elements, change=True)
    assert status == 400 and why in text, (status, text)
    assert "RedeliveryBackoff" not in get_queue(busd, "bo-api-bad")
    assert call(busd, "DELETE", "bo-api-bad")[0] == 200


def test_a_change_keeping_the_maximum_is_checked_against_it(busd):
    assert (
        put_queue(busd, "bo-pair", "<RedeliveryBackoffMaximum>PT5S</RedeliveryBackoffMaximum>")[0]
        == 201
    )
    status, text = put_queue(
        busd, "bo-pair", "<RedeliveryBackoffMinimum>PT6S</RedeliveryBackoffMinimum>", change=True
    )
    assert status == 400 and "RedeliveryBackoffMaximum (PT5S)" in text, text


def test_set_with_the_command_line(busd, admin):
    def tool(*args: str):
        result = CliRunner().invoke(cli, [*args, "--url", busd.http_url], prog_name="busd")
        assert "Traceback" not in result.output, result.output
        return result

    made = tool(
        "queue", "create", "bo-cli", "--backoff-min", "PT1S", "--backoff-factor", "1.5", "--json"
    )
    assert made.exit_code == 0, made.output
    assert "<RedeliveryBackoffFactor>1.5</RedeliveryBackoffFactor>" in get_queue(busd, "bo-cli")
    refused = tool("queue", "update", "bo-cli", "--backoff-factor", "0.5")
    assert refused.exit_code != 0 and "1 to 1000" in refused.output
    props = admin.get_queue("bo-cli")
    admin.update_queue(props, lock_duration=dt.timedelta(seconds=20))
    text = get_queue(busd, "bo-cli")
    assert "<RedeliveryBackoffMinimum>PT1S</RedeliveryBackoffMinimum>" in text
    assert "<LockDuration>PT20S</LockDuration>" in text
