"""The compiled rules of one subscription, and the copies of a message they make
(docs/rules.md §4).

Copies: the rules without an action are OR-ed and make at most one plain copy; every matching
rule with an action makes one more copy, with the action applied and an application property
`RuleName` = the rule's name. Plain rules stop being evaluated once one of them matched (the
answer cannot change), so a TrueFilter rule makes every other plain rule moot: that is
`is_match_all`, which lets the caller skip building a MessageView at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from busd.amqp.delivery import encode_properties_patch, rewrite_blob
from busd.amqp.types import CodecError, Timestamp
from busd.rules.errors import EvaluationError, FilterEvaluationError, RuleError
from busd.rules.model import (
    CorrelationFilter,
    FalseFilter,
    Rule,
    SqlFilter,
    TrueFilter,
    validate,
)
from busd.rules.sql import Statement, as_utc, compile_action, compile_filter
from busd.rules.view import MessageView

__all__ = ["RuleSet", "Copy", "PLAIN_COPY"]

RULE_NAME_PROPERTY = "RuleName"

# System properties an action sets, by the message property they live in.
_PROPERTY_FIELD = {
    "MessageId": "message_id",
    "CorrelationId": "correlation_id",
    "To": "to",
    "ReplyTo": "reply_to",
    "Label": "subject",
    "SessionId": "group_id",
    "ReplyToSessionId": "reply_to_group_id",
    "ContentType": "content_type",
}
# ... and what the caller must carry over to the stored copy (IncomingMessage names)
_OVERRIDE = {
    "MessageId": "message_id",
    "SessionId": "session_id",
    "ReplyToSessionId": "reply_to_session_id",
}
_MAX_SESSION_ID = 128


class Copy:
    """One copy of a message for a subscription.

    `rule_name` is None for the plain copy. `apply(blob)` is the blob to store (the same
    object for a plain copy). `overrides` holds the message fields the broker reads that the
    action changed, by IncomingMessage attribute: `message_id`, `session_id`,
    `reply_to_session_id` (str or None) and `ttl_ms` (int or None)."""

    __slots__ = ("rule_name", "user_set", "user_remove", "properties", "overrides")

    def __init__(
        self,
        rule_name: str | None = None,
        user_set: dict[str, Any] | None = None,
        user_remove: frozenset[str] = frozenset(),
        properties: dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.rule_name = rule_name
        self.user_set = user_set or {}  # key (casing as stored) -> new value
        self.user_remove = user_remove  # keys (casing as stored) removed
        self.properties = properties or {}  # PROPERTY_FIELDS name -> new value
        self.overrides = overrides or {}

    @property
    def is_plain(self) -> bool:
        return self.rule_name is None

    def apply(self, blob: bytes) -> bytes:
        """The stored form of this copy, given the original's."""
        if self.rule_name is None:
            return blob
        try:
            return rewrite_blob(
                blob,
                properties_patch=encode_properties_patch(self.user_set),
                remove=self.user_remove,
                properties=self.properties,
                **({"ttl_ms": self.overrides["ttl_ms"]} if "ttl_ms" in self.overrides else {}),
            )
        except CodecError as exc:
            raise FilterEvaluationError(self.rule_name, f"cannot apply the action: {exc}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Copy) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__
        )

    def __repr__(self) -> str:
        if self.rule_name is None:
            return "Copy(plain)"
        return (
            f"Copy({self.rule_name!r}, set={self.user_set!r}, remove={set(self.user_remove)!r},"
            f" properties={self.properties!r}, overrides={self.overrides!r})"
        )


PLAIN_COPY = Copy()
_PLAIN = [PLAIN_COPY]

Matcher = Callable[[MessageView], Any]


class RuleSet:
    """The rules of one subscription, compiled once (`RuleSet.compile`)."""

    __slots__ = ("rules", "is_match_all", "is_match_none", "_plain", "_actions")

    def __init__(self) -> None:
        self.rules: tuple[Rule, ...] = ()
        self.is_match_all = False
        self.is_match_none = True
        self._plain: list[tuple[str, Matcher]] = []
        self._actions: list[tuple[str, Matcher, tuple[Statement, ...]]] = []

    @classmethod
    def compile(cls, rules: Iterable[Rule]) -> RuleSet:
        """Compile rules (RuleError names the first invalid one)."""
        self = cls()
        self.rules = tuple(rules)
        always = False
        for rule in self.rules:
            validate(rule)
            matcher = _matcher(rule)
            if matcher is False:
                continue
            if rule.action is None:
                if matcher is True:
                    always = True
                else:
                    self._plain.append((rule.name, matcher))
            else:
                statements = compile_action(rule.action.expression, rule.action.parameters)
                run_if = _ALWAYS if matcher is True else matcher
                self._actions.append((rule.name, run_if, statements))
        if always:
            self._plain = [("", _ALWAYS)]
        self.is_match_all = always and not self._actions
        self.is_match_none = not self._plain and not self._actions
        return self

    def copies(self, message: MessageView) -> list[Copy]:
        """The copies this subscription gets of a message: [] when no rule matches, else
        PLAIN_COPY first (when a rule without action matched), then one Copy per matching
        rule with an action. Raises FilterEvaluationError when a rule fails on the message."""
        if self.is_match_all:
            return _PLAIN
        out: list[Copy] = []
        name = ""
        try:
            for rule_name, matcher in self._plain:
                name = rule_name  # named in the error if this one fails
                if matcher(message) is True:
                    out.append(PLAIN_COPY)
                    break
            for name, matcher, statements in self._actions:
                if matcher(message) is True:
                    out.append(_run_action(name, statements, message))
        except EvaluationError as exc:
            raise FilterEvaluationError(name, str(exc)) from None
        except CodecError as exc:
            raise FilterEvaluationError(name, f"cannot read the message: {exc}") from None
        return out


def _ALWAYS(message: MessageView) -> bool:
    return True


def _matcher(rule: Rule) -> Matcher | bool:
    f = rule.filter
    if isinstance(f, TrueFilter):
        return True
    if isinstance(f, FalseFilter):
        return False
    if isinstance(f, SqlFilter):
        return compile_filter(f.expression, f.parameters)
    if isinstance(f, CorrelationFilter):
        return _correlation_matcher(f)
    raise RuleError(f"unknown filter {f!r}")


_CORRELATION_SYS = (
    ("correlation_id", "CorrelationId"),
    ("message_id", "MessageId"),
    ("to", "To"),
    ("reply_to", "ReplyTo"),
    ("subject", "Label"),
    ("session_id", "SessionId"),
    ("reply_to_session_id", "ReplyToSessionId"),
    ("content_type", "ContentType"),
)


def _correlation_matcher(f: CorrelationFilter) -> Matcher:
    system = [
        (name, getattr(f, attr)) for attr, name in _CORRELATION_SYS if getattr(f, attr) is not None
    ]
    user = [(key.lower(), as_utc(value)) for key, value in f.properties.items()]

    def match(message: MessageView) -> bool:
        for name, expected in system:
            if message.sys(name) != expected:
                return False
        for key, expected in user:
            if not _same_value(message.user(key), expected):
                return False
        return True

    return match


def _same_value(actual: Any, expected: Any) -> bool:
    """Correlation equality: exact for strings (case-sensitive), numeric across integer and
    floating types, booleans only with booleans; never an error."""
    if expected is None:
        return actual is None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is bool and type(expected) is bool and actual == expected
    if isinstance(expected, (int, float)):
        return isinstance(actual, (int, float)) and actual == expected
    return type(actual) is type(expected) and actual == expected


# ---------------------------------------------------------------------------------------------
# Actions


class _Overlay:
    """A message view with an action's changes so far: later statements see earlier ones."""

    __slots__ = ("view", "user_changes", "sys_changes")

    _REMOVED: Any = object()

    def __init__(self, view: MessageView) -> None:
        self.view = view
        self.user_changes: dict[str, tuple[str, Any]] = {}  # lower key -> (key, value|_REMOVED)
        self.sys_changes: dict[str, Any] = {}

    def user(self, lower_name: str) -> Any:
        change = self.user_changes.get(lower_name)
        if change is None:
            return self.view.user(lower_name)
        return None if change[1] is _Overlay._REMOVED else change[1]

    def user_exists(self, lower_name: str) -> bool:
        change = self.user_changes.get(lower_name)
        if change is None:
            return self.view.user_exists(lower_name)
        return change[1] is not _Overlay._REMOVED

    def sys(self, name: str) -> Any:
        if name in self.sys_changes:
            return self.sys_changes[name]
        return self.view.sys(name)


def _run_action(rule_name: str, statements: tuple[Statement, ...], view: MessageView) -> Copy:
    overlay = _Overlay(view)
    for st in statements:
        value = None if st.value is None else st.value(overlay)
        if st.scope == "user":
            lower = st.name.lower()
            previous = overlay.user_changes.get(lower)
            key = previous[0] if previous else (view.user_key(lower) or st.name)
            if st.value is None:
                overlay.user_changes[lower] = (key, _Overlay._REMOVED)
            else:
                overlay.user_changes[lower] = (key, _user_value(value))
        else:
            overlay.sys_changes[st.name] = _sys_value(st.name, value)

    user_set: dict[str, Any] = {}
    removed = set()
    for lower, (key, value) in overlay.user_changes.items():
        if value is _Overlay._REMOVED:
            if view.user_exists(lower):
                removed.add(key)
        else:
            user_set[key] = value
    user_set.pop(RULE_NAME_PROPERTY, None)
    removed.discard(RULE_NAME_PROPERTY)
    for key in list(user_set):
        if key.lower() == RULE_NAME_PROPERTY.lower():  # the rule name wins whatever the casing
            del user_set[key]
            removed.add(key)
    user_set[RULE_NAME_PROPERTY] = rule_name

    properties: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for name, value in overlay.sys_changes.items():
        if name in _PROPERTY_FIELD:
            properties[_PROPERTY_FIELD[name]] = value
            if name in _OVERRIDE:
                overrides[_OVERRIDE[name]] = value
        elif name == "TimeToLive":
            overrides["ttl_ms"] = None if value is None else int(value / timedelta(milliseconds=1))
        # ScheduledEnqueueTimeUtc, PartitionKey: accepted, no effect
    return Copy(rule_name, user_set, frozenset(removed), properties, overrides)


def _user_value(value: Any) -> Any:
    """An expression's value as an application-property value."""
    if value is None or isinstance(value, (str, bool, float, uuid.UUID)):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise EvaluationError("an integer property value out of the Int64 range")
        return value
    if isinstance(value, datetime):
        return Timestamp.from_datetime(value)
    raise EvaluationError(f"a user property cannot hold a value of type {type(value).__name__}")


def _sys_value(name: str, value: Any) -> Any:
    if name == "TimeToLive":
        if value is None or (isinstance(value, timedelta) and value >= timedelta(0)):
            if value is not None and value > timedelta(milliseconds=0xFFFFFFFF):
                return timedelta(milliseconds=0xFFFFFFFF)
            return value
        raise EvaluationError("sys.TimeToLive takes a time span")
    if name == "ScheduledEnqueueTimeUtc":
        if value is None or isinstance(value, datetime):
            return value
        raise EvaluationError("sys.ScheduledEnqueueTimeUtc takes a date-time")
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        value = str(value)
    if not isinstance(value, str):
        raise EvaluationError(f"sys.{name} takes a string, not {type(value).__name__}")
    if name in ("SessionId", "ReplyToSessionId") and (
        len(value) > _MAX_SESSION_ID or "\0" in value
    ):
        raise EvaluationError(f"sys.{name} must be at most 128 characters without NUL")
    return value
