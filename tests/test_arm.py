"""`busd config import`: ARM templates, written from the Service Bus resource schema, converted
to the entities file; what busd cannot honour refused in one line naming the resource and the
property, with nothing written. (tests/e2e/test_topology.py serves what it converts.)"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from busd.cli.main import cli
from busd.config.arm import convert
from busd.config.arm_expressions import TemplateError
from busd.config.entities_file import load_entities
from busd.errors import EXIT_INVALID

TEMPLATES = Path(__file__).resolve().parent / "data" / "arm"
TEMPLATE = TEMPLATES / "orders.json"
# as the portal's "Export template" writes a Standard namespace: every property at its value,
# a networkRuleSets `default`, the namespace's geoDataReplication
PORTAL_EXPORT = TEMPLATES / "portal-export.json"
# the Azure docs' quickstart "Create a Service Bus namespace and queue using an ARM template"
QUICKSTART = TEMPLATES / "servicebus-create-queue.json"
NS = "Microsoft.ServiceBus/namespaces"
API = "2022-10-01-preview"


def template(*resources: dict, parameters: dict | None = None, variables: dict | None = None):
    return {
        "$schema": "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#",
        "contentVersion": "1.0.0.0",
        "parameters": parameters or {},
        "variables": variables or {},
        "resources": list(resources),
    }


def namespace(name: str = "ns", *children: dict, **properties) -> dict:
    return {
        "type": NS,
        "apiVersion": API,
        "name": name,
        "location": "[resourceGroup().location]",
        "sku": {"name": "Standard"},
        "properties": properties,
        "resources": list(children),
    }


def child(kind: str, name: str, *children: dict, **properties) -> dict:
    out = {"type": kind, "apiVersion": API, "name": name, "properties": properties}
    if children:
        out["resources"] = list(children)
    return out


def entities(document: dict) -> dict:
    (ns,) = document["UserConfig"]["Namespaces"]
    return ns


def run_import(tmp_path: Path, document: dict, *args: str):
    source = tmp_path / "template.json"
    source.write_text(json.dumps(document))
    out = tmp_path / "Config.json"
    result = CliRunner().invoke(
        cli, ["config", "import", str(source), "-o", str(out), *args], prog_name="busd"
    )
    assert "Traceback" not in result.output, result.output
    return result, out


def test_the_sample_template_converts_to_a_file_busd_reads(tmp_path):
    result = CliRunner().invoke(
        cli,
        ["config", "import", str(TEMPLATE), "-o", str(tmp_path / "c.json"), "--key", "sender=a2V5"],
        prog_name="busd",
    )
    assert result.exit_code == 0, result.output
    found = load_entities(tmp_path / "c.json")
    queues = {q.name: q for q in found.queues}
    assert sorted(queues) == ["audit-eu", "audit-us", "dev-orders", "dev-payments"]
    orders = queues["dev-orders"]
    assert (orders.lock_duration_ms, orders.max_delivery_count, orders.requires_session) == (
        45_000,
        5,
        True,
    )
    assert orders.forward_dead_lettered_to == "dev-payments"
    assert orders.duplicate_detection_window_ms == 300_000
    assert [t.name for t in found.topics] == ["events"]
    assert sorted(s.name for s in found.subscriptions) == ["red", "sessions"]
    assert (found.keys["sender"], found.keys["sender"].claims) == ("a2V5", {"Send"})


def test_parameters_from_the_command_line_and_a_parameters_file(tmp_path):
    params = tmp_path / "params.json"
    params.write_text(
        json.dumps(
            {
                "$schema": "https://schema.management.azure.com/schemas/2019-04-01/deploymentParameters.json#",
                "contentVersion": "1.0.0.0",
                "parameters": {
                    "environment": {"value": "Prod"},
                    "maxDeliveryCount": {"value": 9},
                    "auditQueues": {"value": ["audit-apac"]},
                },
            }
        )
    )
    result = CliRunner().invoke(
        cli,
        [
            "config",
            "import",
            str(TEMPLATE),
            "--parameters",
            str(params),
            "-p",
            "maxDeliveryCount=12",
            "-p",
            "sessionsEnabled=false",
        ],
        prog_name="busd",
    )
    assert result.exit_code == 0, result.output
    ns = entities(json.loads(result.stdout))
    queues = {q["Name"]: q["Properties"] for q in ns["Queues"]}
    assert sorted(queues) == ["audit-apac", "prod-orders", "prod-payments"]
    assert queues["prod-orders"]["MaxDeliveryCount"] == 12  # --parameter wins over the file
    assert queues["prod-orders"]["RequiresSession"] is False
    assert queues["prod-payments"]["MaxDeliveryCount"] == 20  # if(isProd, 20, 3)
    # the namespace rule's key is made, and said so
    assert "give --key sender=KEY to choose it" in result.stderr


def test_nested_and_top_level_resources_convert_alike():
    nested = template(
        namespace(
            "ns",
            child(
                "topics",
                "t",
                child(
                    "subscriptions",
                    "s",
                    child(
                        "rules",
                        "r",
                        filterType="CorrelationFilter",
                        correlationFilter={"sessionId": "a", "properties": {"k": 1}},
                    ),
                    lockDuration="PT10S",
                ),
            ),
            child("queues", "q", requiresSession=True),
        )
    )
    flat = template(
        namespace("ns"),
        {
            "type": f"{NS}/queues",
            "apiVersion": API,
            "name": "ns/q",
            "properties": {"requiresSession": True},
        },
        {
            "type": f"{NS}/topics/subscriptions/rules",
            "apiVersion": API,
            "name": "ns/t/s/r",
            "properties": {
                "filterType": "CorrelationFilter",
                "correlationFilter": {"sessionId": "a", "properties": {"k": 1}},
            },
        },
        {
            "type": f"{NS}/topics/subscriptions",
            "apiVersion": API,
            "name": "ns/t/s",
            "properties": {"lockDuration": "PT10S"},
        },
        {"type": f"{NS}/topics", "apiVersion": API, "name": "ns/t", "properties": {}},
    )
    assert convert(nested).document == convert(flat).document
    ns = entities(convert(nested).document)
    (sub,) = ns["Topics"][0]["Subscriptions"]
    assert sub["Rules"] == [
        {
            "Name": "$Default",
            "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}},
        },
        {
            "Name": "r",
            "Properties": {
                "FilterType": "Correlation",
                "CorrelationFilter": {"SessionId": "a", "Properties": {"k": 1}},
            },
        },
    ]


def test_template_functions():
    document = template(
        namespace(
            "[parameters('ns')]",
            child("queues", "[format('{0}-{1}', variables('prefix'), string(parameters('n')))]"),
            child("queues", "[toLower(concat(variables('prefix'), '-', 'UPPER'))]"),
            child(
                "queues",
                "[concat('loop-', string(copyIndex(1)))]",
                maxDeliveryCount="[int('7')]",
                requiresSession="[bool('true')]",
                lockDuration="[if(not(equals(parameters('n'), 3)), 'PT5S', 'PT9S')]",
            )
            | {"copy": {"name": "loop", "count": 2}},
            child("queues", "[[literal]", condition="ignored")
            | {"condition": "[equals(length(variables('list')), 3)]"},
        ),
        parameters={
            "ns": {"type": "string", "defaultValue": "NS1"},
            "n": {"type": "int", "defaultValue": 3},
            "location": {"type": "string", "defaultValue": "[resourceGroup().location]"},
        },
        variables={"prefix": "[toLower('App')]", "list": "[createArray(1, 2)]"},
    )
    ns = entities(convert(document).document)
    assert ns["Name"] == "NS1"
    queues = {q["Name"]: q["Properties"] for q in ns["Queues"]}
    assert sorted(queues) == ["app-3", "app-upper", "loop-1", "loop-2"]  # condition false
    assert queues["loop-2"] == {
        "MaxDeliveryCount": 7,
        "RequiresSession": True,
        "LockDuration": "PT9S",
    }


@pytest.mark.parametrize(
    "document, message",
    [
        (
            template(namespace("[concat('sb-', uniqueString(resourceGroup().id))]")),
            "resource \"[concat('sb-', uniqueString(resourceGroup().id))]\": name: function "
            "uniqueString() cannot be evaluated offline (its value is a hash Azure computes "
            "from the deployment): give the value as a parameter instead",
        ),
        (
            template(namespace("ns", child("queues", "q", requiresSesion=True))),
            "Microsoft.ServiceBus/namespaces/queues 'ns/q': property 'requiresSesion': not a "
            "queue property busd serves",
        ),
        (
            template(namespace("ns", child("topics", "t", lockDuration="PT1M"))),
            "Microsoft.ServiceBus/namespaces/topics 'ns/t': property 'lockDuration': not one "
            "of a topic (only queues and subscriptions have it)",
        ),
        (
            template(namespace("ns", child("queues", "q", lockDuration="PT10M"))),
            "Microsoft.ServiceBus/namespaces/queues 'ns/q': property 'lockDuration': "
            "LockDuration must be 1 second to 5 minutes (e.g. PT30S or PT5M), got PT10M",
        ),
        (
            template(
                namespace(
                    "ns",
                    child("topics", "t", child("subscriptions", "s", isClientAffine=True)),
                )
            ),
            "Microsoft.ServiceBus/namespaces/topics/subscriptions 'ns/t/s': property "
            "'isClientAffine' (Premium's JMS shared subscriptions) cannot be honoured: busd "
            "serves AMQP clients of Service Bus's SDKs",
        ),
        (
            template(namespace("ns", disableLocalAuth=True)),
            "Microsoft.ServiceBus/namespaces 'ns': property 'disableLocalAuth' true cannot be "
            "honoured: busd authenticates with shared access keys only",
        ),
        (
            template(namespace("ns", child("frobnicators", "default"))),
            "Microsoft.ServiceBus/namespaces/frobnicators 'ns/default': busd cannot serve "
            "this kind of resource (it serves namespaces, queues, topics, subscriptions, rules "
            "and authorization rules)",
        ),
        (
            template(namespace("ns", geoDataReplicaton={"locations": []})),
            "Microsoft.ServiceBus/namespaces 'ns': property 'geoDataReplicaton' is not one busd "
            "can serve for a namespace",
        ),
        (
            template(
                namespace(
                    "ns",
                    child(
                        "topics",
                        "t",
                        child("subscriptions", "s", child("rules", "r", filterType="TrueFilter")),
                    ),
                )
            ),
            "Microsoft.ServiceBus/namespaces/topics/subscriptions/rules 'ns/t/s/r': property "
            "'filterType' is 'TrueFilter': SqlFilter or CorrelationFilter",
        ),
        (
            template(
                namespace(
                    "ns",
                    child(
                        "topics",
                        "t",
                        child(
                            "subscriptions",
                            "s",
                            child(
                                "rules",
                                "r",
                                filterType="SqlFilter",
                                sqlFilter={"sqlExpression": "color = "},
                            ),
                        ),
                    ),
                )
            ),
            "the converted template would not be served: subscription 's' of topic 't': rule",
        ),
        (
            template(namespace("[parameters('ns')]"), parameters={"ns": {"type": "string"}}),
            "parameter 'ns' has no defaultValue: give --parameter ns=…",
        ),
        (
            template(namespace("[mynamespace.name()]")),
            "resource '[mynamespace.name()]': name: function mynamespace.name(): user-defined "
            "template functions are not supported",
        ),
        (
            template(namespace("[parameters('missing')]")),
            "resource \"[parameters('missing')]\": name: parameters('missing'): the template "
            "declares no such parameter",
        ),
        (
            template(namespace("ns", child("queues", "q", forwardTo="elsewhere"))),
            "the converted template would not be served: queue 'q': ForwardTo 'elsewhere' names "
            "no queue or topic of this file",
        ),
        (
            template(namespace("ns", child("AuthorizationRules", "admin", rights=["Manage"]))),
            "Microsoft.ServiceBus/namespaces/AuthorizationRules 'ns/admin': property 'rights': "
            "Manage needs Send and Listen too, as Azure requires",
        ),
        (
            template(
                namespace("ns"),
                {"type": f"{NS}/topics/subscriptions", "apiVersion": API, "name": "ns/t/s"},
            ),
            "Microsoft.ServiceBus/namespaces/topics/subscriptions 'ns/t/s': its topic 't' is "
            "not declared in the template",
        ),
    ],
)
def test_what_cannot_be_mapped_is_refused_in_one_line(tmp_path, document, message):
    result, out = run_import(tmp_path, document)
    assert result.exit_code == EXIT_INVALID, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"busd: error: {tmp_path / 'template.json'}: {message}"), line
    assert not out.exists()


def test_an_unknown_parameter_and_bad_json_are_refused(tmp_path):
    result, _ = run_import(tmp_path, template(namespace()), "-p", "nope=1")
    assert result.exit_code == EXIT_INVALID
    assert "--parameter nope: the template declares no such parameter" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    result = CliRunner().invoke(cli, ["config", "import", str(bad)], prog_name="busd")
    assert result.exit_code == EXIT_INVALID
    assert result.stderr.startswith("busd: error: not a JSON template or parameters file")


def test_root_key_is_left_to_busd_unless_given():
    document = template(
        namespace(
            "ns",
            child(
                "AuthorizationRules",
                "RootManageSharedAccessKey",
                rights=["Listen", "Send", "Manage"],
            ),
        )
    )
    converted = convert(document)
    assert "SharedAccessKeys" not in entities(converted.document)
    assert any("left to busd's own RootManageSharedAccessKey" in n for n in converted.notes)
    given = convert(document, keys={"RootManageSharedAccessKey": "c2VjcmV0"})
    assert entities(given.document)["SharedAccessKeys"] == [
        {
            "KeyName": "RootManageSharedAccessKey",
            "Key": "c2VjcmV0",
            "Rights": ["Listen", "Send", "Manage"],
        }
    ]
    with pytest.raises(TemplateError, match="--key other: the template declares no such"):
        convert(document, keys={"other": "x"})


def test_symbolic_resources_and_other_providers_children():
    """languageVersion 2.0 names resources by symbol; a resource of another provider, nested
    or not, is left out unevaluated (its name may use uniqueString())."""
    document = template()
    document["languageVersion"] = "2.0"
    document["resources"] = {
        "ns": namespace(
            "ns",
            child("queues", "q"),
            child("Microsoft.Insights/diagnosticSettings", "[uniqueString('x')]"),
        ),
        "store": {
            "type": "Microsoft.Storage/storageAccounts",
            "name": "[concat('st', uniqueString(resourceGroup().id))]",
            "copy": {"name": "c", "count": "[parameters('unset')]"},
        },
    }
    converted = convert(document)
    assert [q["Name"] for q in entities(converted.document)["Queues"]] == ["q"]
    assert len([n for n in converted.notes if n.startswith("left out Microsoft.")]) == 2


# --- hostile and malformed templates: exit 65, one line, bounded work ---------------------------


def deep(levels: int) -> str:
    """An expression of `levels` nested calls."""
    return "[" + "concat(" * levels + "'a'" + ")" * levels + "]"


def rule_with(**properties) -> dict:
    return namespace(
        "ns",
        child(
            "topics",
            "t",
            child("subscriptions", "s", child("rules", "r", **properties)),
        ),
    )


def copies(count) -> dict:
    return {
        **child("queues", "[concat('q', copyIndex())]"),
        "copy": {"name": "qs", "count": count},
    }


GROW = "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (template(namespace("ns", copies(801))), "copy count 801 is more than Azure's 800"),
        (template(namespace("ns", copies(10**9))), "copy count 1000000000"),
        (
            template(namespace("ns", child("queues", "q", userMetadata="x" * 1025))),
            "UserMetadata must be at most 1024 characters, got 1025",
        ),
        (template(namespace("ns", child("queues", deep(5000)))), "nests"),
        (
            template(namespace("ns", child("queues", "q", userMetadata=[[[[]]]] * 2 + [1]))),
            "UserMetadata must be a string",
        ),
        (
            template(
                namespace("ns", child("queues", "[variables('v0')]")),
                variables={
                    **{f"v{i}": f"[variables('v{i + 1}')]" for i in range(5000)},
                    "v5000": "q",
                },
            ),
            "too deeply",
        ),
        (
            # each replace() multiplies the text by 64: the fourth would make gigabytes
            template(
                namespace(
                    "ns",
                    child(
                        "queues",
                        f"[replace(replace(replace(replace({GROW}, 'a', {GROW}), 'a', {GROW}),"
                        f" 'a', {GROW}), 'a', {GROW})]",
                    ),
                )
            ),
            "more than 65536 characters",
        ),
        (
            template(
                namespace("ns", child("queues", "[format('" + "{0}" * 20 + "', variables('v'))]")),
                variables={"v": f"[replace({GROW}, 'a', {GROW})]"},  # 4,096 characters
            ),
            "format() makes a text of more than 65536 characters",
        ),
        (
            template(rule_with(sqlFilter={"sqlExpression": "1=1"}, action={"sqlExpression": 5})),
            "'action.sqlExpression' must be a string",
        ),
        (template(namespace("ns", child("queues", "q", lockDuration=[1]))), "LockDuration"),
        (template(namespace("ns", {**child("queues", "q"), "copy": [1]})), "copy needs"),
        (template(namespace("ns", child("queues", "[concat(]"))), "expression"),
        (template(namespace("ns", child("queues", "[parameters(1)]"))), "parameters("),
    ],
)
def test_hostile_templates_are_refused_in_one_line(tmp_path, document, message):
    result, out = run_import(tmp_path, document)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == EXIT_INVALID, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("busd: error:"), result.output
    if message is not None:
        assert message in lines[0]
    assert not out.exists()


def test_a_template_nested_too_deeply_to_read_is_refused_in_one_line(tmp_path):
    source = tmp_path / "template.json"
    source.write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(cli, ["config", "import", str(source)], prog_name="busd")
    assert result.exit_code == EXIT_INVALID, (result.output, result.exception)
    assert result.output.strip().count("\n") == 0 and "too deeply" in result.output


def test_a_copy_loop_of_800_is_azure_s_most_and_converts(tmp_path):
    result, out = run_import(tmp_path, template(namespace("ns", copies(800))))
    assert result.exit_code == 0, result.output
    assert len(entities(json.loads(out.read_text()))["Queues"]) == 800


def test_mutated_templates_are_converted_or_refused_by_name():
    """A seeded fuzz of the sample template: wrong types, missing members, broken
    expressions put anywhere; each converts or is refused with a TemplateError, nothing else."""
    values = [None, 0, -1, 2**70, 1.5, True, "", "[", "[concat(", "[parameters(1)]",
              "[variables('nope')]", "[copyIndex('x')]", "[int('x')]", "[length(1)]",
              "[format('{9}', 1)]", "[if(true)]", "[createArray(1)[7]]", "[toLower(1)]",
              "[replace('a')]", "['a'.b]", "[empty(1)]", [], {}, [[1]], {"count": 900},
              {"name": "l", "count": "[int('x')]"}, "PT-1S", "x" * 2000]  # fmt: skip
    rng = random.Random(46)
    base = json.loads(TEMPLATE.read_text())

    def mutate(node) -> None:
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
            roll = rng.random()
            if roll < 0.3:
                node[key] = rng.choice(values)
            elif roll < 0.4:
                del node[key]
            elif roll < 0.5:
                extra = rng.choice(["copy", "condition", "properties", "resources", "type", "x"])
                node[extra] = rng.choice(values)
            else:
                mutate(node[key])
        elif isinstance(node, list) and node:
            index = rng.randrange(len(node))
            if rng.random() < 0.3:
                node[index] = rng.choice(values)
            else:
                mutate(node[index])

    refused = 0
    for _ in range(400):
        document = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            mutate(document)
        try:
            convert(document, {}, {"sender": "a2V5"})
        except TemplateError:
            refused += 1
    assert 0 < refused < 400


# --- templates as Azure writes them ------------------------------------------------------------


def test_a_portal_export_imports_with_one_note_per_skipped_resource_and_serves_without_warnings(
    tmp_path,
):
    out = tmp_path / "Config.json"
    result = CliRunner().invoke(
        cli, ["config", "import", str(PORTAL_EXPORT), "-o", str(out)], prog_name="busd"
    )
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert skipped == [
        "busd: note: skipped Microsoft.ServiceBus/namespaces/networkrulesets "
        "'contoso-orders/default': network access rules: busd serves whoever reaches its ports "
        "(--host)"
    ]
    found = load_entities(out)
    assert [q.name for q in found.queues] == ["orders"]
    assert found.queues[0].requires_session is True
    assert [s.path for s in found.subscriptions] == ["events/subscriptions/audit"]
    # every kept-only property is at Azure's default: busd serve has nothing to warn of
    assert found.warnings == []


def test_a_kept_only_property_off_azure_s_default_still_warns(tmp_path):
    document = json.loads(PORTAL_EXPORT.read_text())
    queue = next(r for r in document["resources"] if r["type"].endswith("/queues"))
    queue["properties"] |= {"maxSizeInMegabytes": 5120, "status": "SendDisabled"}
    out = tmp_path / "Config.json"
    out.write_text(json.dumps(convert(document).document))
    assert load_entities(out).warnings == [
        f"queue 'orders': property {name!r} is kept and answered back by the management API, "
        "but busd does not act on it"
        for name in ("MaxSizeInMegabytes", "Status")
    ]


def test_the_azure_docs_quickstart_template_imports_as_is(tmp_path):
    out = tmp_path / "Config.json"
    result = CliRunner().invoke(
        cli,
        [
            "config", "import", str(QUICKSTART), "-o", str(out),
            "-p", "serviceBusNamespaceName=sb-quickstart", "-p", "serviceBusQueueName=orders",
        ],
        prog_name="busd",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    found = load_entities(out)
    (queue,) = found.queues
    assert (queue.name, queue.lock_duration_ms, queue.max_delivery_count) == ("orders", 300_000, 10)
    assert queue.default_ttl_ms is None  # TimeSpan.MaxValue: messages live until received
    assert found.warnings == []


@pytest.mark.parametrize(
    "resource, what",
    [
        (child("networkRuleSets", "default", defaultAction="Deny", ipRules=[]), "network"),
        (child("ipfilterrules", "office", ipMask="10.0.0.0/8", action="Accept"), "network"),
        (child("virtualnetworkrules", "subnet", virtualNetworkSubnetId="x"), "network"),
        (child("privateEndpointConnections", "pe", privateEndpoint={"id": "x"}), "network"),
        (
            child(
                "disasterRecoveryConfigs",
                "alias",
                child("authorizationRules", "RootManageSharedAccessKey", rights=["Listen"]),
                partnerNamespace="x",
            ),
            "Geo-DR",
        ),
        (child("migrationConfigurations", "$default", targetNamespace="x"), "migration"),
    ],
)
def test_resources_that_change_no_entity_or_key_are_skipped_with_a_note(resource, what):
    converted = convert(template(namespace("ns", resource, child("queues", "q"))))
    assert [q["Name"] for q in entities(converted.document)["Queues"]] == ["q"]
    (note,) = converted.notes
    assert note.startswith(f"skipped Microsoft.ServiceBus/namespaces/{resource['type']} 'ns/")
    assert what in note
