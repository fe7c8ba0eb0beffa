"""`busd config import` and `busd config export` against real busd processes: an ARM template
written from the Service Bus resource schema becomes an entities file that busd serves with
the template's properties, rules and keys; a running namespace exported, served from the
export and exported again gives the same file."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import (
    CorrelationRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)
from click.testing import CliRunner

from busd.cli.main import cli
from busd.errors import EXIT_INVALID
from tests.e2e.conftest import launch_busd, queue, receive, subscription, topic

pytestmark = pytest.mark.timeout(120)

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "arm" / "orders.json"
SENDER_KEY = base64.b64encode(b"topology-sender-key-0123456789ab").decode()


def run(*args: str, env: dict | None = None):
    result = CliRunner().invoke(cli, list(args), prog_name="busd", env=env)
    assert "Traceback" not in result.output, result.output
    return result


def export(busd, path: Path, env: dict | None = None) -> dict:
    result = run("config", "export", "--url", busd.http_url, "-o", str(path), env=env)
    assert result.exit_code == 0, result.output
    return json.loads(path.read_text())


def admin(busd, key_name: str = "RootManageSharedAccessKey") -> ServiceBusAdministrationClient:
    text = busd.admin_connection_string.replace("RootManageSharedAccessKey", key_name)
    return ServiceBusAdministrationClient.from_connection_string(
        text, connection_verify=busd.cert_path
    )


# --- import -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported(redis_url, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("topology-import")
    out = workdir / "Config.json"
    result = run("config", "import", str(TEMPLATE), "--key", f"sender={SENDER_KEY}", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "left out Microsoft.Storage/storageAccounts" in result.stderr
    proc = launch_busd(redis_url, out, workdir, prefix=f"e2e-arm-{uuid.uuid4().hex[:8]}")
    yield proc
    proc.stop()


def test_an_imported_template_serves_its_entities_with_their_properties(imported):
    with admin(imported) as client:
        assert sorted(q.name for q in client.list_queues()) == [
            "audit-eu",
            "audit-us",
            "dev-orders",
            "dev-payments",
        ]
        orders = client.get_queue("dev-orders")
        assert orders.lock_duration == dt.timedelta(seconds=45)
        assert orders.requires_session is True
        assert orders.max_delivery_count == 5
        assert orders.requires_duplicate_detection is True
        assert orders.duplicate_detection_history_time_window == dt.timedelta(minutes=5)
        assert orders.default_message_time_to_live == dt.timedelta(days=14)
        assert orders.dead_lettering_on_message_expiration is True
        assert orders.forward_dead_lettered_messages_to.endswith("/dev-payments")
        payments = client.get_queue("dev-payments")
        assert payments.max_delivery_count == 3  # if(isProd, 20, 3) with the default Dev
        (rule,) = payments.authorization_rules
        assert (rule.key_name, rule.rights) == ("payments-listener", ["Listen"])
        assert client.get_queue("audit-us").default_message_time_to_live == dt.timedelta(hours=1)
        assert client.get_topic("events").default_message_time_to_live == dt.timedelta(days=1)
        red = client.get_subscription("events", "red")
        assert (red.lock_duration, red.max_delivery_count) == (dt.timedelta(seconds=30), 7)
        assert client.get_subscription("events", "sessions").requires_session is True
        # a rule named $Default replaces it; others stand beside it, as on Azure
        (default,) = client.list_rules("events", "red")
        assert (default.name, default.filter.sql_expression) == ("$Default", "color = 'red'")
        assert default.action.sql_expression == "SET seen = 'yes'"
        rules = {r.name: r for r in client.list_rules("events", "sessions")}
        assert sorted(rules) == ["$Default", "by-subject"]
        assert rules["by-subject"].filter.label == "shipped"
        assert rules["by-subject"].filter.properties == {"region": "eu"}


def test_an_imported_rule_filters_as_written_and_its_namespace_key_signs(imported):
    sender_string = imported.connection_string.replace(
        "SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE",
        f"SharedAccessKeyName=sender;SharedAccessKey={SENDER_KEY}",
    )
    with ServiceBusClient.from_connection_string(sender_string) as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("blue", application_properties={"color": "blue"}),
                    ServiceBusMessage("red", application_properties={"color": "red"}),
                ]
            )
    with ServiceBusClient.from_connection_string(imported.connection_string) as client:
        with client.get_subscription_receiver("events", "red", max_wait_time=3) as rx:
            got = receive(rx, 1, wait=2, patience=6)
            assert [str(m) for m in got] == ["red"]
            assert got[0].application_properties[b"seen"] == b"yes"
            rx.complete_message(got[0])
            assert receive(rx, 1, wait=1, patience=2) == []


# --- export -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def running(busd_factory):
    proc = busd_factory(
        [
            queue(
                "rt-orders",
                RequiresSession=True,
                LockDuration="PT20S",
                MaxDeliveryCount=4,
                ForwardDeadLetteredMessagesTo="rt-dlq",
            ),
            queue(
                "rt-dlq",
                DefaultMessageTimeToLive="P2D",
                DeadLetterSessionOnMaxDeliveryCount=True,
                AuthorizationRules=[{"KeyName": "reader", "Rights": ["Listen"]}],
            ),
            queue("rt-parts", EnablePartitioning=True, PartitionCount=4),
        ],
        topics=[
            topic(
                "rt-events",
                [
                    subscription("all"),
                    subscription(
                        "red",
                        rules=[
                            {
                                "Name": "red-only",
                                "Properties": {
                                    "FilterType": "Sql",
                                    "SqlFilter": {"SqlExpression": "color = 'red'"},
                                    "Action": {"SqlExpression": "SET routed = 'yes'"},
                                },
                            }
                        ],
                        MaxDeliveryCount=3,
                    ),
                    subscription(
                        "corr",
                        rules=[
                            {
                                "Name": "eu",
                                "Properties": {
                                    "FilterType": "Correlation",
                                    "CorrelationFilter": {
                                        "Label": "shipped",
                                        "Properties": {"region": "eu", "priority": 2},
                                    },
                                },
                            }
                        ],
                    ),
                ],
                RequiresDuplicateDetection=True,
            )
        ],
    )
    # and entities made at run time, which the file never named
    with admin(proc) as client:
        client.create_queue(
            "rt-runtime", max_delivery_count=2, lock_duration="PT15S", user_metadata="made live"
        )
        client.create_subscription("rt-events", "late", requires_session=True)
        client.create_rule("rt-events", "late", "big", filter=SqlRuleFilter("size > 10"))
        client.delete_rule("rt-events", "late", "$Default")
        client.create_subscription("rt-events", "none")
        client.delete_rule("rt-events", "none", "$Default")
    return proc


def test_export_writes_every_entity_property_and_rule(running, tmp_path):
    document = export(running, tmp_path / "export.json")
    (ns,) = document["UserConfig"]["Namespaces"]
    assert ns["Name"] == "sbemulatorns"
    queues = {q["Name"]: q["Properties"] for q in ns["Queues"]}
    assert sorted(queues) == ["rt-dlq", "rt-orders", "rt-parts", "rt-runtime"]
    assert queues["rt-orders"]["RequiresSession"] is True
    assert queues["rt-orders"]["LockDuration"] == "PT20S"
    assert queues["rt-orders"]["MaxDeliveryCount"] == 4
    assert queues["rt-orders"]["ForwardDeadLetteredMessagesTo"] == "rt-dlq"
    assert queues["rt-dlq"]["DefaultMessageTimeToLive"] == "P2D"
    assert queues["rt-dlq"]["DeadLetterSessionOnMaxDeliveryCount"] is True
    assert "DeadLetterSessionOnMaxDeliveryCount" not in queues["rt-orders"]  # a default
    (reader,) = queues["rt-dlq"]["AuthorizationRules"]
    assert sorted(reader) == ["KeyName", "PrimaryKey", "Rights", "SecondaryKey"]
    assert (reader["KeyName"], reader["Rights"]) == ("reader", ["Listen"])
    assert (queues["rt-parts"]["EnablePartitioning"], queues["rt-parts"]["PartitionCount"]) == (
        True,
        4,
    )
    assert queues["rt-runtime"]["UserMetadata"] == "made live"
    assert (queues["rt-runtime"]["MaxDeliveryCount"], queues["rt-runtime"]["LockDuration"]) == (
        2,
        "PT15S",
    )
    (events,) = ns["Topics"]
    assert events["Properties"]["RequiresDuplicateDetection"] is True
    subs = {s["Name"]: s for s in events["Subscriptions"]}
    assert sorted(subs) == ["all", "corr", "late", "none", "red"]
    assert "Rules" not in subs["all"]  # the lone $Default TrueFilter every subscription has
    assert subs["red"]["Rules"] == [
        {
            "Name": "red-only",
            "Properties": {
                "FilterType": "Sql",
                "SqlFilter": {"SqlExpression": "color = 'red'"},
                "Action": {"SqlExpression": "SET routed = 'yes'"},
            },
        }
    ]
    assert subs["corr"]["Rules"][0]["Properties"]["CorrelationFilter"] == {
        "Label": "shipped",
        "Properties": {"region": "eu", "priority": 2},
    }
    assert subs["late"]["Properties"]["RequiresSession"] is True
    assert [r["Name"] for r in subs["late"]["Rules"]] == ["big"]
    assert subs["none"]["Rules"] == [
        {
            "Name": "$Default",
            "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=0"}},
        }
    ]


def test_export_round_trips_through_busd_serve(running, redis_url, tmp_path):
    first = export(running, tmp_path / "first.json")
    served = launch_busd(
        redis_url, tmp_path / "first.json", tmp_path, prefix=f"e2e-rt-{uuid.uuid4().hex[:8]}"
    )
    try:
        second = export(served, tmp_path / "second.json")
        assert second == first
        # and the rules it serves route as the first busd's did
        with ServiceBusClient.from_connection_string(served.connection_string) as client:
            with client.get_topic_sender("rt-events") as sender:
                sender.send_messages(
                    [
                        ServiceBusMessage("blue", application_properties={"color": "blue"}),
                        ServiceBusMessage("red", application_properties={"color": "red"}),
                    ]
                )
            with client.get_subscription_receiver("rt-events", "red", max_wait_time=3) as rx:
                got = receive(rx, 1, wait=2, patience=6)
                assert [str(m) for m in got] == ["red"]
                assert got[0].application_properties[b"routed"] == b"yes"
                rx.complete_message(got[0])
            with client.get_subscription_receiver("rt-events", "none", max_wait_time=1) as rx:
                assert receive(rx, 1, wait=1, patience=2) == []
    finally:
        served.stop()


def test_export_of_a_namespace_names_it_and_refuses_what_the_file_cannot_hold(running, tmp_path):
    name = f"topo-{uuid.uuid4().hex[:8]}"
    env = {"BUSD_SAS_KEY": f"{name}/RootManageSharedAccessKey=SAS_KEY_VALUE"}
    with admin(running, f"{name}/RootManageSharedAccessKey") as client:
        client.create_topic("t")
        client.create_subscription("t", "s")
        client.create_rule("t", "s", "corr", filter=CorrelationRuleFilter(properties={"kind": "x"}))
        document = export(running, tmp_path / "ns.json", env=env)
        (ns,) = document["UserConfig"]["Namespaces"]
        assert (ns["Name"], ns["Queues"], [t["Name"] for t in ns["Topics"]]) == (name, [], ["t"])

        client.create_rule(
            "t",
            "s",
            "params",
            filter=SqlRuleFilter("size > @min", parameters={"@min": 5}),
            action=SqlRuleAction("SET a = 1"),
        )
        out = tmp_path / "refused.json"
        result = run("config", "export", "--url", running.http_url, "-o", str(out), env=env)
    assert result.exit_code == EXIT_INVALID
    assert result.stderr.strip().splitlines()[-1] == (
        "busd: error: rule t/s/params: its SQL filter has parameters, which the entities "
        "file (Config.json) cannot hold"
    )
    assert not out.exists()


def test_export_of_an_unreachable_busd_is_one_line(tmp_path):
    result = run("config", "export", "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "x"))
    assert result.exit_code == 69
    assert result.stderr.startswith("busd: error: cannot reach busd at http://127.0.0.1:9")
