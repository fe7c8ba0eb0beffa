"""A session dead-lettered whole and resubmitted in order, and its state's etag
(docs/design.md §2.6, §2.7, §2.9): the official SDK for what it can do, the admin HTTP API and
`busd sessions dead-letter|resubmit`, and a proton client for the `$management` extensions
(docs/wire.md §8.4.3, §8.4.4, §8.4.12)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from click.testing import CliRunner

from busd.cli.main import cli
from tests.e2e.amqp_client import Management, ProtonCbsClient
from tests.e2e.conftest import queue, receive
from tests.e2e.test_admin_cli import admin_token

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue(
                "poison",
                RequiresSession=True,
                MaxDeliveryCount=2,
                DeadLetterSessionOnMaxDeliveryCount=True,
            ),
            queue("poison-alone", RequiresSession=True, MaxDeliveryCount=2),
            queue("ops", RequiresSession=True),
            queue("state", RequiresSession=True),
            queue("amqp", RequiresSession=True),
            queue("plain"),
            queue(
                "parts",
                RequiresSession=True,
                EnablePartitioning=True,
                PartitionCount=4,
                MaxDeliveryCount=1,
                DeadLetterSessionOnMaxDeliveryCount=True,
            ),
        ]
    )


@pytest.fixture
def client(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as sb:
        yield sb


def send(client, queue_name: str, session_id: str, bodies: list[str]) -> None:
    with client.get_queue_sender(queue_name) as sender:
        sender.send_messages([ServiceBusMessage(b, session_id=session_id) for b in bodies])


def http(
    busd, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(busd.http_url + path, data=body, method=method)
    request.add_header("Authorization", admin_token())
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def state_path(queue_name: str, session_id: str) -> str:
    return f"/admin/queues/{queue_name}/sessions/{quote(session_id, safe='')}/state"


def tool(busd, *args: str):
    result = CliRunner().invoke(cli, [*args, "--url", busd.http_url], prog_name="busd")
    assert result.exit_code == 0, result.output
    return result.output


def abandon_first_twice(client, queue_name: str, session_id: str) -> None:
    """The session's first message fails twice: MaxDeliveryCount (2) is reached."""
    with client.get_queue_receiver(queue_name, session_id=session_id, max_wait_time=5) as receiver:
        receiver.session.set_state(b"progress")
        for attempt in range(2):
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert str(message) == "m0" and message.delivery_count == attempt
            receiver.abandon_message(message)


def dead_letters(client, queue_name: str, count: int) -> list:
    with client.get_queue_receiver(
        queue_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as receiver:
        got = receive(receiver, count)
        for message in got:
            receiver.complete_message(message)
    return got


# --- the policy, through the official SDK ---------------------------------------------------


def test_a_poison_message_takes_its_whole_session_to_the_dlq_in_order(client):
    send(client, "poison", "s1", [f"m{i}" for i in range(5)])
    send(client, "poison", "s2", ["x0", "x1"])
    abandon_first_twice(client, "poison", "s1")

    got = dead_letters(client, "poison", 5)
    assert [str(m) for m in got] == ["m0", "m1", "m2", "m3", "m4"]
    assert [m.session_id for m in got] == ["s1"] * 5
    assert {m.dead_letter_reason for m in got} == {"MaxDeliveryCountExceeded"}
    assert "delivery attempts" in (got[1].dead_letter_error_description or "")
    with client.get_queue_receiver("poison", session_id="s1", max_wait_time=2) as receiver:
        assert receiver.receive_messages(max_message_count=5, max_wait_time=1) == []
        assert receiver.session.get_state() is None  # it went with the dead letters
    with client.get_queue_receiver("poison", session_id="s2", max_wait_time=5) as receiver:
        assert [str(m) for m in receive(receiver, 2)] == ["x0", "x1"]  # other sessions go on


def test_without_the_policy_the_poison_message_goes_alone(client):
    send(client, "poison-alone", "s1", ["m0", "m1"])
    abandon_first_twice(client, "poison-alone", "s1")
    assert [str(m) for m in dead_letters(client, "poison-alone", 1)] == ["m0"]
    # m1 stayed in its session: the dead-letter queue is empty, the session serves it
    with client.get_queue_receiver(
        "poison-alone", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as receiver:
        assert receiver.peek_messages(max_message_count=5) == []
    with client.get_queue_receiver("poison-alone", session_id="s1", max_wait_time=5) as receiver:
        assert [str(m) for m in receive(receiver, 1)] == ["m1"]


# --- on demand: the CLI and the admin HTTP API ------------------------------------------------


def test_an_operator_dead_letters_a_session_and_resubmits_it_in_order_with_its_state(busd, client):
    send(client, "ops", "order/7", ["a1", "a2", "a3"])
    send(client, "ops", "other", ["o1"])
    with client.get_queue_receiver("ops", session_id="order/7", max_wait_time=5) as receiver:
        receiver.session.set_state(b"step-1")
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.defer_message(first)

    out = tool(
        busd,
        "sessions",
        "dead-letter",
        "ops",
        "order/7",
        "--reason",
        "Stuck",
        "--description",
        "an operator stopped it",
    )
    assert "dead-lettered 3 message(s)" in out
    dlq = json.loads(tool(busd, "peek", "ops", "--dlq", "--json"))
    assert [(m["body"], m["dead_letter_reason"], m["dead_letter_description"]) for m in dlq] == [
        (b, "Stuck", "an operator stopped it") for b in ("a1", "a2", "a3")
    ]
    assert http(busd, "GET", state_path("ops", "order/7"))[0] == 404

    send(client, "ops", "order/7", ["late"])  # a new message forms the session anew
    out = tool(busd, "sessions", "resubmit", "ops", "order/7")
    assert "resubmitted 3 message(s)" in out
    with client.get_queue_receiver("ops", session_id="order/7", max_wait_time=5) as receiver:
        got = receive(receiver, 4)
        assert [str(m) for m in got] == ["a1", "a2", "a3", "late"]
        assert [m.delivery_count for m in got] == [0, 0, 0, 0]
        assert receiver.session.get_state() == b"step-1"
        for message in got:
            receiver.complete_message(message)
    with client.get_queue_receiver("ops", session_id="other", max_wait_time=5) as receiver:
        assert [str(m) for m in receive(receiver, 1)] == ["o1"]


def test_session_routes_refuse_what_they_cannot_do(busd):
    status, body, _ = http(busd, "POST", "/admin/queues/plain/sessions/s/dead-letter", b"{}")
    assert status == 400 and b"no sessions" in body
    assert http(busd, "GET", "/admin/queues/ops/sessions/s/dead-letter")[0] == 405
    assert http(busd, "POST", "/admin/queues/ops/sessions/s/dead-letter", b"[1]")[0] == 400
    assert http(busd, "POST", "/admin/queues/nope/sessions/s/resubmit")[0] == 404
    status, body, _ = http(
        busd,
        "POST",
        "/admin/queues/ops/sessions/none/dead-letter",
        json.dumps({"reason": "x"}).encode(),
    )
    assert (status, json.loads(body)) == (200, {"dead_lettered": 0})


# --- conditional session state over HTTP ---------------------------------------------------


def test_session_state_over_http_honours_if_match_and_if_none_match(busd, client):
    path = state_path("state", "s1")
    assert http(busd, "GET", path)[0] == 404
    status, body, headers = http(busd, "PUT", path, b"v1", {"If-None-Match": "*"})
    assert status == 200
    first = headers["ETag"]
    assert json.loads(body) == {"etag": first.strip('"')}
    assert http(busd, "PUT", path, b"again", {"If-None-Match": "*"})[0] == 412
    assert http(busd, "GET", path)[:2] == (200, b"v1")
    assert http(busd, "GET", path)[2]["ETag"] == first

    status, _, headers = http(busd, "PUT", path, b"v1")  # unconditional: same bytes, new etag
    second = headers["ETag"]
    assert status == 200 and second != first
    status, body, _ = http(busd, "PUT", path, b"v2", {"If-Match": first})
    assert status == 412 and b"error" in body
    assert http(busd, "GET", path)[1] == b"v1"  # nothing changed
    status, _, headers = http(busd, "PUT", path, b"v2", {"If-Match": second})
    third = headers["ETag"]
    assert status == 200 and third not in (first, second)
    with client.get_queue_receiver("state", session_id="s1", max_wait_time=5) as receiver:
        assert receiver.session.get_state() == b"v2"  # the SDK's state is the same one
        receiver.session.set_state(b"from-sdk")
    assert http(busd, "GET", path)[2]["ETag"] not in (first, second, third)

    assert http(busd, "DELETE", path, headers={"If-Match": third})[0] == 412
    assert http(busd, "DELETE", path, headers={"If-Match": "*"})[0] == 200
    assert http(busd, "GET", path)[0] == 404
    assert http(busd, "PUT", path, b"x", {"If-Match": "*"})[0] == 412  # there is none
    assert http(busd, "PUT", path, b"x", {"If-None-Match": "v1"})[0] == 400


# --- the $management extensions, with a proton client -------------------------------------


def test_amqp_session_state_carries_an_etag_and_honours_if_match(busd, client):
    send(client, "amqp", "s1", ["m"])
    with ProtonCbsClient(busd.port) as proton:
        mgmt = Management(proton, "amqp")
        proton.receiver("amqp", session="s1")  # holds the session on this connection
        answer = mgmt.request("get-session-state", {"session-id": "s1"})
        assert answer.properties["statusCode"] == 200
        assert answer.body == {"session-state": None}  # no state: no etag either

        answer = mgmt.request("set-session-state", {"session-id": "s1", "session-state": b"a"})
        assert (answer.properties["statusCode"], answer.body) == (200, None)  # as before
        answer = mgmt.request("get-session-state", {"session-id": "s1"})
        etag = answer.body["etag"]
        assert answer.body["session-state"] == b"a" and isinstance(etag, str)

        answer = mgmt.request(
            "set-session-state", {"session-id": "s1", "session-state": b"b", "if-match": "0"}
        )
        assert answer.properties["statusCode"] == 412
        assert answer.properties["errorCondition"] == "com.microsoft:precondition-failed"
        assert mgmt.request("get-session-state", {"session-id": "s1"}).body == {
            "session-state": b"a",
            "etag": etag,
        }

        answer = mgmt.request(
            "set-session-state", {"session-id": "s1", "session-state": b"b", "if-match": etag}
        )
        assert answer.properties["statusCode"] == 200
        new = answer.body["etag"]
        assert new != etag
        assert mgmt.request("get-session-state", {"session-id": "s1"}).body == {
            "session-state": b"b",
            "etag": new,
        }


def test_amqp_dead_letters_and_resubmits_a_session(busd, client):
    send(client, "amqp", "s2", ["d1", "d2"])
    with ProtonCbsClient(busd.port) as proton:
        mgmt = Management(proton, "amqp")
        answer = mgmt.request(
            "com.busd:dead-letter-session", {"session-id": "s2", "deadletter-reason": "ByAmqp"}
        )
        assert (answer.properties["statusCode"], answer.body) == (200, {"message-count": 2})
        peeked = mgmt.request(
            "peek-message", {"from-sequence-number": 1, "message-count": 10, "session-id": "s2"}
        )
        assert peeked.properties["statusCode"] == 204  # none left in the queue
        answer = mgmt.request("com.busd:resubmit-session", {"session-id": "s2"})
        assert (answer.properties["statusCode"], answer.body) == (
            200,
            {"message-count": 2, "left-count": 0},
        )

        plain = Management(proton, "plain")
        answer = plain.request("com.busd:dead-letter-session", {"session-id": "s2"})
        assert answer.properties["statusCode"] == 400
        assert answer.properties["errorCondition"] == "amqp:not-allowed"
    with client.get_queue_receiver("amqp", session_id="s2", max_wait_time=5) as receiver:
        assert [str(m) for m in receive(receiver, 2)] == ["d1", "d2"]


# --- a partitioned queue: each session's operations run in its own partition -----------------


def test_session_tools_work_per_partition(busd, client):
    sessions = [f"p{i}" for i in range(6)]  # spread over the 4 partitions
    for sid in sessions:
        send(client, "parts", sid, [f"{sid}-{n}" for n in range(3)])
    for sid in sessions[:3]:
        path = f"/admin/queues/parts/sessions/{sid}"
        assert (
            http(busd, "PUT", state_path("parts", sid), sid.encode(), {"If-None-Match": "*"})[0]
            == 200
        )
        status, body, _ = http(
            busd, "POST", path + "/dead-letter", json.dumps({"reason": "Split"}).encode()
        )
        assert (status, json.loads(body)) == (200, {"dead_lettered": 3})
    with client.get_queue_receiver("parts", session_id="p3", max_wait_time=5) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.abandon_message(message)  # MaxDeliveryCount 1: the policy takes p3 whole
    send(client, "parts", "p0", ["p0-again"])
    status, body, _ = http(busd, "POST", "/admin/queues/parts/sessions/p0/resubmit")
    assert (status, json.loads(body)) == (200, {"resubmitted": 3, "left": 0})
    with client.get_queue_receiver("parts", session_id="p0", max_wait_time=5) as receiver:
        assert [str(m) for m in receive(receiver, 4)] == ["p0-0", "p0-1", "p0-2", "p0-again"]
        assert receiver.session.get_state() == b"p0"

    got = dead_letters(client, "parts", 9)
    by_session: dict[str, list[str]] = {}
    for message in got:
        by_session.setdefault(message.session_id, []).append(str(message))
    assert by_session == {sid: [f"{sid}-{n}" for n in range(3)] for sid in sessions[1:4]}
    assert http(busd, "GET", state_path("parts", "p1"))[0] == 404
    for sid in ("p4", "p5"):  # untouched
        with client.get_queue_receiver("parts", session_id=sid, max_wait_time=5) as receiver:
            assert [str(m) for m in receive(receiver, 3)] == [f"{sid}-{n}" for n in range(3)]
