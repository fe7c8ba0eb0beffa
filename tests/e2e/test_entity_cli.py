"""`busd queue|topic|subscription|rule ...`: entities created, changed, shown and deleted over
the management API, checked with the official SDK."""

from __future__ import annotations

import json

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from click.testing import CliRunner

from busd.cli.main import cli
from busd.errors import EXIT_EXISTS, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNAVAILABLE
from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("cli-file-queue")])


def tool(busd, *args: str, https: bool = False):
    url = f"https://localhost:{busd.http_port}" if https else busd.http_url
    extra = ["--cacert", busd.cert_path] if https else []
    result = CliRunner().invoke(cli, [*args, "--url", url, *extra], prog_name="busd")
    assert "Traceback" not in result.output, result.output
    return result


def test_queue_create_show_update_delete(busd):
    result = tool(
        busd,
        "queue",
        "create",
        "cli-q",
        "--requires-session",
        "--lock-duration",
        "PT20S",
        "--max-delivery-count",
        "3",
        "--json",
    )
    assert result.exit_code == 0, result.output
    created = json.loads(result.stdout)
    assert (
        created["name"],
        created["RequiresSession"],
        created["LockDuration"],
        created["MaxDeliveryCount"],
    ) == ("cli-q", "true", "PT20S", "3")

    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("cli-q") as sender:
            sender.send_messages(ServiceBusMessage("x", session_id="s"))
        with client.get_queue_receiver("cli-q", session_id="s") as receiver:
            (message,) = receive(receiver, 1)
            receiver.complete_message(message)

    again = tool(busd, "queue", "create", "cli-q")
    assert again.exit_code == EXIT_EXISTS and "exists" in again.output
    result = tool(busd, "queue", "update", "cli-q", "--max-delivery-count", "8", https=True)
    assert result.exit_code == 0, result.output
    assert "Queue cli-q updated" in result.output
    shown = tool(busd, "queue", "show", "cli-q")
    assert shown.exit_code == 0
    lines = {line.split()[0]: line.split()[1:] for line in shown.output.splitlines()[2:]}
    assert lines["MaxDeliveryCount"] == ["8"] and lines["RequiresSession"] == ["true"]
    assert lines["CountDetails"][0].startswith("ActiveMessageCount=0")

    with ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    ) as admin:
        assert admin.get_queue("cli-q").max_delivery_count == 8

    assert tool(busd, "queue", "delete", "cli-q").exit_code == 0
    missing = tool(busd, "queue", "show", "cli-q")
    assert missing.exit_code == EXIT_NOT_FOUND
    assert tool(busd, "queue", "delete", "cli-q").exit_code == EXIT_NOT_FOUND


def test_topic_subscription_and_rules(busd):
    assert tool(busd, "topic", "create", "cli-t", "--default-ttl", "PT1H").exit_code == 0
    result = tool(busd, "subscription", "create", "cli-t", "s1", "--max-delivery-count", "2")
    assert result.exit_code == 0, result.output
    assert tool(busd, "subscription", "create", "nosuch-t", "s1").exit_code == EXIT_NOT_FOUND
    result = tool(
        busd,
        "rule",
        "create",
        "cli-t",
        "s1",
        "red",
        "--sql",
        "color = 'red'",
        "--action",
        "SET seen = 1",
    )
    assert result.exit_code == 0, result.output
    result = tool(
        busd,
        "rule",
        "create",
        "cli-t",
        "s1",
        "mine",
        "--correlation",
        "session-id=abc",
        "--correlation",
        "kind=blue",
    )
    assert result.exit_code == 0, result.output
    listed = json.loads(tool(busd, "rule", "list", "cli-t", "s1", "--json").stdout)
    by_name = {r["name"]: r for r in listed}
    assert set(by_name) == {"$Default", "red", "mine"}
    assert by_name["red"] == {
        "name": "red",
        "filter_type": "SqlFilter",
        "filter": "color = 'red'",
        "action": "SET seen = 1",
    }
    assert by_name["mine"]["filter_type"] == "CorrelationFilter"
    assert "SessionId=abc" in by_name["mine"]["filter"]
    table = tool(busd, "rule", "list", "cli-t", "s1").output
    assert table.splitlines()[0].split() == ["RULE", "FILTER-TYPE", "FILTER", "ACTION"]
    assert tool(busd, "rule", "delete", "cli-t", "s1", "red").exit_code == 0
    assert tool(busd, "rule", "delete", "cli-t", "s1", "red").exit_code == EXIT_NOT_FOUND
    assert tool(busd, "subscription", "show", "cli-t", "s1").exit_code == 0
    assert tool(busd, "subscription", "delete", "cli-t", "s1").exit_code == 0
    assert tool(busd, "topic", "delete", "cli-t").exit_code == 0


def test_a_name_with_a_tilde(busd):
    result = tool(busd, "queue", "create", "Cli~Q", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "cli~q"
    assert tool(busd, "queue", "show", "cli~q").exit_code == 0


def test_the_key_is_read_as_the_other_tools_read_it_rights_and_all(busd, monkeypatch):
    """BUSD_SAS_KEY is NAME=KEY[:RIGHTS], several separated by spaces: the entity commands
    sign with the key itself (not `KEY:RIGHTS`) of the first key holding Manage."""
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey=SAS_KEY_VALUE:Manage")
    result = tool(busd, "queue", "show", "cli-file-queue")
    assert result.exit_code == 0, result.output
    monkeypatch.setenv(
        "BUSD_SAS_KEY",
        "reader=other:Listen RootManageSharedAccessKey=SAS_KEY_VALUE:Manage,Send,Listen",
    )
    result = tool(busd, "queue", "show", "cli-file-queue")
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey")
    result = tool(busd, "queue", "show", "cli-file-queue")
    assert result.exit_code == EXIT_INVALID and "BUSD_SAS_KEY" in result.output, result.output


def test_errors_are_one_line_with_exit_codes(busd, monkeypatch):
    bad = tool(busd, "queue", "create", "cli-bad", "--lock-duration", "P10D")
    assert bad.exit_code == EXIT_INVALID
    assert bad.output.startswith("busd: error: LockDuration") and len(bad.output.splitlines()) == 1
    monkeypatch.setenv("BUSD_SAS_KEY", "RootManageSharedAccessKey=WRONG")
    assert tool(busd, "queue", "show", "cli-file-queue").exit_code == EXIT_INVALID
    monkeypatch.delenv("BUSD_SAS_KEY")
    result = CliRunner().invoke(cli, ["queue", "show", "x", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == EXIT_UNAVAILABLE
