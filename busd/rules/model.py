"""Rules as data: filters, actions, and their JSON form (the store's) and the emulator's
Config.json form (docs/rules.md §1).

Constructors do not parse SQL; `validate(rule)` does (every `*_from_*` function calls it), and
`RuleSet.compile` does again through a cache, so a rule's SQL is parsed once per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from busd.rules.errors import RuleError
from busd.rules.sql import compile_action, compile_filter

__all__ = [
    "TrueFilter",
    "FalseFilter",
    "SqlFilter",
    "CorrelationFilter",
    "SqlRuleAction",
    "Rule",
    "Filter",
    "DEFAULT_RULE_NAME",
    "default_rule",
    "validate",
    "rule_to_dict",
    "rule_from_dict",
    "rule_from_config",
    "rule_record",
    "rule_from_record",
    "CORRELATION_FIELDS",
]

DEFAULT_RULE_NAME = "$Default"
MAX_RULE_NAME = 50

# (attribute, AMQP map key / list position order, Config.json / ATOM name): docs/rules.md §1.2.
CORRELATION_FIELDS = (
    ("correlation_id", "correlation-id", "CorrelationId"),
    ("message_id", "message-id", "MessageId"),
    ("to", "to", "To"),
    ("reply_to", "reply-to", "ReplyTo"),
    ("subject", "label", "Label"),
    ("session_id", "session-id", "SessionId"),
    ("reply_to_session_id", "reply-to-session-id", "ReplyToSessionId"),
    ("content_type", "content-type", "ContentType"),
)


@dataclass(frozen=True, slots=True)
class TrueFilter:
    """Matches every message (SQL `1=1`)."""


@dataclass(frozen=True, slots=True)
class FalseFilter:
    """Matches no message (SQL `1=0`)."""


@dataclass(frozen=True, slots=True)
class _Sql:
    """SQL text and the values of its parameters: a filter's or an action's."""

    expression: str
    parameters: dict[str, Any] = field(default_factory=dict)  # "@name" -> value


@dataclass(frozen=True, slots=True)
class SqlFilter(_Sql):
    pass


@dataclass(frozen=True, slots=True)
class CorrelationFilter:
    """Equality on the fields that are set (all must match); `properties` keys match user
    properties case-insensitively, values case-sensitively."""

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    subject: str | None = None  # Label
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)


Filter = TrueFilter | FalseFilter | SqlFilter | CorrelationFilter


@dataclass(frozen=True, slots=True)
class SqlRuleAction(_Sql):
    pass


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    filter: Filter
    action: SqlRuleAction | None = None
    created_ms: int | None = None  # creation time, ms since the epoch (enumerate-rules)


def default_rule(created_ms: int | None = None) -> Rule:
    """The rule every new subscription gets: `$Default`, TrueFilter, no action."""
    return Rule(DEFAULT_RULE_NAME, TrueFilter(), None, created_ms)


def sql_or_constant(expression: Any, parameters: dict[str, Any] | None = None) -> Filter:
    """A SqlFilter, or TrueFilter/FalseFilter for an expression that does not depend on the
    message: the SDKs send those as SQL (`1=1`; `1=0` from JS and .NET, `1>1` from Python)."""
    if not isinstance(expression, str):
        raise RuleError("a SQL filter needs an expression (a string)")
    try:
        constant = compile_filter(expression, parameters)
    except RuleError:
        constant = None  # validate() reports it, naming the rule
    if constant is True:
        return TrueFilter()
    if constant is False:
        return FalseFilter()
    return SqlFilter(expression, dict(parameters or {}))


# What a correlation property or a parameter may hold: a date-time (naive ones are UTC when
# compared) or a time span as well as the JSON scalars (docs/rules.md §1).
_SCALARS = (str, bool, int, float, datetime, timedelta)


def validate(rule: Rule) -> Rule:
    """The rule itself when it is acceptable (its SQL parses, its fields have the right
    types), else RuleError naming the rule."""
    try:
        _validate(rule)
    except RuleError as exc:
        raise RuleError(f"rule {getattr(rule, 'name', None)!r}: {exc}") from None
    return rule


def _validate(rule: Rule) -> None:
    if not isinstance(rule.name, str) or not rule.name:
        raise RuleError("a rule needs a name")
    if len(rule.name) > MAX_RULE_NAME:
        raise RuleError(f"a rule name has at most {MAX_RULE_NAME} characters")
    f = rule.filter
    if isinstance(f, SqlFilter):
        compile_filter(f.expression, f.parameters)
    elif isinstance(f, CorrelationFilter):
        for attr, _, name in CORRELATION_FIELDS:
            value = getattr(f, attr)
            if value is not None and not isinstance(value, str):
                raise RuleError(f"correlation filter field {name} must be a string")
        if not isinstance(f.properties, dict):
            raise RuleError("correlation filter properties must be a map")
        for key, value in f.properties.items():
            if not isinstance(key, str) or not key:
                raise RuleError(f"correlation filter property name {key!r} is not a name")
            if value is not None and not isinstance(value, _SCALARS):
                raise RuleError(
                    f"correlation filter property {key!r}: values are strings, numbers, "
                    f"booleans, date-times or time spans, not {type(value).__name__}"
                )
        if not f.properties and all(getattr(f, a) is None for a, _, _ in CORRELATION_FIELDS):
            raise RuleError("a correlation filter needs at least one field or property")
    elif not isinstance(f, (TrueFilter, FalseFilter)):
        raise RuleError(f"unknown filter {f!r}")
    if rule.action is not None:
        if not isinstance(rule.action, SqlRuleAction):
            raise RuleError(f"unknown action {rule.action!r}")
        compile_action(rule.action.expression, rule.action.parameters)
    if rule.created_ms is not None and not isinstance(rule.created_ms, int):
        raise RuleError("created_ms must be an integer")


# ---------------------------------------------------------------------------------------------
# The store's JSON form


def _to_json(values: dict[str, Any]) -> dict[str, Any]:
    """Parameters or properties with date-times as `{"dateTime": ISO 8601}` (naive stays naive:
    the ATOM API answers what it was given) and time spans as `{"timeSpan": microseconds}`."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, datetime):
            value = {"dateTime": value.isoformat()}
        elif isinstance(value, timedelta):
            value = {"timeSpan": value // timedelta(microseconds=1)}
        out[key] = value
    return out


def _from_json(values: Any) -> dict[str, Any]:
    """What _to_json wrote, back as values; anything else is left for validate() to judge."""
    if not isinstance(values, dict):
        return values
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and len(value) == 1:
            try:
                if isinstance(value.get("dateTime"), str):
                    value = datetime.fromisoformat(value["dateTime"])
                elif isinstance(value.get("timeSpan"), int):
                    value = timedelta(microseconds=value["timeSpan"])
            except (ValueError, OverflowError):
                raise RuleError(f"{key!r}: not a date-time or time span: {value!r}") from None
        out[key] = value
    return out


def rule_to_dict(rule: Rule) -> dict[str, Any]:
    """A JSON-able dict (rule_from_dict reads it back). Filter parameters and correlation
    property values are JSON scalars, or date-times and time spans in their `_to_json`
    form."""
    f = rule.filter
    out: dict[str, Any] = {"name": rule.name}
    if isinstance(f, TrueFilter):
        out["filter"] = {"type": "true"}
    elif isinstance(f, FalseFilter):
        out["filter"] = {"type": "false"}
    elif isinstance(f, SqlFilter):
        out["filter"] = {"type": "sql", "expression": f.expression}
        if f.parameters:
            out["filter"]["parameters"] = _to_json(f.parameters)
    else:
        d: dict[str, Any] = {"type": "correlation"}
        for attr, _, _ in CORRELATION_FIELDS:
            if (value := getattr(f, attr)) is not None:
                d[attr] = value
        if f.properties:
            d["properties"] = _to_json(f.properties)
        out["filter"] = d
    if rule.action is not None:
        out["action"] = {"type": "sql", "expression": rule.action.expression}
        if rule.action.parameters:
            out["action"]["parameters"] = _to_json(rule.action.parameters)
    if rule.created_ms is not None:
        out["created_ms"] = rule.created_ms
    return out


def rule_from_dict(data: Any) -> Rule:
    """The rule a rule_to_dict dict describes (validated)."""
    if not isinstance(data, dict):
        raise RuleError("a stored rule must be a JSON object")
    fd = data.get("filter")
    if not isinstance(fd, dict):
        raise RuleError(f"rule {data.get('name')!r}: no filter")
    kind = fd.get("type")
    flt: Filter
    if kind == "true":
        flt = TrueFilter()
    elif kind == "false":
        flt = FalseFilter()
    elif kind == "sql":
        flt = SqlFilter(fd.get("expression"), _from_json(fd.get("parameters") or {}))  # type: ignore[arg-type]
    elif kind == "correlation":
        flt = CorrelationFilter(
            **{a: fd.get(a) for a, _, _ in CORRELATION_FIELDS},
            properties=_from_json(fd.get("properties") or {}),
        )
    else:
        raise RuleError(f"rule {data.get('name')!r}: unknown filter type {kind!r}")
    ad = data.get("action")
    action = None
    if ad is not None:
        if not isinstance(ad, dict) or ad.get("type") != "sql":
            raise RuleError(f"rule {data.get('name')!r}: unknown action {ad!r}")
        action = SqlRuleAction(
            ad.get("expression"),  # type: ignore[arg-type]
            _from_json(ad.get("parameters") or {}),
        )
    return validate(Rule(data.get("name"), flt, action, data.get("created_ms")))  # type: ignore[arg-type]


def rule_record(rule: Rule) -> dict[str, Any]:
    """What a catalog record keeps of a rule whose name and creation time it holds itself:
    rule_to_dict without `name` and `created_ms`."""
    out = rule_to_dict(rule)
    del out["name"]
    out.pop("created_ms", None)
    return out


def rule_from_record(name: str, record: Any, created_ms: int | None = None) -> Rule:
    """The rule of a catalog record: a rule_record dict, or `{"config": <Properties>}` with
    the emulator's Config.json rule properties as given (validated either way)."""
    if isinstance(record, dict) and "config" in record and "filter" not in record:
        rule = rule_from_config({"Name": name, "Properties": record["config"]})
        return Rule(rule.name, rule.filter, rule.action, created_ms)
    if not isinstance(record, dict):
        raise RuleError(f"rule {name!r}: a stored rule must be a JSON object")
    return rule_from_dict({**record, "name": name, "created_ms": created_ms})


# ---------------------------------------------------------------------------------------------
# The emulator's Config.json form


def rule_from_config(data: Any) -> Rule:
    """A rule from the emulator's Config.json (`Subscriptions[].Rules[]`):

        {"Name": ..., "Properties": {"FilterType": "Correlation" | "Sql",
         "CorrelationFilter": {CorrelationId, MessageId, To, ReplyTo, Label, SessionId,
                               ReplyToSessionId, ContentType, Properties: {...}},
         "SqlFilter": {"SqlExpression": ...}, "Action": {"SqlExpression": ...}}}

    RuleError (naming the rule, and for bad SQL the position) when it is not valid."""
    if not isinstance(data, dict):
        raise RuleError("a rule must be an object with Name and Properties")
    name = data.get("Name")
    try:
        return validate(_rule_from_config(name, data.get("Properties")))
    except RuleError as exc:
        text = str(exc)
        prefix = f"rule {name!r}: "
        raise RuleError(text if text.startswith(prefix) else prefix + text) from None


def _rule_from_config(name: Any, props: Any) -> Rule:
    if not isinstance(name, str) or not name:
        raise RuleError("a rule needs a Name")
    if not isinstance(props, dict):
        raise RuleError("a rule needs Properties")
    kind = props.get("FilterType")
    flt: Filter
    if not isinstance(kind, str) or kind.lower() not in ("correlation", "sql"):
        raise RuleError(f"FilterType must be Correlation or Sql, not {kind!r}")
    if kind.lower() == "sql":
        sql = props.get("SqlFilter")
        if not isinstance(sql, dict) or "SqlExpression" not in sql:
            raise RuleError("a Sql rule needs SqlFilter.SqlExpression")
        flt = sql_or_constant(sql["SqlExpression"])
    else:
        cf = props.get("CorrelationFilter")
        if not isinstance(cf, dict):
            raise RuleError("a Correlation rule needs a CorrelationFilter object")
        known = {config for _, _, config in CORRELATION_FIELDS} | {"Properties"}
        unknown = sorted(set(cf) - known)
        if unknown:
            raise RuleError(f"unknown CorrelationFilter field(s): {', '.join(unknown)}")
        user = cf.get("Properties") or {}
        if not isinstance(user, dict):
            raise RuleError("CorrelationFilter.Properties must be an object")
        flt = CorrelationFilter(
            **{attr: cf.get(config) for attr, _, config in CORRELATION_FIELDS},
            properties=dict(user),
        )
    action = None
    act = props.get("Action")
    if act is not None:
        if not isinstance(act, dict) or not isinstance(act.get("SqlExpression"), str):
            raise RuleError("Action needs a SqlExpression")
        if act["SqlExpression"].strip():
            action = SqlRuleAction(act["SqlExpression"])
    return Rule(name, flt, action)
