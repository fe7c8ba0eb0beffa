"""Entities as the management API sees them: what `busd.http.atom` asks of the broker's
entity catalog (busd.broker.catalog), and the counts it answers with.

Properties are carried by Service Bus element name (`LockDuration` in ms, `RequiresSession`, ...;
busd.http.atom_xml); this module maps them to and from the catalog's entities (entities.records):
what an entity has a field for goes there, the rest into its `extra` and back unchanged.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from busd.entities import properties as ep
from busd.entities import property_types as pt
from busd.entities.records import (
    DEFAULT_RULE_NAME,
    QueueEntity,
    RuleEntity,
    SubscriptionEntity,
    TopicEntity,
    from_record,
    rule_path,
)
from busd.entities.records import Entity as CatalogEntity
from busd.errors import BusdError, Condition
from busd.http import atom_xml as ax
from busd.rules import (
    CorrelationFilter,
    FalseFilter,
    RuleError,
    SqlFilter,
    rule_from_dict,
    rule_from_record,
    rule_record,
)
from busd.storage.counts import EntityCounts
from busd.storage.specs import subscription_path


@dataclass
class Entity:
    kind: str  # queue, topic, subscription, rule
    path: str  # lower-cased: q, t, t/s, t/s/r
    properties: dict[str, Any] = field(default_factory=dict)  # by element name
    created_ms: int | None = None
    updated_ms: int | None = None
    title: str | None = None  # the name as created, when the path is lower-cased (rules)

    @property
    def name(self) -> str:
        """What `<title>` carries: a subscription's or rule's own name, a queue's whole path."""
        if self.title:
            return self.title
        return self.path if self.kind in ("queue", "topic") else self.path.rsplit("/", 1)[1]


class Entities(Protocol):
    async def get(self, kind: str, path: str) -> Entity | None: ...

    async def list(self, kind: str, parent: str | None = None) -> list[Entity]: ...

    async def create(self, kind: str, path: str, properties: dict[str, Any]) -> Entity: ...

    async def update(self, kind: str, path: str, properties: dict[str, Any]) -> Entity: ...

    async def delete(self, kind: str, path: str) -> bool: ...

    async def runtime(self, entity: Entity) -> ax.Runtime: ...


def runtime_of(counts: EntityCounts, size_in_bytes: int = 0) -> ax.Runtime:
    """The counts the SDKs (and KEDA) read, from the store's (docs/management.md §4).

    ActiveMessageCount is what a receiver has yet to finish: available now or locked by a
    receiver that has not settled it (`EntityCounts.active_message_count`, which the admin
    API answers too). Deferred messages are not active (only a receive by sequence number
    gets them) but are in MessageCount, the total of every state."""
    return ax.Runtime(
        active=counts.active_message_count,
        dead_letter=counts.dead_letter,
        scheduled=counts.scheduled,
        message_count=counts.message_count,
        size_in_bytes=size_in_bytes,
    )


# --- the store's catalog ------------------------------------------------------------------------
# Properties <-> record fields as busd.entities.properties declares them; what has no field is
# kept in `extra` and answered back.
_CLASSES = {"queue": QueueEntity, "topic": TopicEntity, "subscription": SubscriptionEntity}
# Kept in `extra` for the answers' sake; not settable (read-only in requests).
_UPDATED = "UpdatedAt"


def _to_atom(entity: QueueEntity | TopicEntity | SubscriptionEntity) -> dict[str, Any]:
    """An entity's properties by element name (what atom_xml.description writes)."""
    return ep.property_values(entity.kind, entity, entity.extra)


def _from_atom(
    kind: str, names: dict[str, str], props: dict[str, Any], created_ms: int | None, updated_ms: int
) -> CatalogEntity:
    """The entity `props` (every property, by element name) describe."""
    fields, extra = ep.record_fields(kind, props)
    extra[_UPDATED] = updated_ms
    return _CLASSES[kind](**names, **fields, extra=extra, created_ms=created_ms)


_TRUE_SQL = re.compile(r"\s*1\s*=\s*1\s*")
_FALSE_SQL = re.compile(r"\s*1\s*=\s*0\s*")
# ATOM's correlation field names (atom_xml) -> the stored form's
_CORRELATION = {
    "correlation_id": "correlation_id",
    "message_id": "message_id",
    "to": "to",
    "reply_to": "reply_to",
    "label": "subject",
    "session_id": "session_id",
    "reply_to_session_id": "reply_to_session_id",
    "content_type": "content_type",
}


def _rule_of(description: ax.RuleDescription) -> dict[str, Any]:
    """The stored form (the rules' JSON form, without the name) of the rule an ATOM
    RuleDescription describes; AtomError 400 when it cannot be a rule."""
    kind, sql = description.filter_type, description.sql or ""
    if kind == "SqlFilter" and _TRUE_SQL.fullmatch(sql):  # what the JS SDK sends for True
        kind = "TrueFilter"
    elif kind == "SqlFilter" and _FALSE_SQL.fullmatch(sql):
        kind = "FalseFilter"
    flt: dict[str, Any]
    if kind == "TrueFilter":
        flt = {"type": "true"}
    elif kind == "FalseFilter":
        flt = {"type": "false"}
    elif kind == "SqlFilter":
        flt = {"type": "sql", "expression": sql}
        if description.properties:
            flt["parameters"] = dict(description.properties)
    else:
        flt = {"type": "correlation"}
        flt.update({_CORRELATION[k]: v for k, v in description.correlation.items()})
        if description.properties:
            flt["properties"] = dict(description.properties)
        if len(flt) == 1:
            raise ax.AtomError(400, "a CorrelationFilter needs at least one field or property")
    record: dict[str, Any] = {"filter": flt}
    if description.action_sql:
        record["action"] = {
            "type": "sql",
            "expression": description.action_sql,
            "parameters": dict(description.action_parameters),
        }
    try:  # the SQL parses, the names and values are what a rule may hold
        rule = rule_from_dict({**record, "name": description.name or DEFAULT_RULE_NAME})
    except RuleError as exc:
        raise ax.AtomError(400, str(exc)) from None
    return rule_record(rule)  # the stored form: date-times and time spans tagged


def _description_of(name: str, record: dict[str, Any]) -> ax.RuleDescription:
    rule = rule_from_record(name, record)
    flt = rule.filter
    out = ax.RuleDescription(name=name)
    if isinstance(flt, FalseFilter):
        out.filter_type = "FalseFilter"
    elif isinstance(flt, SqlFilter):
        out.filter_type, out.sql = "SqlFilter", flt.expression
        out.properties = dict(flt.parameters)
    elif isinstance(flt, CorrelationFilter):
        out.filter_type = "CorrelationFilter"
        out.correlation = {
            atom: getattr(flt, stored)
            for atom, stored in _CORRELATION.items()
            if getattr(flt, stored) is not None
        }
        out.properties = dict(flt.properties)
    if rule.action is not None:
        out.action_sql = rule.action.expression
        out.action_parameters = dict(rule.action.parameters)
    return out


def _catalog_path(kind: str, path: str) -> str:
    """busd.http's `t/s`, `t/s/r` as the catalog spells them."""
    if kind == "subscription":
        topic, sub = path.rsplit("/", 1)
        return subscription_path(topic, sub)
    if kind == "rule":
        topic, sub, rule = path.rsplit("/", 2)
        return rule_path(topic, sub, rule)
    return path


class CatalogEntities:
    """Entities in the store's catalog (busd.broker.catalog): created, changed and deleted there,
    so every busd process sees them; reads come from the process's view of it, and from the
    store itself when the view has not heard of a change yet."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.catalog = broker.catalog

    def _view(self, entity: CatalogEntity) -> Entity:
        now = entity.created_ms
        if isinstance(entity, RuleEntity):
            path = f"{entity.topic}/{entity.subscription}/{entity.name.lower()}"
            description = _description_of(entity.name, entity.rule)
            return Entity("rule", path, {"rule": description}, now, now, title=entity.name)
        updated = entity.extra.get(_UPDATED, now)
        if isinstance(entity, SubscriptionEntity):
            return Entity(
                "subscription", f"{entity.topic}/{entity.name}", _to_atom(entity), now, updated
            )
        return Entity(entity.kind, entity.name, _to_atom(entity), now, updated)

    def _cached(self, kind: str, path: str) -> CatalogEntity | None:
        if kind == "queue":
            return self.catalog.queue(path)
        if kind == "topic":
            return self.catalog.topic(path)
        if kind == "subscription":
            return self.catalog.subscription(*path.rsplit("/", 1))
        return self.catalog.rule(*path.rsplit("/", 2))

    async def _lookup(self, kind: str, path: str) -> CatalogEntity | None:
        found = self._cached(kind, path)
        if found is None:  # created by another process a moment ago?
            record = await self.catalog.store.catalog_get(kind, _catalog_path(kind, path))
            found = None if record is None else from_record(kind, record)
        return found

    async def get(self, kind: str, path: str) -> Entity | None:
        found = await self._lookup(kind, path)
        return None if found is None else self._view(found)

    async def list(self, kind: str, parent: str | None = None) -> list[Entity]:
        if kind == "queue":
            found: list[Any] = self.catalog.queues()
        elif kind == "topic":
            found = self.catalog.topics()
        elif kind == "subscription":
            found = self.catalog.subscriptions(parent or "")
        else:
            found = self.catalog.rules(*(parent or "/").rsplit("/", 1))
        return [self._view(e) for e in found]

    async def create(self, kind: str, path: str, properties: dict[str, Any]) -> Entity:
        now = int(time.time() * 1000)
        try:
            if kind == "rule":
                topic, sub, _ = path.rsplit("/", 2)
                description = properties["rule"]
                created = await self.catalog.create(
                    RuleEntity(topic, sub, description.name, _rule_of(description))
                )
            else:
                names = _names(kind, path)
                entity = _from_atom(kind, names, properties, None, now)
                rules = None
                if kind == "subscription" and properties.get("DefaultRuleDescription"):
                    default = properties["DefaultRuleDescription"]
                    rules = [
                        RuleEntity(
                            names["topic"],
                            names["name"],
                            default.name or DEFAULT_RULE_NAME,
                            _rule_of(default),
                        )
                    ]
                created = await self.catalog.create(entity, rules=rules)
        except BusdError as exc:
            raise _atom_error(exc) from None
        return self._view(created)

    async def update(self, kind: str, path: str, properties: dict[str, Any]) -> Entity:
        current = await self._lookup(kind, path)
        if current is None:
            raise ax.AtomError(404, "Not Found. The Operation doesn't exist.", 40400)
        try:
            if isinstance(current, RuleEntity):
                updated = await self.catalog.update(
                    RuleEntity(
                        current.topic,
                        current.subscription,
                        current.name,
                        _rule_of(properties["rule"]),
                        current.created_ms,
                    )
                )
            else:
                # The description sent replaces the whole one, as in Service Bus: what it
                # leaves out takes its default (docs/management.md §3.2), but for busd's own
                # properties, which the SDKs' models never send back: they are kept.
                replacement = dict(properties)
                replacement.pop("DefaultRuleDescription", None)
                before = _to_atom(current)
                for prop in ep.OF_KIND[kind].values():
                    if prop.own and not prop.immutable and prop.name not in replacement:
                        if prop.name in before:
                            replacement[prop.name] = before[prop.name]
                for prop in (p for p in ep.OF_KIND[kind].values() if p.immutable):
                    if _changes(prop, replacement, before):
                        raise ax.AtomError(
                            400, f"{prop.name} cannot be changed on an existing entity"
                        )
                entity = _from_atom(
                    kind,
                    _names(kind, path),
                    replacement,
                    current.created_ms,
                    int(time.time() * 1000),
                )
                updated = await self.catalog.update(entity)
        except BusdError as exc:
            raise _atom_error(exc) from None
        return self._view(updated)

    async def delete(self, kind: str, path: str) -> bool:
        try:
            return await self.catalog.delete(kind, _catalog_path(kind, path))
        except BusdError as exc:
            raise _atom_error(exc) from None

    async def runtime(self, entity: Entity) -> ax.Runtime:
        if entity.kind == "topic":
            return ax.Runtime(
                subscription_count=len(self.catalog.subscriptions(entity.path)),
                created_ms=entity.created_ms,
                updated_ms=entity.updated_ms,
                accessed_ms=entity.updated_ms,
            )
        spec = self.catalog.spec(_catalog_path(entity.kind, entity.path))
        if spec is None:
            runtime = ax.Runtime()
        else:
            store = self.broker.store
            counts, size = await asyncio.gather(store.counts(spec), store.size_in_bytes(spec))
            runtime = runtime_of(counts, size)
        runtime.created_ms = entity.created_ms
        runtime.updated_ms = runtime.accessed_ms = entity.updated_ms
        return runtime


def _names(kind: str, path: str) -> dict[str, str]:
    if kind == "subscription":
        topic, sub = path.rsplit("/", 1)
        return {"topic": topic, "name": sub}
    return {"name": path}


def _atom_error(exc: BusdError) -> ax.AtomError:
    if exc.condition == Condition.ENTITY_ALREADY_EXISTS:
        return ax.AtomError(409, f"Conflict. {exc.description}", 40900)
    if exc.condition == Condition.NOT_FOUND:
        return ax.AtomError(404, exc.description, 40400)
    return ax.AtomError(400, exc.description)


def _changes(prop: pt.Property, replacement: dict[str, Any], before: dict[str, Any]) -> bool:
    """Whether the replacement alters a property fixed at creation: a flag, or a value its
    flag switches on (PartitionCount, while partitioning stays on)."""
    if prop.type == pt.BOOL:
        return bool(replacement.get(prop.name)) != bool(before.get(prop.name))
    if prop.enabled_by and not (replacement.get(prop.enabled_by) and before.get(prop.enabled_by)):
        return False
    default = ep.default_of(prop)  # as a description that leaves it out makes it
    return bool(replacement.get(prop.name, default) != before.get(prop.name, default))
