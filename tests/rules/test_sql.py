"""The SQL filter language, table-driven: each filter against one message, built by the
official SDK and stored as busd stores it (docs/rules.md §2)."""

from __future__ import annotations

import datetime
import uuid

import pytest
from azure.servicebus import ServiceBusMessage

from busd.amqp.codec import parse_incoming
from busd.rules import MessageView
from busd.rules.errors import EvaluationError, RuleError
from busd.rules.sql import compile_filter
from tests.rules.helpers import sdk_bytes

T, F, U = True, False, None  # U: unknown (NULL); a filter matches only on T
ERR = "error"

MESSAGE = ServiceBusMessage(
    "body",
    message_id="m-1",
    correlation_id="c-1",
    subject="yellow",
    to="dest",
    reply_to="rq",
    session_id="s-1",
    reply_to_session_id="rs-1",
    content_type="application/json",
    application_properties={
        "color": "red",
        "Quantity": 10,
        "price": 2.5,
        "flag": True,
        "off": False,
        "empty": "",
        "nothing": None,
        "my prop": "spaced",
        "with]bracket": 1,
        'quo"te': 2,
        "pct": "50%",
        "path": "a_b",
        "NServiceBus.EnclosedMessageTypes": "Shop.OrderPlaced, Shop",
        "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
        "id": uuid.UUID("7996a2e5-7e5f-479d-bcc6-22f11100456c"),
    },
)
VIEW = MessageView(
    parse_incoming(sdk_bytes(MESSAGE)).blob,
    sequence_number=42,
    enqueued_ms=1_800_000_000_000,
    size=300,
)

CASES = [
    # comparisons
    ("color = 'red'", T),
    ("color = 'Red'", F),
    ("color <> 'red'", F),
    ("color != 'blue'", T),
    ("quantity = 10", T),
    ("quantity > 9", T),
    ("quantity >= 10", T),
    ("quantity < 10", F),
    ("quantity <= 10", T),
    ("quantity = 10.0", T),
    ("price > 2", T),
    ("price = 2.5", T),
    ("flag = TRUE", T),
    ("flag = true", T),
    ("off = FALSE", T),
    ("flag <> off", T),
    ("empty = ''", T),
    ("color > 'rad'", T),
    ("color < 'rad'", F),
    ("'it''s' = 'it''s'", T),
    ("1 = 1", T),
    ("1 = 2", F),
    # names: case-insensitive, scopes, delimited and quoted
    ("Color = 'red'", T),
    ("COLOR = 'red'", T),
    ("user.color = 'red'", T),
    ("USER.Color = 'red'", T),
    ("[my prop] = 'spaced'", T),
    ("\"my prop\" = 'spaced'", T),
    ("[with]]bracket] = 1", T),
    ('"quo""te" = 2', T),
    ("user.[my prop] = 'spaced'", T),
    ("[NServiceBus.EnclosedMessageTypes] LIKE '%Shop.OrderPlaced%'", T),
    # system properties
    ("sys.MessageId = 'm-1'", T),
    ("sys.messageid = 'm-1'", T),
    ("sys.CorrelationId = 'c-1'", T),
    ("sys.Label = 'yellow'", T),
    ("sys.Subject = 'yellow'", T),
    ("sys.To = 'dest'", T),
    ("sys.ReplyTo = 'rq'", T),
    ("sys.SessionId = 's-1'", T),
    ("sys.ReplyToSessionId = 'rs-1'", T),
    ("sys.ContentType = 'application/json'", T),
    ("sys.SequenceNumber = 42", T),
    ("sys.DeliveryCount = 0", T),
    ("sys.Size = 300", T),
    ("sys.PartitionKey IS NULL", T),
    ("sys.EnqueuedTimeUtc > when", T),
    ("sys.TimeToLive IS NULL", T),
    ("sys.correlationid like 'c-%'", T),
    ("sys.State = 'Active'", T),
    # NULL and three-valued logic
    ("missing = 1", U),
    ("missing <> 1", U),
    ("nothing = 1", U),
    ("missing IS NULL", T),
    ("nothing IS NULL", T),
    ("color IS NULL", F),
    ("color IS NOT NULL", T),
    ("missing IS NOT NULL", F),
    ("NOT missing = 1", U),
    ("missing = 1 AND color = 'red'", U),
    ("missing = 1 AND color = 'blue'", F),
    ("missing = 1 OR color = 'red'", T),
    ("missing = 1 OR color = 'blue'", U),
    ("NOT (missing = 1 OR color = 'blue')", U),
    ("NULL IS NULL", T),
    ("NULL = NULL", U),
    ("missing + 1 = 2", U),
    ("-missing = 1", U),
    ("missing LIKE 'a%'", U),
    # EXISTS
    ("EXISTS(color)", T),
    ("EXISTS(Color)", T),
    ("EXISTS(missing)", F),
    ("EXISTS(nothing)", T),
    ("exists(user.[my prop])", T),
    ("EXISTS(sys.MessageId)", T),
    ("NOT EXISTS(missing)", T),
    ("EXISTS(sys.PartitionKey)", F),
    # LIKE and ESCAPE
    ("color LIKE 'r%'", T),
    ("color LIKE '%e%'", T),
    ("color LIKE 'r_d'", T),
    ("color LIKE 'r_'", F),
    ("color LIKE 'R%'", F),
    ("color LIKE '%'", T),
    ("empty LIKE '%'", T),
    ("color NOT LIKE 'b%'", T),
    ("pct LIKE '50!%' ESCAPE '!'", T),
    ("pct LIKE '5!%' ESCAPE '!'", F),
    ("pct LIKE '50\\%' ESCAPE '\\'", T),
    ("path LIKE 'a!_b' ESCAPE '!'", T),
    ("color LIKE 'r!_d' ESCAPE '!'", F),
    ("color LIKE '[r]ed'", F),
    ("sys.Label LIKE '%ell%'", T),
    ("color LIKE 'r.d'", F),
    ("color LIKE 're*'", F),
    # IN
    ("color IN ('red', 'blue')", T),
    ("color IN ('blue')", F),
    ("color NOT IN ('blue')", T),
    ("color NOT IN ('red')", F),
    ("quantity IN (1, 10, 100)", T),
    ("missing IN ('a')", U),
    ("color IN ('blue', NULL)", U),
    ("color IN ('red', NULL)", T),
    ("color NOT IN ('x', NULL)", U),
    ("sys.To NOT IN ('a', 'b') OR quantity NOT IN (10)", T),
    # arithmetic and precedence
    ("quantity + 1 = 11", T),
    ("quantity - 1 = 9", T),
    ("quantity * 2 = 20", T),
    ("quantity / 3 = 3", T),
    ("quantity % 3 = 1", T),
    ("-7 / 2 = -3", T),
    ("-7 % 3 = -1", T),
    ("7.0 / 2 = 3.5", T),
    ("price * 2 = 5", T),
    ("1 + 2 * 3 = 7", T),
    ("(1 + 2) * 3 = 9", T),
    ("-quantity = -10", T),
    ("- -quantity = 10", T),
    ("+quantity = 10", T),
    ("10 - 2 - 3 = 5", T),
    ("100 / 10 / 5 = 2", T),
    ("'a' + 'b' = 'ab'", T),
    ("2.0 = 2", T),
    ("1.5E2 = 150", T),
    ("1e1 = 10", T),
    (".5 = 0.5", T),
    ("color = 'red' OR color = 'blue' AND quantity = 0", T),  # AND binds tighter
    ("(color = 'red' OR color = 'blue') AND quantity = 0", F),
    ("NOT color = 'blue' AND quantity = 10", T),
    # keywords in any case
    ("color = 'red' and quantity = 10", T),
    ("color = 'red' AnD NoT quantity = 1", T),
    ("missing is null", T),
    ("color not in ('x')", T),
    ("color Like 'r%'", T),
    # parameters
    ("color = @c", T),
    ("quantity > @n", T),
    ("color = @C", T),
    # functions
    ("p('color') = 'red'", T),
    ("property('Color') = 'red'", T),
    ("p('sys.Label') = 'yellow'", T),
    ("newid() IS NOT NULL", T),
    ("newid() = newid()", F),
    # other value types
    ("id = id", T),
    ("when = when", T),
    ("when < sys.EnqueuedTimeUtc", T),
    # run-time type errors
    ("color = 1", ERR),
    ("color > 1", ERR),
    ("quantity = 'x'", ERR),
    ("flag > off", ERR),
    ("NOT color", ERR),
    ("color AND flag", ERR),
    ("quantity / 0 = 1", ERR),
    ("color + 1 = 2", ERR),
    ("-color = 1", ERR),
    ("quantity LIKE '1%'", ERR),
    ("color IN (1, 2)", ERR),
    ("p(1) = 1", ERR),
    ("id = 'x'", ERR),
    # bare boolean properties are conditions
    ("flag", T),
    ("off", F),
    ("missing", U),
    ("color", ERR),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_filter(text, expected):
    compiled = compile_filter(text, {"@c": "red", "@n": 5})
    if expected is ERR:
        assert not isinstance(compiled, bool)
        with pytest.raises(EvaluationError):
            compiled(VIEW)
        return
    if isinstance(compiled, bool):  # folded at compile time: only TRUE matches
        assert compiled is (expected is True)
    else:
        assert compiled(VIEW) is expected


def test_constant_filters_fold_at_compile_time():
    assert compile_filter("1=1") is True
    assert compile_filter(" 1 = 0 ") is False
    assert compile_filter("NOT (1 = 0)") is True
    assert compile_filter("1 = 1 OR missing = 2") is not True  # still reads the message


BAD = [
    # (text, position named in the error, fragment of the message)
    ("color = ", 9, "unexpected end"),
    ("color == 'red'", 8, "unexpected '='"),
    ("color = 'red", 9, 'unexpected "\'"'),
    ("color = 'red' AND", 18, "unexpected end"),
    ("color = 'red' quantity = 1", 15, "unexpected 'quantity'"),
    ("(color = 'red'", 15, "unexpected end"),
    ("color = 'red')", 14, "unexpected ')'"),
    ("color IN ()", 11, "unexpected ')'"),
    ("color LIKE", 11, "unexpected end"),
    ("foo.bar = 1", 1, "unknown property scope 'foo'"),
    ("sys.Colour = 1", 5, "unknown system property 'Colour'"),
    ("1", 1, "not a condition"),
    ("'text'", 1, "not a condition"),
    ("color = @missing", 9, "parameter @missing has no value"),
    ("and = 1", 1, "reserved word"),
    ("nosuch(1) = 1", 1, "unknown function nosuch()"),
    ("newid(1) IS NULL", 1, "newid() takes no argument"),
    ("color LIKE 'a' ESCAPE 'ab'", 12, "one-character"),
    ("1 / 0 = 1", 1, "division by zero"),
    ("color = 99999999999999999999", 9, "Int64"),
    ("color # 1", 7, "unexpected '#'"),
]


@pytest.mark.parametrize("text,position,fragment", BAD)
def test_syntax_errors_name_the_position(text, position, fragment):
    with pytest.raises(RuleError) as info:
        compile_filter(text)
    message = str(info.value)
    assert f"at position {position}" in message, message
    assert fragment in message, message


def test_limits():
    with pytest.raises(RuleError, match="empty"):
        compile_filter("  ")
    with pytest.raises(RuleError, match="1024"):
        compile_filter("a = '" + "x" * 1100 + "'")
    with pytest.raises(RuleError, match="string"):
        compile_filter(None)  # type: ignore[arg-type]
    with pytest.raises(RuleError, match="unsupported type"):
        compile_filter("a = @p", {"@p": object()})
