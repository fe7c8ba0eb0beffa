"""Entities for a test, made and removed over busd's management (ATOM) API, the one the SDKs'
administration clients and `busd queue|topic|subscription|rule` call (docs/management.md §3).

Properties are given as the SDKs name them (`requires_session=True`, `lock_duration=
timedelta(seconds=5)`) or as the API's elements (`RequiresSession`);
any the API takes is accepted, and one it refuses raises ManagementError with busd's reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from busd.client.atom import (
    CORRELATION_FIELDS,
    AtomClient,
    entity_path,
    entry_document,
    rule_document,
)
from busd.client.http import ToolError
from busd.entities.properties import BY_NAME
from busd.entities.property_types import format_duration
from busd.errors import EXIT_NOT_FOUND

DEFAULT_RULE = "$Default"
_DESCRIPTIONS = {
    "queue": "QueueDescription",
    "topic": "TopicDescription",
    "subscription": "SubscriptionDescription",
}


class ManagementError(RuntimeError):
    """busd refused a management request (the message says why) or could not be reached."""


def element_name(name: str) -> str:
    """The API's element for an SDK-style property name: requires_session -> RequiresSession."""
    if name[:1].isupper():
        return name
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def element_text(element: str, value: Any) -> str:
    """A property value as the API's XML spells it, written by the entity property table
    (busd/entities/properties.py), as busd writes its own descriptions: a duration (a timedelta)
    in ISO 8601, a flag true or false. A string goes as it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, dt.timedelta):
        return format_duration(value // dt.timedelta(milliseconds=1))
    known = BY_NAME.get(element)
    return known.to_text(value) if known is not None else str(value)


def _correlation_key(name: str) -> str:
    """session_id -> session-id for the filter's system properties; an application property
    keeps its name."""
    dashed = name.replace("_", "-").lower()
    return dashed if dashed in CORRELATION_FIELDS else name


RuleSpec = str | Mapping[str, Any]


class Management:
    """Create and delete queues, topics, subscriptions and their rules on one busd."""

    def __init__(self, http_url: str, key: tuple[str, str], cafile: str | None = None) -> None:
        self.client = AtomClient(http_url, cafile, key)

    def _call(self, method: str, path: str, body: bytes | None = None) -> None:
        try:
            self.client.call(method, path, body)
        except ToolError as exc:
            raise ManagementError(f"{method} {path}: {exc.message}") from None

    def _put(self, kind: str, path: str, properties: Mapping[str, Any]) -> None:
        names = [element_name(k) for k in properties]
        values = [(n, element_text(n, v)) for n, v in zip(names, properties.values())]
        self._call("PUT", path, entry_document(_DESCRIPTIONS[kind], values))

    def create_queue(self, name: str, **properties: Any) -> str:
        self._put("queue", entity_path(name), properties)
        return name

    def create_topic(self, name: str, **properties: Any) -> str:
        self._put("topic", entity_path(name), properties)
        return name

    def create_subscription(
        self,
        topic: str,
        name: str,
        *,
        rules: Mapping[str, RuleSpec] | None = None,
        **properties: Any,
    ) -> str:
        """A subscription of `topic`. `rules`: name -> a SQL filter, or a mapping with `sql`,
        `correlation` (a mapping: session_id, label, ... or application properties) and
        `action`; given, they replace the `$Default` rule that takes every message."""
        self._put("subscription", entity_path(topic, name), properties)
        if rules is not None:
            for rule_name, spec in rules.items():
                self.create_rule(topic, name, rule_name, spec)
            if DEFAULT_RULE not in rules:
                self.delete_rule(topic, name, DEFAULT_RULE)
        return name

    def create_rule(self, topic: str, subscription: str, name: str, spec: RuleSpec) -> None:
        if isinstance(spec, str):
            spec = {"sql": spec}
        correlation = tuple(
            f"{_correlation_key(k)}={v}" for k, v in (spec.get("correlation") or {}).items()
        )
        body = rule_document(name, spec.get("sql"), correlation, spec.get("action"))
        self._call("PUT", entity_path(topic, subscription, name), body)

    def delete_rule(self, topic: str, subscription: str, name: str) -> bool:
        return self._delete(entity_path(topic, subscription, name))

    def delete_queue(self, name: str) -> bool:
        return self._delete(entity_path(name))

    def delete_topic(self, name: str) -> bool:
        """The topic, its subscriptions and their messages."""
        return self._delete(entity_path(name))

    def delete_subscription(self, topic: str, name: str) -> bool:
        return self._delete(entity_path(topic, name))

    def exists(self, *names: str) -> bool:
        """Whether a queue or topic (one name), or a subscription (topic, name), exists."""
        try:
            self.client.call("GET", entity_path(*names))
        except ToolError as exc:
            if exc.exit_code == EXIT_NOT_FOUND:
                return False
            raise ManagementError(f"GET {entity_path(*names)}: {exc.message}") from None
        return True

    def _delete(self, path: str) -> bool:
        """True if it was there; gone already is no error (a test may delete it itself)."""
        try:
            self.client.call("DELETE", path)
        except ToolError as exc:
            if exc.exit_code == EXIT_NOT_FOUND:
                return False
            raise ManagementError(f"DELETE {path}: {exc.message}") from None
        return True
