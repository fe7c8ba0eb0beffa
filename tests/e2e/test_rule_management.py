"""Rule management on a subscription's `$management` node (docs/wire.md §8.4.11): the official
JavaScript SDK's rule manager under node, and a plain proton client for what the SDK hides
(status codes, descriptors, paging edges, bad input leaving nothing changed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from proton import Described, Message, symbol, ulong

from busd.rules.amqp import (
    CORRELATION_FILTER,
    EMPTY_RULE_ACTION,
    FALSE_FILTER,
    RULE_DESCRIPTION,
    SQL_FILTER,
    SQL_RULE_ACTION,
    TRUE_FILTER,
)
from tests.e2e.amqp_client import Management, ProtonCbsClient
from tests.e2e.conftest import JS_DIR, launch_busd, queue


def subscription(name: str, rules: list | None = None) -> dict:
    entry = {
        "Name": name,
        "Properties": {
            "DeadLetteringOnMessageExpiration": False,
            "DefaultMessageTimeToLive": "PT1H",
            "LockDuration": "PT1M",
            "MaxDeliveryCount": 3,
            "ForwardDeadLetteredMessagesTo": "",
            "ForwardTo": "",
            "RequiresSession": False,
        },
    }
    if rules is not None:
        entry["Rules"] = rules
    return entry


@pytest.fixture(scope="module")
def busd(redis_url, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rules")
    topic = {
        "Name": "rt",
        "Properties": {
            "DefaultMessageTimeToLive": "PT1H",
            "RequiresDuplicateDetection": False,
            "DuplicateDetectionHistoryTimeWindow": "PT20S",
        },
        "Subscriptions": [subscription(f"s{i}") for i in range(1, 6)]
        + [
            subscription(
                "cfg",
                [
                    {
                        "Name": "sql-filter-1",
                        "Properties": {
                            "FilterType": "Sql",
                            "SqlFilter": {
                                "SqlExpression": "sys.MessageId = '123456' AND userProp1 = 'v'"
                            },
                            "Action": {"SqlExpression": "SET sys.To = 'Entity'"},
                        },
                    },
                    {
                        "Name": "corr",
                        "Properties": {
                            "FilterType": "Correlation",
                            "CorrelationFilter": {
                                "ContentType": "application/json",
                                "Properties": {"prop1": "value1"},
                            },
                        },
                    },
                ],
            )
        ],
    }
    document = {
        "UserConfig": {
            "Namespaces": [{"Name": "sbemulatorns", "Queues": [queue("q")], "Topics": [topic]}],
            "Logging": {"Type": "File"},
        }
    }
    config = workdir / "Config.json"
    config.write_text(json.dumps(document))
    proc = launch_busd(redis_url, config, workdir)
    # a second process on the same store: rule changes made through one reach the other
    other = launch_busd(redis_url, config, workdir, prefix=proc.prefix)
    proc.other = other  # type: ignore[attr-defined]
    yield proc
    other.stop()
    proc.stop()


@pytest.fixture
def client(busd):
    with ProtonCbsClient(busd.port) as c:
        yield c


def status(answer: Message) -> int:
    return answer.properties["statusCode"]


def sql_rule(name: str, expression: str, action: str | None = None) -> dict:
    description: dict = {"sql-filter": {"expression": expression}}
    if action is not None:
        description["sql-rule-action"] = {"expression": action}
    return {"rule-name": name, "rule-description": description}


def names(answer: Message) -> list[str]:
    if status(answer) == 204:
        return []
    return [r["rule-description"].value[2] for r in answer.body["rules"]]


# --- the JavaScript SDK -------------------------------------------------------------------


def test_js_rule_manager_creates_lists_in_pages_and_deletes(busd, node_modules):
    env = dict(
        os.environ,
        BUSD_CONN=busd.connection_string,
        BUSD_TOPIC="rt",
        BUSD_SUBSCRIPTION="s1",
        BUSD_EXTRA_RULES="21",
    )
    done = subprocess.run(
        [shutil.which("node") or "node", "rule_manager.mjs"],
        cwd=JS_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout)
    assert "unexpected" not in seen, seen.get("unexpected")
    assert seen["initial"] == [
        {"name": "$Default", "filter": {"sqlExpression": "1=1"}, "action": {}}
    ]
    created = {r["name"]: r for r in seen["afterCreate"]}
    assert created["sql-red"] == {
        "name": "sql-red",
        "filter": {"sqlExpression": "color = 'red'"},
        "action": {},
    }
    assert created["corr-action"]["filter"]["correlationId"] == "c-1"
    assert created["corr-action"]["filter"]["subject"] == "s"
    assert created["corr-action"]["filter"]["applicationProperties"] == {"kind": "order", "n": 3}
    assert created["corr-action"]["action"] == {"sqlExpression": "SET routed = TRUE; REMOVE secret"}
    assert created["always"]["filter"] == {"sqlExpression": "1=1"}  # sent back as a TrueFilter
    assert created["never"]["filter"] == {"sqlExpression": "1=0"}
    order = ["$Default", "sql-red", "corr-action", "always", "never"] + [
        f"bulk-{i:03d}" for i in range(21)
    ]
    assert [r["name"] for r in seen["afterCreate"]] == order
    # listRules pages with skip until an empty page: 26 rules in pages of 10, and one of 100
    assert seen["pages"] == [order[:10], order[10:20], order[20:]]
    assert seen["defaultPages"] == [order]
    assert seen["duplicate"]["code"] == "MessagingEntityAlreadyExists"
    assert "position 18" in seen["badSql"]["message"], seen["badSql"]
    assert "Size cannot be changed" in seen["badAction"]["message"], seen["badAction"]
    assert seen["afterErrors"] == order  # nothing changed
    assert seen["deleteMissing"]["code"] == "MessagingEntityNotFound"
    assert [r["name"] for r in seen["final"]] == ["$Default", "sql-red", "corr-action"]


# --- the wire, with proton ----------------------------------------------------------------


def test_enumerate_rules_answers_numeric_described_lists(client):
    mgmt = Management(client, "rt/Subscriptions/s2")
    assert (
        status(
            mgmt.request(
                "add-rule",
                {
                    "rule-name": "corr",
                    "rule-description": {
                        "correlation-filter": {
                            "correlation-id": "c",
                            "message-id": None,
                            "to": None,
                            "reply-to": None,
                            "label": None,
                            "session-id": None,
                            "reply-to-session-id": None,
                            "content-type": None,
                            "properties": None,
                        },
                        "sql-rule-action": {"expression": "SET x = 1"},
                    },
                },
            )
        )
        == 200
    )
    assert status(mgmt.request("add-rule", sql_rule("sql", "a > 1"))) == 200
    assert status(mgmt.request("add-rule", sql_rule("no", "1=0"))) == 200
    answer = mgmt.request("enumerate-rules", {"top": 100, "skip": 0})
    assert status(answer) == 200
    rules = {}
    for item in answer.body["rules"]:
        described = item["rule-description"]
        assert isinstance(described, Described)
        assert type(described.descriptor) is ulong and described.descriptor == RULE_DESCRIPTION
        flt, action, name, created = described.value
        assert type(flt.descriptor) is ulong and type(action.descriptor) is ulong
        assert created > 0
        rules[name] = (flt.descriptor, flt.value, action.descriptor, action.value)
    assert rules == {
        "$Default": (TRUE_FILTER, [], EMPTY_RULE_ACTION, []),
        "corr": (
            CORRELATION_FILTER,
            ["c", None, None, None, None, None, None, None, {}],
            SQL_RULE_ACTION,
            ["SET x = 1", 20],
        ),
        "sql": (SQL_FILTER, ["a > 1", 20], EMPTY_RULE_ACTION, []),
        "no": (FALSE_FILTER, [], EMPTY_RULE_ACTION, []),
    }


def test_paging_honours_skip_and_top_and_ends_with_204(client):
    mgmt = Management(client, "rt/Subscriptions/s3")
    for i in range(4):
        assert status(mgmt.request("add-rule", sql_rule(f"r{i}", f"n = {i}"))) == 200
    all_names = ["$Default", "r0", "r1", "r2", "r3"]
    assert names(mgmt.request("enumerate-rules", {"top": 2, "skip": 0})) == all_names[:2]
    assert names(mgmt.request("enumerate-rules", {"top": 2, "skip": 2})) == all_names[2:4]
    assert names(mgmt.request("enumerate-rules", {"top": 2, "skip": 4})) == all_names[4:]
    empty = mgmt.request("enumerate-rules", {"top": 2, "skip": 5})
    assert status(empty) == 204 and empty.body is None
    assert names(mgmt.request("enumerate-rules", {"top": 2**31 - 1, "skip": 0})) == all_names


def test_bad_requests_change_nothing(client):
    mgmt = Management(client, "rt/Subscriptions/s4")
    before = names(mgmt.request("enumerate-rules", {"top": 100, "skip": 0}))
    cases = [
        (
            sql_rule("bad", "color = 'red' AND"),
            400,
            "com.microsoft:argument-error",
            "syntax error at position 18",
        ),
        (
            sql_rule("bad", "1=1", "SET sys.SequenceNumber = 1"),
            400,
            "com.microsoft:argument-error",
            "cannot be changed",
        ),
        (
            {"rule-name": "bad", "rule-description": {}},
            400,
            "com.microsoft:argument-error",
            "either a sql-filter or a correlation-filter",
        ),
        (
            {"rule-description": {"sql-filter": {"expression": "1=1"}}},
            400,
            "com.microsoft:argument-error",
            "rule-name",
        ),
        (sql_rule("x" * 51, "1=1"), 400, "com.microsoft:argument-error", "at most 50"),
        (sql_rule("$DEFAULT", "1=1"), 409, "com.microsoft:entity-already-exists", ""),
    ]
    for body, code, condition, fragment in cases:
        answer = mgmt.request("add-rule", body)
        assert status(answer) == code, answer.properties
        assert answer.properties["errorCondition"] == symbol(condition)
        assert fragment in answer.properties["statusDescription"]
    assert names(mgmt.request("enumerate-rules", {"top": 100, "skip": 0})) == before
    missing = mgmt.request("remove-rule", {"rule-name": "nope"})
    assert status(missing) == 404
    assert missing.properties["errorCondition"] == symbol("amqp:not-found")
    bad_page = mgmt.request("enumerate-rules", {"top": -1, "skip": 0})
    assert status(bad_page) == 400


def test_rules_from_the_entities_file_are_listed(client):
    mgmt = Management(client, "rt/Subscriptions/cfg")
    answer = mgmt.request("enumerate-rules", {"top": 100, "skip": 0})
    listed = {
        r["rule-description"].value[2]: r["rule-description"].value for r in answer.body["rules"]
    }
    assert set(listed) == {"sql-filter-1", "corr"}  # no $Default: the file gave rules
    flt, action = listed["sql-filter-1"][:2]
    assert (flt.descriptor, flt.value) == (
        SQL_FILTER,
        ["sys.MessageId = '123456' AND userProp1 = 'v'", 20],
    )
    assert (action.descriptor, action.value) == (SQL_RULE_ACTION, ["SET sys.To = 'Entity'", 20])
    flt = listed["corr"][0]
    assert flt.value == [None] * 7 + ["application/json", {"prop1": "value1"}]


def test_rule_operations_on_a_queue_are_not_allowed(client):
    mgmt = Management(client, "q")
    answer = mgmt.request("enumerate-rules", {"top": 10, "skip": 0})
    assert status(answer) == 400
    assert answer.properties["errorCondition"] == symbol("amqp:not-allowed")


def test_rules_changed_through_one_process_route_messages_sent_through_another(busd, client):
    mgmt = Management(client, "rt/Subscriptions/s5")
    assert status(mgmt.request("remove-rule", {"rule-name": "$Default"})) == 200
    assert status(mgmt.request("add-rule", sql_rule("red", "color = 'red'"))) == 200
    assert status(mgmt.request("add-rule", sql_rule("big", "n > 10", "SET big = TRUE"))) == 200
    assert status(mgmt.request("add-rule", sql_rule("bad", "color = 'red' OR"))) == 400
    # the other process lists the change as soon as the store announced it
    with ProtonCbsClient(busd.other.port) as other_client:
        other = Management(other_client, "rt/Subscriptions/s5")
        deadline = time.monotonic() + 10
        while (listed := names(other.request("enumerate-rules", {"top": 10, "skip": 0}))) != [
            "red",
            "big",
        ] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listed == ["red", "big"]
    sent = [("red", 1), ("blue", 2), ("red", 20), ("blue", 30)]
    with ServiceBusClient.from_connection_string(busd.other.connection_string) as sdk:
        with sdk.get_topic_sender("rt") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(
                        f"{color}-{n}", application_properties={"color": color, "n": n}
                    )
                    for color, n in sent
                ]
            )
        got = []
        with sdk.get_subscription_receiver("rt", "s5", max_wait_time=3) as receiver:
            while len(got) < 5:
                batch = receiver.receive_messages(max_message_count=10, max_wait_time=3)
                if not batch:
                    break
                for message in batch:
                    props = message.application_properties
                    got.append(
                        (str(message), (props.get(b"RuleName") or b"").decode(), props.get(b"big"))
                    )
                    receiver.complete_message(message)
    # red ones once each (plain), n > 10 ones once more each with the action applied
    assert sorted(got) == sorted(
        [
            ("red-1", "", None),
            ("red-20", "", None),
            ("red-20", "big", True),
            ("blue-30", "big", True),
        ]
    )
