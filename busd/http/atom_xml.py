"""The management API's XML (docs/management.md §3): entity descriptions read from what the
SDKs send and written the way the service writes them.

Requests are parsed with defusedxml (no entity expansion, no external entities), namespace-aware
and order-free: each SDK orders elements its own way, Python sends read-only fields back on an
update and .NET re-sends elements it did not know, so anything not writable is ignored.

Answers are built with ElementTree from literal qualified names (`d2p1:ActiveMessageCount`,
`i:type`) rather than namespace URIs: ElementTree would otherwise hoist every namespace
declaration to the root, and the JavaScript SDK needs `CountDetails` to carry exactly one
attribute, its own `xmlns:d2p1` (docs/management.md §3.4). Elements come in the service's order.

Values are plain Python: durations in milliseconds (None: unbounded, TimeSpan.MaxValue on the
wire), flags as bool, counts as int, names as str. A description parses to a dict keyed by
element name holding only the elements sent; a rule to a `RuleDescription`.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from busd.entities import access_rules
from busd.entities import properties as ep
from busd.entities import property_types as pt
from busd.entities.properties import INT32_MAX
from busd.entities.property_types import format_duration
from busd.entities.values import parse_duration_ms
from busd.errors import ConfigError

ATOM = "http://www.w3.org/2005/Atom"
SB = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
SB11 = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
XSD = "http://www.w3.org/2001/XMLSchema"
SER = "http://schemas.microsoft.com/2003/10/Serialization/"

NAMESPACE_NAME = "sbemulatorns"  # the emulator's only namespace
NOT_FOUND_TITLE = "Publicly Listed Services"

ENTRY_TYPE = "application/atom+xml;type=entry;charset=utf-8"
FEED_TYPE = "application/atom+xml;type=feed;charset=utf-8"
ERROR_TYPE = "application/xml; charset=utf-8"


class AtomError(Exception):
    """A request refused with an HTTP status and the service's `<Error>` body."""

    def __init__(self, status: int, detail: str, subcode: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = f"SubCode={subcode}. {detail}" if subcode else detail


# --- descriptions --------------------------------------------------------------------------------
# Elements, values and defaults come from busd.entities.properties; a name of ATOM_ORDER that is
# no property is read-only, filled from the store (and ignored in requests). A forwarding
# destination (ENTITY) is read as a name or URL, kept as the bare name and answered as the URL
# `sb://<host>/<name>`.
DESCRIPTIONS = {
    "queue": "QueueDescription",
    "topic": "TopicDescription",
    "subscription": "SubscriptionDescription",
}


# --- values ------------------------------------------------------------------------------------


def format_time(ms: int | None) -> str:
    """ISO 8601 UTC with milliseconds, as the service writes timestamps."""
    if ms is None:
        return "0001-01-01T00:00:00Z"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


# --- parsing -----------------------------------------------------------------------------------


def _local(tag: Any) -> str:
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _child(element: ET.Element, name: str) -> ET.Element | None:
    for child in element:
        if _local(child.tag) == name:
            return child
    return None


def _text(element: ET.Element | None) -> str | None:
    if element is None:
        return None
    return element.text or ""


def _document(body: bytes) -> ET.Element:
    if not body.strip():
        raise AtomError(400, "the request has no body: an ATOM <entry> is expected")
    try:
        return fromstring(body, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise AtomError(400, f"the request body is refused: {type(exc).__name__}") from None
    except ET.ParseError as exc:
        raise AtomError(400, f"the request body is not well-formed XML: {exc}") from None


def _description(body: bytes, element_name: str) -> ET.Element:
    root = _document(body)
    if _local(root.tag) == element_name:  # a bare description: accepted too
        return root
    if _local(root.tag) != "entry":
        raise AtomError(400, f"expected an ATOM <entry>, got <{_local(root.tag)}>")
    content = _child(root, "content")
    description = _child(content, element_name) if content is not None else None
    if description is None:
        raise AtomError(400, f"the <entry> has no <content> with a <{element_name}>")
    return description


def entity_kind(body: bytes) -> str:
    """`queue` or `topic`: which description a PUT of `/{name}` carries."""
    root = _document(body)
    content = _child(root, "content") if _local(root.tag) == "entry" else None
    inner = content[0] if content is not None and len(content) else root
    kind = {"QueueDescription": "queue", "TopicDescription": "topic"}.get(_local(inner.tag))
    if kind is None:
        raise AtomError(
            400, f"expected a QueueDescription or a TopicDescription, got <{_local(inner.tag)}>"
        )
    return kind


def parse_description(body: bytes, kind: str) -> dict[str, Any]:
    """The writable properties an entry for a queue, topic or subscription sets, by element
    name; a subscription's `DefaultRuleDescription` comes as a RuleDescription."""
    writable = ep.OF_KIND[kind]
    found: dict[str, Any] = {}
    for child in _description(body, DESCRIPTIONS[kind]):
        name = _local(child.tag)
        if name in writable:
            prop = writable[name]
            try:
                if prop.type == pt.ACCESS_RULES:
                    found[name] = prop.from_json(_access_rules(child))
                else:
                    found[name] = prop.from_text(child.text or "")
            except ConfigError as exc:
                raise AtomError(400, str(exc)) from None
        elif kind == "subscription" and name in ("DefaultRuleDescription", "RuleDescription"):
            # .NET and JS send DefaultRuleDescription, Python's model a RuleDescription
            found["DefaultRuleDescription"] = _rule_from_element(child, None)
    return found


def _access_rules(element: ET.Element) -> list[dict[str, Any]]:
    """An `AuthorizationRules` element's rules by field name (entities.access_rules checks them):
    `Rights` as the list of its `AccessRights`, `i:type` as `Type`."""
    rules: list[dict[str, Any]] = []
    for rule in element:
        fields: dict[str, Any] = {}
        rule_type = _xsi_type(rule)
        if rule_type is not None:
            fields["Type"] = rule_type
        for child in rule:
            name = _local(child.tag)
            if name == "Rights":
                fields[name] = [(right.text or "").strip() for right in child]
            else:
                fields[name] = (child.text or "").strip()
        rules.append(fields)
    return rules


# --- rules ---------------------------------------------------------------------------------------

CORRELATION_FIELDS = (
    ("CorrelationId", "correlation_id"),
    ("MessageId", "message_id"),
    ("To", "to"),
    ("ReplyTo", "reply_to"),
    ("Label", "label"),
    ("SessionId", "session_id"),
    ("ReplyToSessionId", "reply_to_session_id"),
    ("ContentType", "content_type"),
)
FILTER_TYPES = ("SqlFilter", "CorrelationFilter", "TrueFilter", "FalseFilter")
ACTION_TYPES = ("EmptyRuleAction", "SqlRuleAction")


@dataclass
class RuleDescription:
    """A rule as the ATOM API carries it. `filter_type` is one of FILTER_TYPES; `sql` the
    filter's expression (SqlFilter); `correlation` the set correlation fields, by snake_case
    name (session_id, label, ...); `properties` the correlation filter's properties or the
    SQL filter's parameters; `action_sql` None for no action."""

    name: str | None = None
    filter_type: str = "TrueFilter"
    sql: str | None = None
    correlation: dict[str, str] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    action_sql: str | None = None
    action_parameters: dict[str, Any] = field(default_factory=dict)


def _xsi_type(element: ET.Element) -> str | None:
    """The local part of an `xsi:type`-like attribute, whatever its prefix (JS sends `p4:type`
    with its own declaration; Python `xsi:type`)."""
    for key, value in element.attrib.items():
        if _local(key) == "type" or key.endswith(":type"):
            return value.rpartition(":")[2]
    return None


def _typed_value(key: str, element: ET.Element) -> Any:
    kind = _xsi_type(element) or "string"
    text = element.text or ""
    try:
        if kind in ("int", "long", "short", "byte", "unsignedInt", "unsignedShort"):
            return int(text)
        if kind in ("double", "float", "decimal"):
            return float(text)
        if kind == "boolean":
            if text.strip().lower() not in ("true", "false"):
                raise ValueError(text)
            return text.strip().lower() == "true"
        if kind == "dateTime":
            return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        if kind == "duration":
            ms = parse_duration_ms(text)
            return dt.timedelta(milliseconds=ms) if ms is not None else dt.timedelta.max
        if kind == "string":
            return text
    except ValueError:
        raise AtomError(400, f"value of {key!r} is not a valid {kind}: {text!r}") from None
    raise AtomError(400, f"value of {key!r} has an unsupported type {kind!r}")


def _key_values(parent: ET.Element | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if parent is None:
        return values
    for pair in parent:
        key = _text(_child(pair, "Key"))
        value = _child(pair, "Value")
        if key is None or value is None:
            raise AtomError(400, f"<{_local(parent.tag)}> holds an entry without Key and Value")
        values[key] = _typed_value(key, value)
    return values


def _rule_from_element(element: ET.Element, name: str | None) -> RuleDescription:
    rule = RuleDescription(name=name or _text(_child(element, "Name")))
    filt = _child(element, "Filter")
    if filt is not None:
        ftype = _xsi_type(filt)
        if ftype is None:
            ftype = "CorrelationFilter" if _child(filt, "SqlExpression") is None else "SqlFilter"
        if ftype not in FILTER_TYPES:
            raise AtomError(400, f"unknown filter type {ftype!r}: one of {', '.join(FILTER_TYPES)}")
        rule.filter_type = ftype
        if ftype == "SqlFilter":
            rule.sql = (_text(_child(filt, "SqlExpression")) or "").strip()
            if not rule.sql:
                raise AtomError(400, "a SqlFilter needs a SqlExpression")
            rule.properties = _key_values(_child(filt, "Parameters"))
        elif ftype == "CorrelationFilter":
            for element_name, key in CORRELATION_FIELDS:
                text = _text(_child(filt, element_name))
                if text is not None:
                    rule.correlation[key] = text
            rule.properties = _key_values(_child(filt, "Properties"))
    action = _child(element, "Action")
    if action is not None:
        atype = _xsi_type(action) or (
            "SqlRuleAction" if _child(action, "SqlExpression") is not None else "EmptyRuleAction"
        )
        if atype not in ACTION_TYPES:
            raise AtomError(400, f"unknown action type {atype!r}: one of {', '.join(ACTION_TYPES)}")
        if atype == "SqlRuleAction":
            rule.action_sql = (_text(_child(action, "SqlExpression")) or "").strip()
            if not rule.action_sql:
                raise AtomError(400, "a SqlRuleAction needs a SqlExpression")
            rule.action_parameters = _key_values(_child(action, "Parameters"))
    return rule


def parse_rule(body: bytes, name: str) -> RuleDescription:
    """The rule an entry with a RuleDescription describes; `name` from the URL wins."""
    return _rule_from_element(_description(body, "RuleDescription"), name)


# --- building ----------------------------------------------------------------------------------


@dataclass
class Runtime:
    """What the store knows of an entity: counts and times (ms since the epoch)."""

    active: int = 0
    dead_letter: int = 0
    scheduled: int = 0
    transfer: int = 0
    transfer_dead_letter: int = 0
    message_count: int = 0
    size_in_bytes: int = 0
    created_ms: int | None = None
    updated_ms: int | None = None
    accessed_ms: int | None = None
    subscription_count: int = 0


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    child = ET.SubElement(parent, tag, attrib)
    if text is not None:
        child.text = text
    return child


def _count_details(parent: ET.Element, rt: Runtime) -> None:
    # One attribute, its own prefix declaration: what the JavaScript SDK accepts.
    counts = _el(parent, "CountDetails", **{"xmlns:d2p1": SB11})
    for name, value in (
        ("ActiveMessageCount", rt.active),
        ("DeadLetterMessageCount", rt.dead_letter),
        ("ScheduledMessageCount", rt.scheduled),
        ("TransferMessageCount", rt.transfer),
        ("TransferDeadLetterMessageCount", rt.transfer_dead_letter),
    ):
        _el(counts, f"d2p1:{name}", str(value))


def _runtime_field(parent: ET.Element, name: str, rt: Runtime) -> None:
    if name == "CountDetails":
        _count_details(parent, rt)
    elif name == "EntityAvailabilityStatus":
        _el(parent, name, "Available")
    elif name in ("CreatedAt", "UpdatedAt", "AccessedAt"):
        _el(parent, name, format_time(getattr(rt, name[:-2].lower() + "_ms")))
    else:
        value = {
            "SizeInBytes": rt.size_in_bytes,
            "MessageCount": rt.message_count,
            "SubscriptionCount": rt.subscription_count,
        }[name]
        _el(parent, name, str(value))


def description(
    kind: str, properties: Mapping[str, Any], rt: Runtime, host: str = "localhost"
) -> ET.Element:
    """A Queue/Topic/SubscriptionDescription in the service's element order: `properties`
    over the defaults, the store's counts and times in their places; forwarding destinations
    as URLs on `host` (the namespace's host and port, as the client addressed it)."""
    of_kind = ep.OF_KIND[kind]
    values = {**ep.defaults(kind), **properties}
    root = ET.Element(DESCRIPTIONS[kind], {"xmlns": SB, "xmlns:i": XSI})
    for name in ep.ATOM_ORDER[kind]:
        prop = of_kind.get(name)
        if prop is None:
            _runtime_field(root, name, rt)
        elif prop.type == pt.ACCESS_RULES:
            _access_rules_element(root, name, values.get(name) or ())
        elif prop.own and values.get(name) == prop.default:
            continue  # busd's own, as good as unset: the service's description
        elif values.get(name) is not None or (name in values and prop.type == pt.DURATION):
            _el(root, name, _property_text(prop, values[name], host))
    return root


def _access_rules_element(parent: ET.Element, name: str, rules: Iterable[dict[str, Any]]) -> None:
    """`AuthorizationRules` as the service writes them: one `AuthorizationRule` of `i:type`
    SharedAccessAuthorizationRule per rule, its fields in the service's order."""
    holder = _el(parent, name)
    for rule in rules:
        element = _el(holder, "AuthorizationRule", **{"i:type": access_rules.RULE_TYPE})
        for field_name in access_rules.FIELDS:
            value = rule.get(field_name)
            if field_name == "Rights":
                rights = _el(element, field_name)
                for right in value or ():
                    _el(rights, "AccessRights", right)
            elif field_name in ("CreatedTime", "ModifiedTime"):
                _el(element, field_name, format_time(value))
            elif value is not None:
                _el(element, field_name, str(value))


def _property_text(prop: pt.Property, value: Any, host: str) -> str:
    if prop.type == pt.ENTITY:
        # The service answers the destination's URL on the namespace's host, as the SDKs
        # send it (their tests compare the URL's end: `<host>/<name>`).
        return f"sb://{host}/{value}"
    return prop.to_text(value)


def _value_element(parent: ET.Element, key: str, value: Any) -> None:
    pair = _el(parent, "KeyValueOfstringanyType")
    _el(pair, "Key", key)
    namespace = XSD
    if isinstance(value, bool):
        kind, text = "boolean", "true" if value else "false"
    elif isinstance(value, int):
        kind, text = ("int" if -(2**31) <= value <= INT32_MAX else "long"), str(value)
    elif isinstance(value, float):
        kind, text = "double", repr(value)
    elif isinstance(value, dt.datetime):
        kind, text = "dateTime", value.isoformat().replace("+00:00", "Z")
    elif isinstance(value, dt.timedelta):
        ms = None if value == dt.timedelta.max else int(value.total_seconds() * 1000)
        kind, text, namespace = "duration", format_duration(ms), SER
    else:
        kind, text = "string", str(value)
    # `i:type` literally, its prefix four characters long: the JavaScript SDK reads the
    # attribute by that name and drops the first five characters of its value.
    _el(pair, "Value", text, **{"i:type": f"d6p1:{kind}", "xmlns:d6p1": namespace})


def rule_description(rule: RuleDescription, created_ms: int | None) -> ET.Element:
    root = ET.Element("RuleDescription", {"xmlns": SB, "xmlns:i": XSI})
    filt = _el(root, "Filter", **{"i:type": rule.filter_type})
    if rule.filter_type == "CorrelationFilter":
        for element_name, key in CORRELATION_FIELDS:
            if rule.correlation.get(key) is not None:
                _el(filt, element_name, rule.correlation[key])
        props = _el(filt, "Properties")
        for key, value in rule.properties.items():
            _value_element(props, key, value)
    else:
        # True and False filters carry their expression too: the JavaScript SDK tells SQL
        # filters from correlation filters by it.
        sql = {"TrueFilter": "1=1", "FalseFilter": "1=0"}.get(rule.filter_type, rule.sql or "")
        _el(filt, "SqlExpression", sql)
        _el(filt, "CompatibilityLevel", "20")
        if rule.filter_type == "SqlFilter" and rule.properties:
            params = _el(filt, "Parameters")
            for key, value in rule.properties.items():
                _value_element(params, key, value)
    if rule.action_sql is None:
        _el(root, "Action", **{"i:type": "EmptyRuleAction"})
    else:
        action = _el(root, "Action", **{"i:type": "SqlRuleAction"})
        _el(action, "SqlExpression", rule.action_sql)
        _el(action, "CompatibilityLevel", "20")
        if rule.action_parameters:
            params = _el(action, "Parameters")
            for key, value in rule.action_parameters.items():
                _value_element(params, key, value)
    _el(root, "CreatedAt", format_time(created_ms))
    _el(root, "Name", rule.name or "")
    return root


def entry(
    url: str,
    title: str,
    content: ET.Element,
    *,
    updated_ms: int | None = None,
    published_ms: int | None = None,
    author: str | None = NAMESPACE_NAME,
    base: str | None = None,
) -> ET.Element:
    """An ATOM entry; `base` for one inside a feed (whose xmlns it inherits)."""
    root = ET.Element("entry", {"xml:base": base} if base else {"xmlns": ATOM})
    _el(root, "id", url)
    _el(root, "title", title, type="text")
    _el(root, "published", format_time(published_ms or updated_ms))
    _el(root, "updated", format_time(updated_ms))
    if author:
        _el(_el(root, "author"), "name", author)
    _el(root, "link", rel="self", href=url)
    _el(root, "content", type="application/xml").append(content)
    return root


def feed(
    title: str,
    self_url: str,
    entries: Iterable[ET.Element],
    next_url: str | None = None,
    now_ms: int | None = None,
) -> ET.Element:
    """A list: self link, then (when more entries exist) the next link, then the entries."""
    root = ET.Element("feed", {"xmlns": ATOM})
    _el(root, "title", title, type="text")
    _el(root, "id", self_url)
    _el(root, "updated", format_time(now_ms if now_ms is not None else _now_ms()))
    _el(root, "link", rel="self", href=self_url)
    if next_url:
        _el(root, "link", rel="next", href=next_url)
    root.extend(entries)
    return root


def not_found_feed(now_ms: int | None = None) -> ET.Element:
    """What the service answers, with 200, for a queue, topic or subscription that does not
    exist: the Go SDK (KEDA, Dapr) recognises it by this exact title."""
    root = ET.Element("feed", {"xmlns": ATOM})
    _el(root, "title", NOT_FOUND_TITLE, type="text")
    _el(
        root,
        "subtitle",
        "This is the list of publicly-listed services currently available.",
        type="text",
    )
    _el(root, "id", f"uuid:{uuid.uuid4()};id=1")
    _el(root, "updated", format_time(now_ms if now_ms is not None else _now_ms()))
    _el(root, "generator", "Service Bus 1.1")
    return root


def namespace_info(url: str, created_ms: int, name: str = NAMESPACE_NAME) -> ET.Element:
    info = ET.Element("NamespaceInfo", {"xmlns": SB, "xmlns:i": XSI})
    _el(info, "CreatedTime", format_time(created_ms))
    # Premium: the tier whose rules busd follows (messages up to 100 MiB, a per-entity
    # MaxMessageSizeInKilobytes), so the SDKs expect what busd accepts (docs/management.md §3.1).
    _el(info, "MessagingSKU", "Premium")
    _el(info, "MessagingUnits", "1")
    _el(info, "ModifiedTime", format_time(created_ms))
    _el(info, "Name", name)
    _el(info, "NamespaceType", "Messaging")
    return entry(url, name, info, updated_ms=created_ms, author=name)


def error(status: int, detail: str) -> bytes:
    root = ET.Element("Error")
    _el(root, "Code", str(status))
    _el(root, "Detail", detail)
    return serialize(root)


def serialize(root: ET.Element) -> bytes:
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _now_ms() -> int:
    return int(time.time() * 1000)
