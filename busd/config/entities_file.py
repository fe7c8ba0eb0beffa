"""The entities file: the Service Bus emulator's Config.json.

`load_entities()` reads it as the emulator ships it (JSON with `//` and `/* */` comments) and
turns its queues, topics, subscriptions and rules into the records of entities.records, which
seed the store's catalog, and reads busd's own `SharedAccessKeys` entries of a namespace (keys
with their rights). Properties are read as busd.entities.properties declares them: a Service
Bus property busd keeps but does not act on is a warning unless it has Azure's default value
(an exported template writes them all: `Status` Active, `EnableBatchedOperations` true); a
name Service Bus does not know for that kind of entity (a misspelling) refuses the start,
naming the entity and the property.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from busd.auth.rights import SasKey, parse_rights
from busd.config.settings import DEFAULT_MAX_MESSAGE_SIZE
from busd.entities import access_rules
from busd.entities import properties as ep
from busd.entities import property_types as pt
from busd.entities.records import (
    DEFAULT_RULE_NAME,
    QueueEntity,
    RuleEntity,
    SubscriptionEntity,
    TopicEntity,
)
from busd.entities.values import (
    check_rule_name,
    normalize_entity_name,
    normalize_subscription_name,
)
from busd.errors import ConfigError
from busd.rules import RuleError, rule_from_config, rule_record


@dataclass
class EntitiesFile:
    """What an entities file declares. `rules` maps a subscription's path to its rules, for
    each subscription whose `Rules` is non-empty (the others get the `$Default` TrueFilter)."""

    queues: list[QueueEntity] = field(default_factory=list)
    topics: list[TopicEntity] = field(default_factory=list)
    subscriptions: list[SubscriptionEntity] = field(default_factory=list)
    rules: dict[str, list[RuleEntity]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # shared access keys by name (busd.auth.rights.SasKey: the key with its rights), added to
    # those of --sas-key
    keys: dict[str, str] = field(default_factory=dict)

    def rules_of(self, subscription: SubscriptionEntity) -> list[RuleEntity]:
        return self.rules.get(subscription.path) or [
            RuleEntity(subscription.topic, subscription.name, DEFAULT_RULE_NAME)
        ]


def strip_json_comments(text: str) -> str:
    """JSON with `//` and `/* */` comments (as the emulator's own Config.json has) as plain
    JSON: each comment becomes spaces (its newlines stay), so error positions still point at
    the file; `//` inside a string (a URL) is left alone."""
    out: list[str] = []
    i, n = 0, len(text)
    start = 0
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(text[start:i])
            out.append(" " * (end - i))
            i = start = end
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ValueError(f"a /* comment is not closed (at character {i})")
            end += 2
            out.append(text[start:i])
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = start = end
        else:
            i += 1
    out.append(text[start:])
    return "".join(out)


def load_entities(
    path: str | Path, default_max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> EntitiesFile:
    """Read an emulator Config.json: the entities it declares, and warnings for what is ignored.

    Raises ConfigError naming the file (and the entity) for anything that would make busd
    behave differently from what the file asks: bad JSON, bad names, out-of-range values.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a BOM, as Windows editors write
    except OSError as e:
        raise ConfigError(f"cannot read entities file {path}: {e.strerror or e}") from e
    try:
        document = json.loads(strip_json_comments(text))
    except ValueError as e:
        where = (
            f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        )
        message = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise ConfigError(f"entities file {path} is not valid JSON: {message}{where}") from e
    try:
        return parse_document(document, default_max_message_size)
    except ConfigError as e:
        raise ConfigError(f"entities file {path}: {e}") from e


def parse_document(document: Any, default_max_message_size: int) -> EntitiesFile:
    if not isinstance(document, dict) or not isinstance(document.get("UserConfig"), dict):
        raise ConfigError('expected an object with "UserConfig" (the emulator Config.json format)')
    namespaces = document["UserConfig"].get("Namespaces")
    if not isinstance(namespaces, list):
        raise ConfigError('"UserConfig.Namespaces" must be a list')
    found = EntitiesFile()
    if len(namespaces) > 1:
        found.warnings.append(
            f"{len(namespaces)} namespaces declared: busd serves one namespace per endpoint, "
            "so the entities of all of them are merged"
        )
    seen: dict[str, str] = {}  # queue and topic names share one namespace

    def claim(name: str, label: str) -> None:
        if name in seen:
            raise ConfigError(
                f"{label} is declared twice (queue and topic names are case-insensitive and "
                f"share one namespace; first as {seen[name]})"
            )
        seen[name] = label

    for ns in namespaces:
        if not isinstance(ns, dict):
            raise ConfigError("each entry of UserConfig.Namespaces must be an object")
        _check_namespace_keys(ns)
        for key in ("Queues", "Topics"):
            if not isinstance(ns.get(key) or [], list):
                raise ConfigError(f"namespace {ns.get('Name')!r}: {key} must be a list")
        for raw in ns.get("Queues") or []:
            queue, queue_warnings = _parse_queue(raw, default_max_message_size)
            claim(queue.name, f"queue {raw.get('Name')!r}")
            found.queues.append(queue)
            found.warnings.extend(queue_warnings)
        for raw in ns.get("Topics") or []:
            topic = _parse_topic(raw, default_max_message_size, found)
            claim(topic.name, f"topic {raw.get('Name')!r}")
            found.topics.append(topic)
        if not isinstance(ns.get("SharedAccessKeys") or [], list):
            raise ConfigError(f"namespace {ns.get('Name')!r}: SharedAccessKeys must be a list")
        for raw in ns.get("SharedAccessKeys") or []:
            name, key = _parse_key(raw)
            if any(name.lower() == known.lower() for known in found.keys):
                raise ConfigError(f"shared access key {name!r} is declared twice")
            found.keys[name] = key
    _check_forwarding(found)
    return found


# What a namespace of the entities file holds: the emulator's keys, and busd's SharedAccessKeys.
NAMESPACE_KEYS = ("Name", "Queues", "Topics", "SharedAccessKeys")


def _check_namespace_keys(ns: dict) -> None:
    """A key the namespace does not have is refused: a misspelt "queues" would otherwise leave
    the namespace without its queues, and busd would start with none."""
    for key in ns:
        if key in NAMESPACE_KEYS:
            continue
        same = [k for k in NAMESPACE_KEYS if k.lower() == str(key).lower()]
        close = same or difflib.get_close_matches(str(key), NAMESPACE_KEYS, n=1)
        expected = (
            f"did you mean {close[0]!r}?"
            if close
            else "a namespace has " + ", ".join(repr(k) for k in NAMESPACE_KEYS)
        )
        raise ConfigError(f"namespace {ns.get('Name')!r}: unknown key {key!r} ({expected})")


def _parse_key(raw: Any) -> tuple[str, SasKey]:
    """`{"KeyName": "reader", "Key": "...", "Rights": ["Listen"]}` (busd's own entry: Service Bus
    namespaces have shared access rules, the emulator has none). No `Rights`: all three."""
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("KeyName"), str)
        or not isinstance(raw.get("Key"), str)
        or not raw["KeyName"]
        or not raw["Key"]
    ):
        raise ConfigError('each SharedAccessKeys entry needs a "KeyName" and a "Key" (strings)')
    name = raw["KeyName"]
    rights = raw.get("Rights")
    if rights is None:
        return name, SasKey(raw["Key"])
    if not isinstance(rights, list) or not rights or not all(isinstance(r, str) for r in rights):
        raise ConfigError(
            f"shared access key {name!r}: Rights must be a list of Send, Listen, Manage"
        )
    try:
        return name, SasKey(raw["Key"], parse_rights(",".join(rights)))
    except ValueError as e:
        raise ConfigError(f"shared access key {name!r}: {e}") from None


def _properties(raw: dict, kind: str, label: str, warnings: list[str]) -> dict[str, Any]:
    """An entry's `Properties` read and checked against busd.entities.properties, by name;
    an empty duration or entity name means not set, as the emulator writes it."""
    props = raw.get("Properties") or {}
    if not isinstance(props, dict):
        raise ConfigError(f"{label}: Properties must be an object")
    known = ep.OF_KIND[kind]
    values: dict[str, Any] = {}
    for key, value in props.items():
        prop = known.get(key)
        if prop is None:
            raise ConfigError(f"{label}: {_unknown(kind, key)}")
        if value is None or (value == "" and prop.type in (pt.DURATION, pt.ENTITY)):
            continue
        try:
            # keys a rule leaves out are kept in the store from start to start (server seeding)
            values[key] = (
                access_rules.normalize(value, fill=False)
                if prop.type == pt.ACCESS_RULES
                else prop.from_json(value)
            )
            prop.check(values[key])
        except ConfigError as e:
            raise ConfigError(f"{label}: {e}") from None
        if key in ep.KEPT_ONLY and values[key] != prop.default:  # Azure's default: nothing to say
            warnings.append(
                f"{label}: property {key!r} is kept and answered back by the "
                "management API, but busd does not act on it"
            )
    try:
        ep.check_together(values)
    except ConfigError as e:
        raise ConfigError(f"{label}: {e}") from None
    return values


def _unknown(kind: str, key: str) -> str:
    """Why a property name is refused: a misspelt one would otherwise leave the entity without
    what it asks for (a queue without sessions), as an unknown FilterType would."""
    other = ep.BY_NAME.get(key)
    if other is not None:
        kinds = " and ".join(f"{k}s" for k in other.kinds)
        return f"property {key!r} is not one of a {kind} (only {kinds} have it)"
    close = difflib.get_close_matches(key, ep.OF_KIND[kind], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown property {key!r}: not a {kind} property of Service Bus{hint}"


def _entity(cls: type, kind: str, raw: dict, label: str, warnings: list[str], **fields: Any) -> Any:
    """The entity of an entry; `fields` holds its names and defaults its properties override."""
    found, extra = ep.record_fields(kind, _properties(raw, kind, label, warnings))
    return cls(**{**fields, **found}, extra=extra)


def _parse_queue(raw: Any, default_max_message_size: int) -> tuple[QueueEntity, list[str]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"each queue must be an object with a Name, got {raw!r}")
    name = normalize_entity_name(raw.get("Name"), "queue")
    warnings: list[str] = []
    queue = _entity(
        QueueEntity,
        "queue",
        raw,
        f"queue {raw['Name']!r}",
        warnings,
        name=name,
        max_message_size=default_max_message_size,
    )
    return queue, warnings


def _parse_topic(raw: Any, default_max_message_size: int, found: EntitiesFile) -> TopicEntity:
    if not isinstance(raw, dict):
        raise ConfigError(f"each topic must be an object with a Name, got {raw!r}")
    name = normalize_entity_name(raw.get("Name"), "topic")
    label = f"topic {raw['Name']!r}"
    topic = _entity(
        TopicEntity,
        "topic",
        raw,
        label,
        found.warnings,
        name=name,
        max_message_size=default_max_message_size,
    )
    subs = raw.get("Subscriptions") or []
    if not isinstance(subs, list):
        raise ConfigError(f"{label}: Subscriptions must be a list")
    seen: dict[str, str] = {}
    for sub_raw in subs:
        sub = _parse_subscription(name, sub_raw, label, found)
        if sub.name in seen:
            raise ConfigError(
                f"{label}: subscription {sub_raw.get('Name')!r} is declared "
                f"twice (names are case-insensitive; first as {seen[sub.name]!r})"
            )
        seen[sub.name] = sub_raw.get("Name")
        found.subscriptions.append(sub)
    return topic


def _parse_subscription(
    topic: str, raw: Any, topic_label: str, found: EntitiesFile
) -> SubscriptionEntity:
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{topic_label}: each subscription must be an object with a Name, got {raw!r}"
        )
    try:
        name = normalize_subscription_name(raw.get("Name"))
    except ConfigError as e:
        raise ConfigError(f"{topic_label}: {e}") from None
    label = f"subscription {raw['Name']!r} of {topic_label}"
    sub = _entity(
        SubscriptionEntity, "subscription", raw, label, found.warnings, topic=topic, name=name
    )
    rules = raw.get("Rules") or []
    if not isinstance(rules, list):
        raise ConfigError(f"{label}: Rules must be a list")
    parsed: dict[str, RuleEntity] = {}
    for rule_raw in rules:
        rule = _parse_rule(sub, rule_raw, label)
        if rule.path in parsed:
            raise ConfigError(
                f"{label}: rule {rule.name!r} is declared twice (rule names are case-insensitive)"
            )
        parsed[rule.path] = rule
    if parsed:
        found.rules[sub.path] = list(parsed.values())
    return sub


def _parse_rule(sub: SubscriptionEntity, raw: Any, sub_label: str) -> RuleEntity:
    if not isinstance(raw, dict):
        raise ConfigError(f"{sub_label}: each rule must be an object with a Name, got {raw!r}")
    try:
        name = check_rule_name(raw.get("Name"))
        rule = rule_from_config(raw)
    except (ConfigError, RuleError) as e:
        raise ConfigError(f"{sub_label}: {e}") from None
    return RuleEntity(sub.topic, sub.name, name, rule_record(rule))


def _check_forwarding(found: EntitiesFile) -> None:
    """A forwarding destination is a queue or topic of the same file (Service Bus refuses a
    source whose destination does not exist); a source naming itself, or requiring sessions,
    is accepted as by Service Bus (docs/design.md §2.15)."""
    names = {q.name for q in found.queues} | {t.name for t in found.topics}
    sources: list[tuple[str, QueueEntity | SubscriptionEntity]] = [
        (f"queue {q.name!r}", q) for q in found.queues
    ] + [(f"subscription {s.path!r}", s) for s in found.subscriptions]
    for label, source in sources:
        for key, target in (
            ("ForwardTo", source.forward_to),
            ("ForwardDeadLetteredMessagesTo", source.forward_dead_lettered_to),
        ):
            if target is not None and target not in names:
                raise ConfigError(f"{label}: {key} {target!r} names no queue or topic of this file")
