"""Rules in their three forms: the store's JSON dict, the emulator's Config.json (the repository's
sample file included), and AMQP (`add-rule` maps in, `enumerate-rules` described lists
out), the AMQP side checked against independent encoders and decoders: the Python SDK's
pyamqp encoder for what comes in, proton's decoder for what goes out."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import proton
import pytest
from azure.servicebus._pyamqp._encode import encode_value as pyamqp_encode
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    SqlRuleFilter,
    TrueRuleFilter,
)
from azure.servicebus.management import (
    SqlRuleAction as SdkSqlRuleAction,
)

from busd.amqp.codec import Described, Timestamp, decode_value, encode_value
from busd.rules import (
    CorrelationFilter,
    FalseFilter,
    Rule,
    RuleError,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
    default_rule,
    rule_from_amqp,
    rule_from_config,
    rule_from_dict,
    rule_from_record,
    rule_record,
    rule_to_amqp,
    rule_to_dict,
)
from busd.rules.amqp import (
    CORRELATION_FILTER,
    EMPTY_RULE_ACTION,
    FALSE_FILTER,
    RULE_DESCRIPTION,
    SQL_FILTER,
    SQL_RULE_ACTION,
    TRUE_FILTER,
)

# The sample entities file, laid out as the emulator ships its Config.json (comments included).
SAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "config" / "Config.json"

RULES = [
    default_rule(1_700_000_000_000),
    Rule("f", FalseFilter()),
    Rule("sql", SqlFilter("color = @c AND n > 1", {"@c": "red"})),
    Rule(
        "corr",
        CorrelationFilter(
            correlation_id="c", subject="l", properties={"a": 1, "b": "x", "t": True}
        ),
    ),
    Rule("all", CorrelationFilter("c", "m", "t", "r", "l", "s", "rs", "ct", {"p": 2.5})),
    Rule("act", SqlFilter("n = 1"), SqlRuleAction("SET x = 1; REMOVE y"), 5),
    # date-times with and without a zone, time spans: in parameters and properties alike
    Rule(
        "dates",
        SqlFilter("sent > @since", {"@since": dt.datetime(2020, 7, 5, 11, 12, 13)}),
        SqlRuleAction("SET sys.TimeToLive = @ttl", {"@ttl": dt.timedelta(days=1, hours=2)}),
    ),
    Rule(
        "corr-dates",
        CorrelationFilter(
            properties={
                "at": dt.datetime(2020, 7, 5, tzinfo=dt.UTC),
                "span": dt.timedelta(microseconds=3),
            }
        ),
    ),
]


# --- the store's form ---------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_dict_round_trip_through_json(rule):
    data = json.loads(json.dumps(rule_to_dict(rule)))
    assert rule_from_dict(data) == rule


@pytest.mark.parametrize(
    "data,fragment",
    [
        ({"name": "x", "filter": {"type": "sql", "expression": "a ="}}, "position 4"),
        ({"name": "x", "filter": {"type": "nope"}}, "unknown filter type"),
        ({"name": "x"}, "no filter"),
        ({"name": "", "filter": {"type": "true"}}, "needs a name"),
        ({"name": "x", "filter": {"type": "true"}, "action": {"type": "x"}}, "unknown action"),
        ([], "JSON object"),
    ],
)
def test_bad_stored_rules(data, fragment):
    with pytest.raises(RuleError, match=fragment):
        rule_from_dict(data)


# --- Config.json --------------------------------------------------------------------------


def strip_json_comments(text: str) -> str:
    """`//` and `/* */` comments outside strings removed (the emulator's file has them)."""
    pattern = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', re.DOTALL)
    return pattern.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "", text)


def sample_rules() -> dict[str, list]:
    config = json.loads(strip_json_comments(SAMPLE_CONFIG.read_text()))
    out = {}
    for ns in config["UserConfig"]["Namespaces"]:
        for topic in ns.get("Topics", []):
            for sub in topic["Subscriptions"]:
                out[sub["Name"]] = sub.get("Rules", [])
    return out


def test_the_sample_configs_rules_as_the_emulator_ships_them():
    rules = {name: [rule_from_config(r) for r in rs] for name, rs in sample_rules().items()}
    assert rules == {
        "subscription.1": [
            Rule("app-prop-filter-1", CorrelationFilter(content_type="application/json"))
        ],
        "subscription.2": [
            Rule("user-prop-filter-1", CorrelationFilter(properties={"prop1": "value1"}))
        ],
        "subscription.3": [],
        "subscription.4": [
            Rule(
                "sql-filter-1",
                SqlFilter("sys.MessageId = '123456' AND userProp1 = 'value1'"),
                SqlRuleAction("SET sys.To = 'Entity'"),
            )
        ],
    }


def test_config_rule_forms():
    assert rule_from_config(
        {"Name": "r", "Properties": {"FilterType": "sql", "SqlFilter": {"SqlExpression": "1=1"}}}
    ) == Rule("r", TrueFilter())
    assert rule_from_config(
        {
            "Name": "r",
            "Properties": {
                "FilterType": "Sql",
                "SqlFilter": {"SqlExpression": "1 = 0"},
                "Action": {"SqlExpression": ""},
            },
        }
    ) == Rule("r", FalseFilter())
    assert rule_from_config(
        {
            "Name": "r",
            "Properties": {
                "FilterType": "Correlation",
                "CorrelationFilter": {
                    "CorrelationId": "c",
                    "MessageId": "m",
                    "To": "t",
                    "ReplyTo": "r",
                    "Label": "l",
                    "SessionId": "s",
                    "ReplyToSessionId": "rs",
                    "ContentType": "ct",
                    "Properties": {"n": 3, "b": True},
                },
            },
        }
    ) == Rule("r", CorrelationFilter("c", "m", "t", "r", "l", "s", "rs", "ct", {"n": 3, "b": True}))


@pytest.mark.parametrize(
    "props,fragment",
    [
        (
            {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a = 'x' AND"}},
            "rule 'bad': SQL filter: syntax error at position 12",
        ),
        (
            {
                "FilterType": "Sql",
                "SqlFilter": {"SqlExpression": "1=1"},
                "Action": {"SqlExpression": "SET sys.Size = 1"},
            },
            "rule 'bad': SQL action: system",
        ),
        ({"FilterType": "Sql"}, "needs SqlFilter.SqlExpression"),
        ({"FilterType": "Regex"}, "FilterType must be Correlation or Sql"),
        ({"FilterType": "Correlation", "CorrelationFilter": {}}, "at least one"),
        ({"FilterType": "Correlation", "CorrelationFilter": {"Colour": "x"}}, "unknown Correl"),
        ({"FilterType": "Correlation", "CorrelationFilter": {"To": 5}}, "must be a string"),
        (
            {"FilterType": "Correlation", "CorrelationFilter": {"Properties": {"a": [1]}}},
            "values are strings, numbers, booleans",
        ),
    ],
)
def test_bad_config_rules_name_the_rule(props, fragment):
    with pytest.raises(RuleError, match=re.escape(fragment)):
        rule_from_config({"Name": "bad", "Properties": props})


# --- AMQP: enumerate-rules answers --------------------------------------------------------


def proton_value(data: bytes):
    d = proton.Data()
    assert d.decode(data) == len(data)
    d.rewind()
    d.next()
    return d.get_object()


def test_enumerate_rules_encoding_decodes_in_proton_with_numeric_descriptors():
    rule = Rule("r1", CorrelationFilter(correlation_id="c"), SqlRuleAction("SET x = 1"), 1234)
    value = proton_value(encode_value(rule_to_amqp(rule)))
    assert isinstance(value, proton.Described)
    assert type(value.descriptor) is proton.ulong and value.descriptor == RULE_DESCRIPTION
    flt, action, name, created = value.value
    assert type(flt.descriptor) is proton.ulong and flt.descriptor == CORRELATION_FILTER
    assert flt.value == ["c", None, None, None, None, None, None, None, {}]
    assert type(action.descriptor) is proton.ulong and action.descriptor == SQL_RULE_ACTION
    assert action.value == ["SET x = 1", 20] and type(action.value[1]) is proton.int32
    assert name == "r1"
    assert type(created) is proton.timestamp and created == 1234


@pytest.mark.parametrize(
    "rule,filter_code,filter_fields,action_code",
    [
        (default_rule(), TRUE_FILTER, [], EMPTY_RULE_ACTION),
        (Rule("f", FalseFilter()), FALSE_FILTER, [], EMPTY_RULE_ACTION),
        (
            Rule("s", SqlFilter("a = 1"), SqlRuleAction("SET b = 2")),
            SQL_FILTER,
            ["a = 1", 20],
            SQL_RULE_ACTION,
        ),
    ],
)
def test_enumerate_rules_descriptors(rule, filter_code, filter_fields, action_code):
    value = proton_value(encode_value(rule_to_amqp(rule)))
    flt, action = value.value[:2]
    assert (flt.descriptor, flt.value) == (filter_code, filter_fields)
    assert action.descriptor == action_code


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_described_round_trip(rule):
    decoded, _ = decode_value(encode_value(rule_to_amqp(rule)))
    if isinstance(rule.filter, SqlFilter) and rule.filter.parameters:
        # parameters do not travel over AMQP: the SDKs read the expression only
        assert decoded.value[0].value == [rule.filter.expression, 20]
        return
    expected = rule if rule.created_ms is not None else Rule(rule.name, rule.filter, rule.action, 0)
    assert rule_from_amqp(None, decoded) == expected


# --- AMQP: add-rule requests --------------------------------------------------------------


def sent_by_pyamqp(body: dict):
    """The request body encoded by the SDK's AMQP encoder, decoded by busd."""
    out = bytearray()
    pyamqp_encode(out, body)
    value, end = decode_value(bytes(out))
    assert end == len(out)
    return value


def add_rule_body(name, sdk_filter, sdk_action=None, dotnet=False):
    """The add-rule body the SDKs send (spec: JS sends all nine correlation keys, .NET a null
    action when there is none), built from the Python SDK's own rule models."""
    if isinstance(sdk_filter, SqlRuleFilter):
        description = {"sql-filter": {"expression": sdk_filter.sql_expression}}
    else:
        f = sdk_filter
        description = {
            "correlation-filter": {
                "correlation-id": f.correlation_id,
                "message-id": f.message_id,
                "to": f.to,
                "reply-to": f.reply_to,
                "label": f.label,
                "session-id": f.session_id,
                "reply-to-session-id": f.reply_to_session_id,
                "content-type": f.content_type,
                "properties": f.properties,
            }
        }
    if sdk_action is not None:
        description["sql-rule-action"] = {"expression": sdk_action.sql_expression}
    elif dotnet:
        description["sql-rule-action"] = None
    if dotnet:
        description["rule-name"] = name
    return {"rule-name": name, "rule-description": description}


@pytest.mark.parametrize("dotnet", [False, True])
@pytest.mark.parametrize(
    "sdk_filter,sdk_action,expected",
    [
        (TrueRuleFilter(), None, TrueFilter()),
        (FalseRuleFilter(), None, FalseFilter()),
        (SqlRuleFilter("color = 'red'"), SdkSqlRuleAction("SET x = 1"), SqlFilter("color = 'red'")),
        (
            CorrelationRuleFilter(correlation_id="c", label="l", properties={"k": "v", "n": 3}),
            None,
            CorrelationFilter(correlation_id="c", subject="l", properties={"k": "v", "n": 3}),
        ),
        (
            CorrelationRuleFilter(content_type="application/json"),
            None,
            CorrelationFilter(content_type="application/json"),
        ),
    ],
)
def test_add_rule_request(sdk_filter, sdk_action, expected, dotnet):
    body = sent_by_pyamqp(add_rule_body("r", sdk_filter, sdk_action, dotnet))
    rule = rule_from_amqp(body["rule-name"], body["rule-description"], created_ms=9)
    action = SqlRuleAction(sdk_action.sql_expression) if sdk_action else None
    assert rule == Rule("r", expected, action, 9)
    # and what enumerate-rules then answers decodes back to the same rule
    assert rule_from_amqp(None, decode_value(encode_value(rule_to_amqp(rule)))[0]) == rule


@pytest.mark.parametrize(
    "body,fragment",
    [
        (
            {"rule-name": "r", "rule-description": {"sql-filter": {"expression": "a = = 1"}}},
            "rule 'r': SQL filter: syntax error at position 5",
        ),
        ({"rule-name": "r", "rule-description": {}}, "either a sql-filter or a correlation"),
        (
            {
                "rule-name": "r",
                "rule-description": {
                    "sql-filter": {"expression": "1=1"},
                    "correlation-filter": {"to": "x"},
                },
            },
            "either",
        ),
        ({"rule-name": "", "rule-description": {"sql-filter": {"expression": "1=1"}}}, "rule-name"),
        ({"rule-name": "r", "rule-description": {"sql-filter": {}}}, "needs an expression"),
        (
            {"rule-name": "r", "rule-description": {"correlation-filter": {"to": None}}},
            "at least one",
        ),
        (
            {
                "rule-name": "r",
                "rule-description": {
                    "sql-filter": {"expression": "1=1"},
                    "sql-rule-action": {"expression": "SET"},
                },
            },
            "SQL action: syntax error",
        ),
        (
            {"rule-name": "r" * 51, "rule-description": {"sql-filter": {"expression": "1=1"}}},
            "at most 50",
        ),
    ],
)
def test_bad_add_rule_requests(body, fragment):
    decoded = sent_by_pyamqp(body)
    with pytest.raises(RuleError, match=re.escape(fragment)):
        rule_from_amqp(decoded["rule-name"], decoded["rule-description"])


def test_not_a_rule_description():
    with pytest.raises(RuleError):
        rule_from_amqp(None, Described(1, []))
    with pytest.raises(RuleError, match="unknown filter descriptor"):
        rule_from_amqp(
            None, Described(RULE_DESCRIPTION, [Described(5, []), None, "x", Timestamp(0)])
        )


# --- catalog records ----------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_record_round_trip(rule):
    record = json.loads(json.dumps(rule_record(rule)))
    assert "name" not in record and "created_ms" not in record
    assert rule_from_record(rule.name, record, rule.created_ms) == rule


def test_record_in_the_config_form():
    props = {
        "FilterType": "Sql",
        "SqlFilter": {"SqlExpression": "a = 1"},
        "Action": {"SqlExpression": "SET b = 2"},
    }
    assert rule_from_record("r", {"config": props}, 7) == Rule(
        "r", SqlFilter("a = 1"), SqlRuleAction("SET b = 2"), 7
    )
    bad = {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a ="}}
    with pytest.raises(RuleError, match="rule 'r': SQL filter: syntax error at position 4"):
        rule_from_record("r", {"config": bad})
    assert rule_from_record("$Default", {"filter": {"type": "true"}}) == default_rule()
