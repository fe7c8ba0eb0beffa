"""Rule sets: correlation filters, which copies a subscription gets, and actions applied to
the stored message (read back as a receiver gets it, through the SDK's own decoder)."""

from __future__ import annotations

import datetime
import uuid

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from busd.amqp.codec import encode_delivery, parse_incoming
from busd.rules import (
    PLAIN_COPY,
    CorrelationFilter,
    FalseFilter,
    FilterEvaluationError,
    MessageView,
    Rule,
    RuleError,
    RuleSet,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
    default_rule,
)
from tests.rules.helpers import sdk_bytes


def stored(**kwargs):
    kwargs.setdefault("application_properties", {"color": "red", "Priority": "low", "n": 4})
    return parse_incoming(sdk_bytes(ServiceBusMessage(kwargs.pop("body", "hello"), **kwargs)))


def view(message) -> MessageView:
    return MessageView(message.blob, sequence_number=7, enqueued_ms=1_800_000_000_000)


def received(blob: bytes) -> ServiceBusReceivedMessage:
    """The stored copy as a receiver gets it, decoded by the SDK."""
    payload = encode_delivery(blob, seq=7, enqueued_ms=1_800_000_000_000, delivery_count=0)
    return ServiceBusReceivedMessage(
        decode_payload(memoryview(payload)), receiver=None, amqp_transport=PyamqpTransport
    )


def copies(rules, message):
    return RuleSet.compile(rules).copies(view(message))


# --- correlation filters ------------------------------------------------------------------


FULL = dict(
    message_id="m1",
    correlation_id="c1",
    to="t1",
    reply_to="r1",
    subject="s1",
    session_id="g1",
    reply_to_session_id="rg1",
    content_type="application/json",
)


@pytest.mark.parametrize(
    "flt,matches",
    [
        (CorrelationFilter(correlation_id="c1"), True),
        (CorrelationFilter(correlation_id="C1"), False),  # values are case-sensitive
        (CorrelationFilter(**FULL), True),  # all nine fields
        (CorrelationFilter(**{**FULL, "to": "other"}), False),  # every set field must match
        (CorrelationFilter(message_id="m1"), True),
        (CorrelationFilter(to="t1"), True),
        (CorrelationFilter(reply_to="r1"), True),
        (CorrelationFilter(subject="s1"), True),
        (CorrelationFilter(session_id="g1"), True),
        (CorrelationFilter(reply_to_session_id="rg1"), True),
        (CorrelationFilter(content_type="application/json"), True),
        (CorrelationFilter(content_type="text/plain"), False),
        (CorrelationFilter(properties={"color": "red"}), True),
        (CorrelationFilter(properties={"COLOR": "red"}), True),  # keys are case-insensitive
        (CorrelationFilter(properties={"color": "Red"}), False),
        (CorrelationFilter(properties={"color": "red", "n": 4}), True),
        (CorrelationFilter(properties={"n": 4.0}), True),  # numbers compare numerically
        (CorrelationFilter(properties={"n": "4"}), False),  # no string/number conversion
        (CorrelationFilter(properties={"missing": "x"}), False),
        (CorrelationFilter(properties={"flag": True}), True),
        (CorrelationFilter(properties={"flag": 1}), False),  # booleans only match booleans
        (CorrelationFilter(correlation_id="c1", properties={"color": "blue"}), False),
    ],
)
def test_correlation_filter(flt, matches):
    message = stored(**FULL, application_properties={"color": "red", "n": 4, "flag": True})
    assert copies([Rule("r", flt)], message) == ([PLAIN_COPY] if matches else [])


def test_correlation_filter_on_a_uuid_message_id_compares_its_text():
    mid = uuid.UUID("7996a2e5-7e5f-479d-bcc6-22f11100456c")
    message = stored(message_id=mid)
    assert copies([Rule("r", CorrelationFilter(message_id=str(mid)))], message) == [PLAIN_COPY]


def test_correlation_filter_needs_a_field():
    with pytest.raises(RuleError, match="at least one"):
        RuleSet.compile([Rule("r", CorrelationFilter())])


# --- copies ------------------------------------------------------------------------------


def test_default_rule_set_is_match_all_and_never_reads_the_message():
    rules = RuleSet.compile([default_rule()])
    assert rules.is_match_all and not rules.is_match_none
    assert rules.copies(MessageView(b"not a blob at all")) == [PLAIN_COPY]


def test_a_true_filter_makes_other_plain_rules_moot():
    rules = RuleSet.compile([Rule("a", SqlFilter("x = 1")), Rule("b", SqlFilter("1 = 1"))])
    assert rules.is_match_all


def test_no_rules_or_false_filters_match_nothing():
    assert RuleSet.compile([]).is_match_none
    rules = RuleSet.compile([Rule("$default", FalseFilter()), Rule("x", SqlFilter("1=0"))])
    assert rules.is_match_none and not rules.is_match_all
    assert rules.copies(view(stored())) == []


def test_plain_rules_are_ored_into_one_copy():
    rules = [
        Rule("a", SqlFilter("color = 'red'")),
        Rule("b", SqlFilter("n = 4")),
        Rule("c", SqlFilter("n = 5")),
    ]
    assert copies(rules, stored()) == [PLAIN_COPY]
    assert copies(rules[2:], stored()) == []


def test_five_matching_rules_two_with_actions_make_three_copies():
    # the example of the Service Bus documentation
    rules = [
        Rule("p1", TrueFilter()),
        Rule("p2", SqlFilter("color = 'red'")),
        Rule("p3", CorrelationFilter(properties={"n": 4})),
        Rule("a1", SqlFilter("n > 1"), SqlRuleAction("SET tag = 'one'")),
        Rule("a2", TrueFilter(), SqlRuleAction("SET tag = 'two'")),
        Rule("nomatch", SqlFilter("n > 100"), SqlRuleAction("SET tag = 'never'")),
    ]
    rules_set = RuleSet.compile(rules)
    assert not rules_set.is_match_all
    result = rules_set.copies(view(stored()))
    assert [c.rule_name for c in result] == [None, "a1", "a2"]
    assert result[0] is PLAIN_COPY
    assert [
        received(c.apply(stored().blob)).application_properties[b"tag"] for c in result[1:]
    ] == [b"one", b"two"]


def test_only_action_rules_match_no_plain_copy():
    rules = [Rule("a", SqlFilter("color = 'red'"), SqlRuleAction("SET x = 1"))]
    assert [c.rule_name for c in copies(rules, stored())] == ["a"]


def test_evaluation_error_names_the_rule():
    rules = RuleSet.compile([Rule("ok", SqlFilter("n = 5")), Rule("bad", SqlFilter("color > 1"))])
    with pytest.raises(FilterEvaluationError) as info:
        rules.copies(view(stored()))
    assert info.value.rule_name == "bad"
    assert "cannot compare a string with a number" in info.value.description


def test_an_action_error_is_an_evaluation_error():
    rules = RuleSet.compile([Rule("a", TrueFilter(), SqlRuleAction("SET x = n / 0"))])
    with pytest.raises(FilterEvaluationError, match="division by zero"):
        rules.copies(view(stored()))


def test_invalid_rules_are_refused_at_compile():
    with pytest.raises(RuleError, match=r"rule 'r': SQL filter: syntax error at position 7"):
        RuleSet.compile([Rule("r", SqlFilter("a = 1 b"))])
    with pytest.raises(RuleError, match="SQL action: syntax error at position 5"):
        RuleSet.compile([Rule("r", TrueFilter(), SqlRuleAction("SET = 1"))])
    with pytest.raises(RuleError, match="at most 50"):
        RuleSet.compile([Rule("r" * 51, TrueFilter())])


# --- actions -----------------------------------------------------------------------------


def act(expression, message=None):
    message = message or stored()
    (copy,) = copies([Rule("act", TrueFilter(), SqlRuleAction(expression))], message)
    return copy, received(copy.apply(message.blob))


def props(msg):
    return {
        k.decode(): (v.decode() if isinstance(v, bytes) else v)
        for k, v in msg.application_properties.items()
    }


def test_set_and_remove_user_properties_and_rule_name():
    copy, msg = act("SET quantity = n / 2; REMOVE Priority;SET sys.CorrelationId = 'low';")
    assert props(msg) == {"color": "red", "n": 4, "quantity": 2, "RuleName": "act"}
    assert msg.correlation_id == "low"
    assert copy.overrides == {}
    assert str(msg) == "hello"  # the body is untouched


def test_set_keeps_the_existing_key_casing():
    _, msg = act("SET priority = 'high'")
    assert props(msg)["Priority"] == "high"
    assert "priority" not in props(msg)


def test_statements_see_earlier_statements_and_run_in_order():
    _, msg = act("SET a = 1; SET b = a + 1; REMOVE a SET c = EXISTS(a)")
    assert props(msg) == {
        "color": "red",
        "Priority": "low",
        "n": 4,
        "b": 2,
        "c": False,
        "RuleName": "act",
    }


def test_remove_of_a_missing_property_is_a_no_op():
    _, msg = act("REMOVE nothing")
    assert props(msg) == {"color": "red", "Priority": "low", "n": 4, "RuleName": "act"}


def test_set_value_types():
    _, msg = act("SET s = 'x'; SET i = 3; SET d = 1.5; SET b = TRUE; SET z = NULL; SET g = newid()")
    p = props(msg)
    assert (p["s"], p["i"], p["d"], p["b"], p["z"]) == ("x", 3, 1.5, True, None)
    assert isinstance(p["g"], uuid.UUID)


def test_set_system_properties():
    copy, msg = act(
        "SET sys.To = 'Entity'; SET sys.Label = 'lbl'; SET sys.MessageId = 'new-id';"
        "SET sys.SessionId = 'other'; SET sys.ReplyTo = 'rt'; SET sys.ContentType = 'text/x';"
        "SET sys.ReplyToSessionId = 'rs'; SET sys.ScheduledEnqueueTimeUtc = NULL",
        stored(session_id="first", message_id="m"),
    )
    assert (
        msg.to,
        msg.subject,
        msg.message_id,
        msg.session_id,
        msg.reply_to,
        msg.content_type,
        msg.reply_to_session_id,
    ) == ("Entity", "lbl", "new-id", "other", "rt", "text/x", "rs")
    assert copy.overrides == {
        "message_id": "new-id",
        "session_id": "other",
        "reply_to_session_id": "rs",
    }


def test_set_sys_property_on_a_message_without_properties():
    message = parse_incoming(b"\x00\x53\x77\xa1\x02hi")  # a bare amqp-value
    _, msg = act("SET sys.To = 'x'; SET k = 1", message)
    assert msg.to == "x"
    assert props(msg) == {"k": 1, "RuleName": "act"}


def test_time_to_live_can_be_removed_and_copied():
    message = stored(time_to_live=datetime.timedelta(seconds=30))
    copy, msg = act("REMOVE sys.TimeToLive", message)
    assert copy.overrides == {"ttl_ms": None}
    assert msg.time_to_live is None
    copy, _ = act("SET sys.TimeToLive = sys.TimeToLive", message)
    assert copy.overrides == {"ttl_ms": 30_000}


def test_rule_name_cannot_be_overwritten_by_the_action():
    _, msg = act("SET RuleName = 'mine'; SET rulename = 'again'")
    assert props(msg)["RuleName"] == "act"


@pytest.mark.parametrize(
    "expression,fragment",
    [
        ("SET sys.SequenceNumber = 1", "cannot be changed"),
        ("REMOVE sys.EnqueuedTimeUtc", "cannot be changed"),
        ("SET sys.Nope = 1", "unknown system property"),
        ("SET x", "syntax error at position 6"),
        ("SET x = 1,", "syntax error at position 10"),
        ("UPDATE x = 1", "syntax error at position 1"),
        ("; SET x = 1", "syntax error at position 1"),
        (";".join(["SET x = 1"] * 33), "more than 32"),
    ],
)
def test_bad_actions(expression, fragment):
    with pytest.raises(RuleError, match=fragment):
        RuleSet.compile([Rule("r", TrueFilter(), SqlRuleAction(expression))])


@pytest.mark.parametrize(
    "expression,fragment",
    [
        ("SET sys.To = 1", "takes a string"),
        ("SET sys.SessionId = 'x' + p('big')", "128 characters"),
        ("SET sys.TimeToLive = 5", "time span"),
    ],
)
def test_action_type_errors_at_run_time(expression, fragment):
    message = stored(application_properties={"big": "y" * 200})
    with pytest.raises(FilterEvaluationError, match=fragment):
        copies([Rule("r", TrueFilter(), SqlRuleAction(expression))], message)


def test_the_view_reads_what_was_sent_only_once():
    message = stored(subject="s", application_properties={"A": 1})
    v = view(message)
    assert v.sys("Label") == "s" and v.user("a") == 1 and v.user_key("a") == "A"
    assert v._props is not None and v._user is not None
