"""Rules as `$management` carries them (docs/rules.md §5): a plain map in `add-rule` requests,
described lists with numeric descriptors in `enumerate-rules` answers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from busd.amqp.types import Described, Int, Long, Symbol, Timestamp, ULong
from busd.rules.errors import RuleError
from busd.rules.model import (
    CORRELATION_FIELDS,
    CorrelationFilter,
    FalseFilter,
    Rule,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
    sql_or_constant,
    validate,
)

__all__ = [
    "RULE_DESCRIPTION",
    "EMPTY_RULE_ACTION",
    "SQL_RULE_ACTION",
    "SQL_FILTER",
    "TRUE_FILTER",
    "FALSE_FILTER",
    "CORRELATION_FILTER",
    "rule_to_amqp",
    "rule_from_amqp",
]

# Descriptor codes (the filter codes really have one zero fewer than the others).
RULE_DESCRIPTION = 0x0000013700000004
EMPTY_RULE_ACTION = 0x0000013700000005
SQL_RULE_ACTION = 0x0000013700000006
SQL_FILTER = 0x0000001370000006
TRUE_FILTER = 0x0000001370000007
FALSE_FILTER = 0x0000001370000008
CORRELATION_FILTER = 0x0000001370000009

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# How .NET sends a TimeSpan: this descriptor over its ticks (100 ns).
_TIMESPAN = "com.microsoft:timespan"

# The compatibility level Service Bus reports for SQL filters and actions.
COMPATIBILITY_LEVEL = 20


def rule_to_amqp(rule: Rule) -> Described:
    """The `rule-description` described list of an enumerate-rules answer: filter, action
    (an empty-rule-action when there is none), name, created-at."""
    f = rule.filter
    if isinstance(f, TrueFilter):
        flt = Described(ULong(TRUE_FILTER), [])
    elif isinstance(f, FalseFilter):
        flt = Described(ULong(FALSE_FILTER), [])
    elif isinstance(f, SqlFilter):
        flt = Described(ULong(SQL_FILTER), [f.expression, Int(COMPATIBILITY_LEVEL)])
    else:
        fields: list[Any] = [getattr(f, attr) for attr, _, _ in CORRELATION_FIELDS]
        # never null: .NET dereferences it
        fields.append({key: _amqp_value(value) for key, value in f.properties.items()})
        flt = Described(ULong(CORRELATION_FILTER), fields)
    if rule.action is None:
        action = Described(ULong(EMPTY_RULE_ACTION), [])
    else:
        action = Described(
            ULong(SQL_RULE_ACTION), [rule.action.expression, Int(COMPATIBILITY_LEVEL)]
        )
    created = Timestamp(rule.created_ms if rule.created_ms is not None else 0)
    return Described(ULong(RULE_DESCRIPTION), [flt, action, rule.name, created])


def _amqp_value(value: Any) -> Any:
    """A correlation property's value on the wire: a time span as .NET's described
    `com.microsoft:timespan` (ticks of 100 ns); a date-time encodes as a timestamp."""
    if isinstance(value, timedelta):
        return Described(Symbol(_TIMESPAN), Long(value // timedelta(microseconds=1) * 10))
    return value


def rule_from_amqp(name: Any, description: Any, created_ms: int | None = None) -> Rule:
    """The rule of an `add-rule` request (`rule-name`, and the `rule-description` map with
    `sql-filter` | `correlation-filter` and an optional `sql-rule-action`), or of a
    `rule-description` described list (name None: the list carries it). Validated:
    RuleError for anything unacceptable."""
    if isinstance(description, Described):
        return _from_described(description, created_ms)
    if not isinstance(name, str) or not name:
        raise RuleError("add-rule needs a rule-name")
    if not isinstance(description, dict):
        raise RuleError("add-rule needs a rule-description map")
    sql = description.get("sql-filter")
    correlation = description.get("correlation-filter")
    if (sql is None) == (correlation is None):
        raise RuleError("a rule-description has either a sql-filter or a correlation-filter")
    if sql is not None:
        if not isinstance(sql, dict):
            raise RuleError("sql-filter must be a map")
        flt: Any = sql_or_constant(sql.get("expression"))
    else:
        if not isinstance(correlation, dict):
            raise RuleError("correlation-filter must be a map")
        properties = correlation.get("properties")
        if properties is not None and not isinstance(properties, dict):
            raise RuleError("correlation-filter properties must be a map")
        flt = CorrelationFilter(
            **{attr: _text(correlation.get(key), key) for attr, key, _ in CORRELATION_FIELDS},
            properties={_key(k): _scalar(v, k) for k, v in (properties or {}).items()},
        )
    action = None
    act = description.get("sql-rule-action")
    if act is not None:  # .NET sends null when there is none, JS leaves the key out
        if not isinstance(act, dict) or not isinstance(act.get("expression"), str):
            raise RuleError("sql-rule-action needs an expression")
        action = SqlRuleAction(str(act["expression"]))
    return validate(Rule(str(name), flt, action, created_ms))


def _from_described(value: Described, created_ms: int | None) -> Rule:
    if value.descriptor != RULE_DESCRIPTION or not isinstance(value.value, list):
        raise RuleError("not a rule-description")
    fields = list(value.value) + [None] * 4
    flt_d, act_d, name, created = fields[:4]
    if not isinstance(flt_d, Described):
        raise RuleError("a rule-description needs a described filter")
    code, body = flt_d.descriptor, flt_d.value or []
    flt: Any
    if code == TRUE_FILTER:
        flt = TrueFilter()
    elif code == FALSE_FILTER:
        flt = FalseFilter()
    elif code == SQL_FILTER:
        flt = SqlFilter(body[0] if body else None)  # type: ignore[arg-type]
    elif code == CORRELATION_FILTER:
        body = list(body) + [None] * 9
        flt = CorrelationFilter(
            **{attr: _text(v, key) for v, (attr, key, _) in zip(body[:8], CORRELATION_FIELDS)},
            properties={_key(k): _scalar(v, k) for k, v in (body[8] or {}).items()},
        )
    else:
        raise RuleError(f"unknown filter descriptor {code!r}")
    action = None
    if isinstance(act_d, Described) and act_d.descriptor == SQL_RULE_ACTION:
        action = SqlRuleAction(act_d.value[0])
    elif act_d is not None and not (
        isinstance(act_d, Described) and act_d.descriptor == EMPTY_RULE_ACTION
    ):
        raise RuleError("unknown rule action")
    if created is not None and created_ms is None:
        created_ms = int(created)
    return validate(Rule(name, flt, action, created_ms))


def _text(value: Any, key: str) -> str | None:
    # message-id and correlation-id filter values may arrive as other id types: compare text.
    if value is None or isinstance(value, str):
        return None if value is None else str(value)
    if isinstance(value, (int, bytes)) and not isinstance(value, bool):
        return value.hex() if isinstance(value, bytes) else str(value)
    if key in ("message-id", "correlation-id"):
        return str(value)
    raise RuleError(f"correlation-filter {key} must be a string")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise RuleError(f"correlation-filter property names are strings, not {key!r}")
    return str(key)


def _scalar(value: Any, key: Any) -> Any:
    if value is None or isinstance(value, str):
        return None if value is None else str(value)
    if isinstance(value, Timestamp):
        return _EPOCH + timedelta(milliseconds=int(value))
    if (
        isinstance(value, Described)
        and value.descriptor == _TIMESPAN
        and isinstance(value.value, int)
    ):
        return timedelta(microseconds=value.value // 10)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise RuleError(
        f"correlation-filter property {key!r}: values are strings, numbers, booleans, "
        f"timestamps or time spans, not {type(value).__name__}"
    )
