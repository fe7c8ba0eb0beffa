"""The operator tools end to end: `busd queues|peek|sessions|send|purge|dlq resubmit` and the
admin HTTP API they use, against a running busd over a real store, checked with the SDK."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from importlib.metadata import version

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from click.testing import CliRunner

from busd.amqp import codec
from busd.auth.sas import generate_sas_token
from busd.cli.main import cli
from busd.errors import EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNAVAILABLE
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import start_valkey
from tests.e2e.conftest import (
    launch_busd,
    queue,
    receive,
    subscription,
    topic,
    write_config,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("plain"),
            queue("sessions", RequiresSession=True),
            queue("dead-sessions", RequiresSession=True),
            queue("counted", RequiresSession=True),
            queue("orders/eu"),
            queue("dead"),
            queue("many"),
            queue("scrap"),
            queue("subjects"),
        ],
        topics=[topic("events", [subscription("s1"), subscription("s2", RequiresSession=True)])],
    )


def tool(busd, *args: str):
    result = CliRunner().invoke(cli, [*args, "--url", busd.http_url], prog_name="busd")
    assert "Traceback" not in result.output, result.output
    return result


def tool_json(busd, *args: str):
    result = tool(busd, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def admin_token(key: str = "SAS_KEY_VALUE") -> str:
    return generate_sas_token(
        "sb://localhost/", "RootManageSharedAccessKey", key, int(time.time()) + 300
    )


def http(
    busd, method: str, path: str, body: bytes | None = None, *, token: str | None = None
) -> tuple[int, object]:
    request = urllib.request.Request(busd.http_url + path, data=body, method=method)
    request.add_header("Authorization", admin_token() if token is None else token)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_admin_api_refuses_requests_without_a_valid_token(busd):
    assert http(busd, "GET", "/admin/queues", token="")[0] == 401
    assert http(busd, "POST", "/admin/queues/plain/purge", token=admin_token("WRONG"))[0] == 401
    assert http(busd, "GET", "/admin/queues")[0] == 200
    with urllib.request.urlopen(busd.http_url + "/health", timeout=10) as response:
        assert response.status == 200  # health and metrics need no token


def test_tools_sign_with_the_key_in_busd_sas_key(busd, monkeypatch):
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey=WRONG")
    result = tool(busd, "queues")
    assert result.exit_code == 65 and "valid SAS token" in result.output, result.output
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey=SAS_KEY_VALUE")
    assert tool(busd, "queues").exit_code == 0


def test_send_then_peek_shows_the_message_and_the_sdk_receives_it(busd):
    result = tool(busd, "send", "plain", "hello admin", "-p", "kind=test")
    assert result.exit_code == 0, result.output
    assert "sequence number 1" in result.output

    peeked = tool_json(busd, "peek", "plain")
    assert [(m["sequence_number"], m["body"], m["state"], m["delivery_count"]) for m in peeked] == [
        (1, "hello admin", "active", 0)
    ]
    assert peeked[0]["application_properties"] == {"kind": "test"}
    table = tool(busd, "peek", "plain").output.splitlines()
    assert table[0].split() == [
        "SEQ",
        "STATE",
        "ENQUEUED",
        "DELIVERIES",
        "SESSION",
        "SUBJECT",
        "BODY",
    ]
    assert table[1].split()[0:2] == ["1", "active"] and table[1].endswith("hello admin")

    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("plain", max_wait_time=5) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert str(message) == "hello admin"
            assert message.application_properties == {b"kind": b"test"}
            assert message.sequence_number == 1
            receiver.complete_message(message)
    assert tool_json(busd, "peek", "plain") == []


def test_queues_lists_every_queue_with_its_counts(busd):
    tool(busd, "send", "orders/eu", "one")
    tool(busd, "send", "orders/eu", "two")
    found = {q["name"]: q for q in tool_json(busd, "queues")}
    assert set(found) == {
        "plain",
        "sessions",
        "dead-sessions",
        "counted",
        "orders/eu",
        "dead",
        "many",
        "scrap",
        "subjects",
        "events/subscriptions/s1",
        "events/subscriptions/s2",
    }
    assert found["orders/eu"]["counts"]["active"] == 2
    assert found["sessions"]["properties"]["requires_session"] is True
    lines = tool(busd, "queues").output.splitlines()
    assert lines[0].split()[:4] == ["ENTITY", "KIND", "ACTIVE", "SCHEDULED"]
    row = next(line.split() for line in lines if line.startswith("orders/eu"))
    assert row[1:3] == ["queue", "2"]


def test_sessions_show_lock_locked_until_messages_and_state_size(busd):
    refused = tool(busd, "send", "sessions", "no session")
    assert refused.exit_code == EXIT_INVALID
    assert refused.output.strip() == (
        "busd: error: queue 'sessions' requires sessions: give a session id"
    )
    for body in ("a1", "a2"):
        assert tool(busd, "send", "sessions", "--session", "a", body).exit_code == 0
    assert tool(busd, "send", "sessions", "--session", "b", "b1").exit_code == 0
    peeked = tool_json(busd, "peek", "sessions", "--session", "a")
    assert [m["body"] for m in peeked] == ["a1", "a2"]

    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("sessions", session_id="a", max_wait_time=5) as receiver:
            receiver.session.set_state(b"12345")
            listed = {
                s["session_id"]: s for s in tool_json(busd, "sessions", "sessions")["sessions"]
            }
            assert listed["a"]["locked"] is True
            assert (
                listed["a"]["locked_until"]
                == receiver.session.locked_until_utc.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            )
            assert (listed["a"]["message_count"], listed["a"]["state_size"]) == (2, 5)
            # the inspector's columns: who holds it, messages by state, the state's preview
            assert listed["a"]["holder_address"].startswith("127.0.0.1:")
            assert listed["a"]["holder_connection"]
            assert listed["a"]["holder_process"]
            assert (
                listed["a"]["active"],
                listed["a"]["in_flight"],
                listed["a"]["deferred"],
                listed["a"]["scheduled"],
            ) == (2, 0, 0, 0)
            assert listed["a"]["state_preview"] == "12345"
            assert listed["a"]["oldest_message_age_s"] >= 0
            assert listed["a"]["last_activity"] and listed["a"]["stuck"] is False
            assert (
                listed["b"]["locked"],
                listed["b"]["locked_until"],
                listed["b"]["message_count"],
                listed["b"]["holder_address"],
            ) == (False, None, 1, None)
            lines = tool(busd, "sessions", "sessions").output.splitlines()
            assert lines[0].split() == [
                "SESSION",
                "HOLDER",
                "LOCKED-UNTIL",
                "ACTIVE",
                "IN-FLIGHT",
                "DEFERRED",
                "SCHEDULED",
                "OLDEST",
                "STATE-BYTES",
                "STATE",
                "LAST-ACTIVITY",
            ]
            assert lines[1].split()[0] == "a" and lines[1].split()[1].startswith("127.0.0.1:")
            assert lines[1].split()[3] == "2" and "12345" in lines[1].split()


def test_active_counts_locked_messages_in_every_view_as_activemessagecount(busd):
    for body in ("m1", "m2", "m3"):
        tool(busd, "send", "counted", body, "--session", "s1")
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("counted", session_id="s1", max_wait_time=5) as receiver:
            (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            # one of the three is locked, not settled: Service Bus counts it active
            with ServiceBusAdministrationClient.from_connection_string(
                busd.admin_connection_string, connection_verify=busd.cert_path
            ) as admin:
                runtime = admin.get_queue_runtime_properties("counted")
            assert runtime.active_message_count == 3
            (queue_row,) = [q for q in tool_json(busd, "queues") if q["name"] == "counted"]
            assert (queue_row["counts"]["active"], queue_row["counts"]["locked"]) == (3, 1)
            (session_row,) = tool_json(busd, "sessions", "counted")["sessions"]
            assert (session_row["active"], session_row["in_flight"]) == (3, 1)
            assert session_row["available"] == 2
            (shard_row,) = tool_json(busd, "shards", "counted")[0]["shards"]
            assert shard_row["active"] == 3
            with urllib.request.urlopen(busd.http_url + "/metrics", timeout=10) as response:
                metrics = response.read().decode()
            assert 'busd_entity_messages{entity="counted",state="active"} 3.0' in metrics
            assert 'busd_entity_messages{entity="counted",state="locked"} 1.0' in metrics
            # the tables' ACTIVE columns say the same
            queues_table = tool(busd, "queues").output.splitlines()
            assert next(r.split() for r in queues_table if r.startswith("counted "))[2] == "3"
            sessions_table = tool(busd, "sessions", "counted").output.splitlines()
            active_column = sessions_table[0].split().index("ACTIVE")
            assert sessions_table[1].split()[active_column] == "3"
            receiver.complete_message(held)


def test_peek_dlq_purge_and_resubmit(busd):
    for i in range(4):
        tool(busd, "send", "dead", f"d{i}")
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("dead", max_wait_time=5) as receiver:
            got = []
            while len(got) < 4:
                got += receiver.receive_messages(max_message_count=4 - len(got), max_wait_time=5)
            for m in got[:3]:
                receiver.dead_letter_message(m, reason="bad-input", error_description="no")
            receiver.complete_message(got[3])

    dead = tool_json(busd, "peek", "dead", "--dlq")
    assert [(m["body"], m["dead_letter_reason"]) for m in dead] == [
        ("d0", "bad-input"),
        ("d1", "bad-input"),
        ("d2", "bad-input"),
    ]
    assert "REASON" in tool(busd, "peek", "dead", "--dlq").output.splitlines()[0]

    one = tool_json(busd, "dlq", "resubmit", "dead", "--limit", "1")
    assert (one["resubmitted"], one["dead_letter"]) == (1, 2)
    result = tool(busd, "dlq", "resubmit", "dead")
    assert result.exit_code == 0
    assert "resubmitted 2 dead-lettered message(s), 0 left" in result.output
    back = tool_json(busd, "peek", "dead")
    assert [(m["body"], m["delivery_count"], m["dead_letter_reason"]) for m in back] == [
        ("d0", 0, None),
        ("d1", 0, None),
        ("d2", 0, None),
    ]
    assert min(m["sequence_number"] for m in back) > 4  # new messages

    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("dead", max_wait_time=5) as receiver:
            (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.dead_letter_message(m, reason="again")
    assert tool_json(busd, "purge", "dead", "--dlq") == {"purged": 1}
    purged = tool(busd, "purge", "dead")
    assert purged.exit_code == 0 and purged.output.strip() == "dead: purged 2 message(s)"
    assert tool_json(busd, "peek", "dead") == [] and tool_json(busd, "peek", "dead", "--dlq") == []


def test_dlq_resubmit_with_a_limit_keeps_a_session_whole_and_in_order(busd):
    bodies = [str(i) for i in range(0, 100, 10)]
    for body in bodies:
        tool(busd, "send", "dead-sessions", body, "--session", "s1")
    tool(busd, "send", "dead-sessions", "other", "--session", "s2")
    for sid in ("s1", "s2"):
        assert (
            tool(busd, "sessions", "dead-letter", "dead-sessions", sid, "--reason", "x").exit_code
            == 0
        )
    seqs = [m["sequence_number"] for m in tool_json(busd, "peek", "dead-sessions", "--dlq")]

    # --limit 3 would split s1: it moves s1 whole (the oldest session) and leaves s2
    done = tool(busd, "dlq", "resubmit", "dead-sessions", "--limit", "3")
    assert done.output == (
        "dead-sessions: resubmitted 10 dead-lettered message(s) (sessions move whole), "
        "1 left in the dead-letter queue\n"
    )
    assert tool_json(busd, "sessions", "resubmit", "dead-sessions", "s2")["resubmitted"] == 1
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("dead-sessions", session_id="s1", max_wait_time=3) as r:
            got = [(str(m), m.sequence_number) for m in r]
            for m in r.peek_messages(max_message_count=1):
                raise AssertionError(f"left: {m}")
    assert got == list(zip(bodies, seqs[:10]))  # in order, under their own numbers


async def test_resubmit_of_many_goes_in_chunks(busd, redis_url):
    # 1200 dead letters, made straight in the store that busd uses (quicker than the SDK)
    store = RedisStore(redis_url, prefix=busd.prefix)
    await store.connect()
    try:
        spec = QueueSpec("many")
        blobs = [
            codec.parse_incoming(codec.encode_message(data=f"m{i}".encode())).blob
            for i in range(1200)
        ]
        await store.send(spec, [NewMessage(blob) for blob in blobs])
        for _ in range(3):
            got = await store.receive(
                spec, 400, ReceiveMode.PEEK_LOCK, [os.urandom(16) for _ in range(400)]
            )
            await store.settle(spec, [Settlement(m.lock_token, Outcome.DEAD_LETTER) for m in got])
        assert (await store.counts(spec)).dead_letter == 1200
    finally:
        await store.close()
    done = tool_json(busd, "dlq", "resubmit", "many")
    assert done == {"resubmitted": 1200, "remaining": 0, "dead_letter": 0}
    first = tool_json(busd, "peek", "many", "--count", "3")
    assert [m["body"] for m in first] == ["m0", "m1", "m2"]


def test_errors_are_one_line_with_exit_codes(busd):
    unknown = tool(busd, "peek", "nope")
    assert unknown.exit_code == EXIT_NOT_FOUND
    assert unknown.output.strip() == "busd: error: no queue or subscription named 'nope'"
    for args in (
        ["queues"],
        ["sessions", "nope"],
        ["purge", "nope"],
        ["send", "nope", "x"],
        ["dlq", "resubmit", "nope"],
    ):
        result = tool(busd, *args)
        assert result.exit_code == (EXIT_NOT_FOUND if len(args) > 1 else 0), args
    gone = CliRunner().invoke(cli, ["queues", "--url", "http://127.0.0.1:9"], prog_name="busd")
    assert gone.exit_code == EXIT_UNAVAILABLE
    assert gone.output.startswith("busd: error: cannot reach busd at http://127.0.0.1:9")
    assert len(gone.output.strip().splitlines()) == 1


def test_url_comes_from_busd_url(busd):
    result = CliRunner().invoke(cli, ["queues", "--json"], env={"BUSD_URL": busd.http_url})
    assert result.exit_code == 0 and json.loads(result.output)


def test_admin_http_api_answers_json_errors(busd):
    assert http(busd, "GET", "/admin/queues/nope/messages") == (
        404,
        {"error": "no queue or subscription named 'nope'"},
    )
    assert http(busd, "DELETE", "/admin/queues/plain")[0] == 405
    assert http(busd, "POST", "/admin/queues/plain/messages", b"{not json")[0] == 400
    assert http(busd, "POST", "/admin/queues/plain/messages", b'{"body": 5}')[0] == 400
    assert http(busd, "GET", "/admin/queues/plain/messages?count=x")[0] == 400
    # refused as a sender link's transfer would be: too large, or not admissible
    stored = [http(busd, "GET", f"/admin/queues/{q}")[1] for q in ("plain", "sessions")]
    big = json.dumps({"body": "x" * 1_100_000}).encode()  # over the 1 MB default
    status, error = http(busd, "POST", "/admin/queues/plain/messages", big)
    assert status == 413 and "exceeds the limit" in error["error"]
    status, error = http(
        busd,
        "POST",
        "/admin/queues/sessions/messages",
        json.dumps({"body": "x", "session_id": "s" * 129}).encode(),
    )
    assert status == 400 and "at most 128 characters" in error["error"]
    assert [http(busd, "GET", f"/admin/queues/{q}")[1] for q in ("plain", "sessions")] == stored
    status, sent = http(
        busd,
        "POST",
        "/admin/queues/scrap/messages",
        json.dumps({"body_base64": "AAEC", "message_id": "m-1"}).encode(),
    )
    assert status == 201 and sent["message_id"] == "m-1"
    status, (peeked,) = http(busd, "GET", "/admin/queues/scrap/messages?from=0&count=5")
    assert (peeked["body_base64"], peeked["body"], peeked["message_id"]) == (
        "AAEC",
        "\x00\x01\x02",
        "m-1",
    )
    status, info = http(busd, "GET", "/admin/queues/orders%2Feu")
    assert status == 200 and info["name"] == "orders/eu"


def test_store_unreachable_is_503_and_exit_69(tmp_path):
    server = start_valkey()
    proc = None
    try:
        config = write_config(tmp_path / "config.json", [queue("q")])
        proc = launch_busd(server.connection_url, config, tmp_path)
        assert http(proc, "GET", "/health") == (
            200,
            {"status": "healthy", "message": "Service is healthy."},
        )
        assert http(proc, "GET", "/health/detail") == (
            200,
            {"status": "ok", "store": True, "version": version("busd")},
        )
        server.stop()
        # the emulator's answer, which container tools wait on; busd's own detail beside it
        assert http(proc, "GET", "/health") == (
            503,
            {
                "status": "unhealthy",
                "message": "Service not available. Please try after some time.",
            },
        )
        assert http(proc, "GET", "/health/detail") == (
            503,
            {"status": "degraded", "store": False, "version": version("busd")},
        )
        assert http(proc, "GET", "/admin/queues")[0] == 503
        result = tool(proc, "queues")
        assert result.exit_code == EXIT_UNAVAILABLE
        assert result.output.startswith("busd: error: the store is unreachable")
    finally:
        if proc is not None:
            proc.stop()
        if server.is_running():
            server.stop()


def test_the_tools_work_on_a_topics_subscriptions(busd):
    sent = tool_json(busd, "send", "events", "hello", "--session", "k")
    assert sent["sequence_number"] >= 1
    found = {q["name"]: q for q in tool_json(busd, "queues")}
    s1 = found["events/subscriptions/s1"]
    assert (s1["kind"], s1["topic"], s1["counts"]["active"]) == ("subscription", "events", 1)
    peeked = tool_json(busd, "peek", "Events/Subscriptions/S1")
    assert [m["sequence_number"] for m in peeked] == [sent["sequence_number"]]
    (info,) = tool_json(busd, "sessions", "events/Subscriptions/s2")["sessions"]
    assert (info["session_id"], info["message_count"]) == ("k", 1)
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_subscription_receiver("events", "s1", max_wait_time=5) as rx:
            (m,) = rx.receive_messages(max_wait_time=5)
            rx.dead_letter_message(m, reason="operator test")
    assert tool_json(busd, "dlq", "resubmit", "events/Subscriptions/s1")["resubmitted"] == 1
    assert tool_json(busd, "purge", "events/Subscriptions/s1")["purged"] == 1
    assert tool_json(busd, "purge", "events/Subscriptions/s2")["purged"] == 1
    assert tool(busd, "peek", "events/Subscriptions/nope").exit_code == EXIT_NOT_FOUND
    refused = tool(busd, "send", "events/Subscriptions/s1", "x")
    assert refused.exit_code == EXIT_INVALID


def test_peek_shows_the_subject(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_sender("subjects") as sender:
            sender.send_messages(ServiceBusMessage("from the sdk", subject="invoice"))
    assert tool(busd, "send", "subjects", "from the tool", "--subject", "refund").exit_code == 0
    assert [(m["subject"], m["body"]) for m in tool_json(busd, "peek", "subjects")] == [
        ("invoice", "from the sdk"),
        ("refund", "from the tool"),
    ]
    table = tool(busd, "peek", "subjects").output.splitlines()
    column = table[0].split().index("SUBJECT") + 1  # ENQUEUED is a date and a time
    assert [row.split()[column] for row in table[1:]] == ["invoice", "refund"]
    with ServiceBusClient.from_connection_string(busd.connection_string) as sb:
        with sb.get_queue_receiver("subjects", max_wait_time=5) as receiver:
            assert [m.subject for m in receive(receiver, 2)] == ["invoice", "refund"]


def test_topics_lists_topics_without_subscriptions_and_the_rules(busd):
    assert tool(busd, "topic", "create", "lonely").exit_code == 0
    assert tool(busd, "topic", "create", "routed").exit_code == 0
    assert tool(busd, "subscription", "create", "routed", "red").exit_code == 0
    made = tool(
        busd,
        "rule",
        "create",
        "routed",
        "red",
        "reds",
        "--sql",
        "color = 'red'",
        "--action",
        "SET seen = 1",
    )
    assert made.exit_code == 0, made.output
    assert tool(busd, "rule", "delete", "routed", "red", "$Default").exit_code == 0
    found = {t["name"]: t for t in tool_json(busd, "topics")}
    assert found["lonely"]["subscriptions"] == []
    (red,) = found["routed"]["subscriptions"]
    assert [(r["name"], r["filter_text"], r["action"]) for r in red["rules"]] == [
        ("reds", "color = 'red'", "SET seen = 1")
    ]
    assert [r["name"] for r in found["events"]["subscriptions"][0]["rules"]] == ["$Default"]
    rows = table_rows(tool(busd, "topics").output)
    assert rows[0] == {
        "TOPIC": "events",
        "SUBSCRIPTION": "s1",
        "SESSIONS": "no",
        "RULE": "$Default",
        "FILTER": "1=1",
        "ACTION": "-",
    }
    assert {
        "TOPIC": "lonely",
        "SUBSCRIPTION": "-",
        "SESSIONS": "-",
        "RULE": "-",
        "FILTER": "-",
        "ACTION": "-",
    } in rows
    assert {
        "TOPIC": "routed",
        "SUBSCRIPTION": "red",
        "SESSIONS": "no",
        "RULE": "reds",
        "FILTER": "color = 'red'",
        "ACTION": "SET seen = 1",
    } in rows


def table_rows(output: str) -> list[dict[str, str]]:
    """A tool's table as {header: cell} per row (cells are cut at the headers' columns)."""
    header, *lines = output.splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, starts[1:] + [None]))
    names = [header[a:b].strip() for a, b in bounds]
    return [{n: line[a:b].strip() for n, (a, b) in zip(names, bounds)} for line in lines]


def test_tools_reach_busd_over_https_with_its_certificate(busd, monkeypatch):
    url = busd.http_url.replace("http://", "https://")

    def run(*args: str):
        return CliRunner().invoke(cli, [*args, "--url", url], prog_name="busd")

    untrusted = run("queues")
    assert untrusted.exit_code == EXIT_UNAVAILABLE
    assert "does not trust" in untrusted.output and "--cacert" in untrusted.output
    assert run("queues", "--ca", busd.cert_path).exit_code == 0
    assert run("topic", "show", "events", "--ca", busd.cert_path).exit_code == 0
    monkeypatch.setenv("BUSD_CACERT", busd.cert_path)
    listed = run("queues", "--json")
    assert listed.exit_code == 0, listed.output
    assert "plain" in {q["name"] for q in json.loads(listed.stdout)}
    assert run("peek", "plain").exit_code == 0
