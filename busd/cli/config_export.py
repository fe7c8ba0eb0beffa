"""`busd config export`: a running busd's namespace as the entities file (the emulator's
Config.json) that `busd serve --config` reads back to the same entities, docs/topology.md §1.

It reads what the SDKs' administration clients read, the management (ATOM) API, with the
tools' key (busd.cli.output.tool_key: BUSD_SAS_KEY, whose key name may name a namespace), so it
sees a namespace as they do and works against busd in a container. Each entity is written
with the properties the emulator's own Config.json gives it, and every other property that
is not its default; a subscription's rules unless they are the lone `$Default` TrueFilter
every subscription starts with. What the file cannot hold (a rule's SQL parameters) is
refused, naming the rule, rather than written as a different rule.
"""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from busd.client.atom import ATOM, SB, AtomClient, entity_path
from busd.client.http import ToolError
from busd.entities import properties as ep
from busd.entities import property_types as pt
from busd.errors import EXIT_INVALID
from busd.http import atom_xml as ax
from busd.rules.model import DEFAULT_RULE_NAME

PAGE = 1000  # entries per request: the management API's largest $top
# What the emulator's own Config.json sets for each kind: written always, so the file reads
# as the emulator's does.
EMULATOR_PROPERTIES = {
    kind: frozenset(p.name for p in ep.PROPERTIES if kind in p.kinds and kind[0] in p.emulator)
    for kind in ep.KINDS
}


@dataclass
class Export:
    """The entities file (`document`) and what the user should know (`notes`)."""

    document: dict[str, Any]
    notes: list[str]


def export_namespace(client: AtomClient) -> Export:
    """The namespace `client` reaches, as an entities file."""
    notes = [
        "the namespace's own keys (--sas-key, SharedAccessKeys) are not exported: the "
        "management API does not answer them"
    ]
    queues = [
        {"Name": name, "Properties": _properties(ep.QUEUE, entry)}
        for name, entry in _feed(client, "$Resources/Queues")
    ]
    topics = []
    for name, entry in _feed(client, "$Resources/Topics"):
        subscriptions = []
        for sub_name, sub_entry in _feed(client, entity_path(name) + "/Subscriptions"):
            sub: dict[str, Any] = {
                "Name": sub_name,
                "Properties": _properties(ep.SUBSCRIPTION, sub_entry),
            }
            rules = [
                _rule(f"{name}/{sub_name}/{rule_name}", ax.parse_rule(_bytes(e), rule_name))
                for rule_name, e in _feed(client, entity_path(name, sub_name) + "/Rules")
            ]
            if not rules:  # the file's "no rules" is `$Default`: one that takes nothing
                notes.append(
                    f"subscription {name}/{sub_name} has no rule: written with a $Default "
                    "rule that matches nothing (1=0), as the file cannot say none"
                )
                rules = [_sql_rule(DEFAULT_RULE_NAME, "1=0")]
            if rules != [_sql_rule(DEFAULT_RULE_NAME, "1=1")]:
                sub["Rules"] = rules
            subscriptions.append(sub)
        topics.append(
            {
                "Name": name,
                "Properties": _properties(ep.TOPIC, entry),
                "Subscriptions": subscriptions,
            }
        )
    namespace = {"Name": _namespace_name(client), "Queues": queues, "Topics": topics}
    document = {"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "File"}}}
    return Export(document, notes)


def _bytes(entry: ET.Element) -> bytes:
    return ET.tostring(entry, encoding="utf-8")


def _feed(client: AtomClient, path: str) -> list[tuple[str, ET.Element]]:
    """(title, entry) of every entry of a list, a page at a time."""
    found: list[tuple[str, ET.Element]] = []
    while True:
        root = client.call("GET", path, query=f"$skip={len(found)}&$top={PAGE}")
        entries = root.findall(f"{{{ATOM}}}entry") if root is not None else []
        found += [(e.findtext(f"{{{ATOM}}}title") or "", e) for e in entries]
        if len(entries) < PAGE:
            return found


def _namespace_name(client: AtomClient) -> str:
    root = client.call("GET", "$namespaceinfo")
    name = root.findtext(f".//{{{SB}}}Name") if root is not None else None
    return name or ax.NAMESPACE_NAME


def _properties(kind: str, entry: ET.Element) -> dict[str, Any]:
    """An answered description's properties as the file writes them, by name."""
    values = ax.parse_description(_bytes(entry), kind)
    out: dict[str, Any] = {}
    for name, prop in sorted(ep.OF_KIND[kind].items()):
        value = values.get(name, prop.default)
        if prop.type == pt.ACCESS_RULES:
            if value:
                out[name] = prop.to_json(value)
        elif name in EMULATOR_PROPERTIES[kind] or value != prop.default:
            out[name] = prop.to_json(value)
    return out


def _sql_rule(name: str, expression: str) -> dict[str, Any]:
    return {
        "Name": name,
        "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": expression}},
    }


def _rule(path: str, rule: ax.RuleDescription) -> dict[str, Any]:
    """A rule as the file's `Rules[]` entry (busd.rules.model.rule_from_config reads it)."""
    name = rule.name or path.rsplit("/", 1)[-1]
    if rule.filter_type == "CorrelationFilter":
        fields: dict[str, Any] = {
            element: rule.correlation[key]
            for element, key in ax.CORRELATION_FIELDS
            if rule.correlation.get(key) is not None
        }
        if rule.properties:
            fields["Properties"] = {
                key: _scalar(path, "its correlation filter's property", key, value)
                for key, value in rule.properties.items()
            }
        out: dict[str, Any] = {
            "Name": name,
            "Properties": {"FilterType": "Correlation", "CorrelationFilter": fields},
        }
    else:
        if rule.filter_type == "SqlFilter" and rule.properties:
            raise _unwritable(path, "its SQL filter has parameters")
        sql = {"TrueFilter": "1=1", "FalseFilter": "1=0"}.get(rule.filter_type, rule.sql or "")
        out = _sql_rule(name, sql)
    if rule.action_sql is not None:
        if rule.action_parameters:
            raise _unwritable(path, "its SQL action has parameters")
        out["Properties"]["Action"] = {"SqlExpression": rule.action_sql}
    return out


def _scalar(path: str, what: str, key: str, value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.timedelta)):
        raise _unwritable(path, f"{what} {key!r} is a {type(value).__name__}")
    return value


def _unwritable(path: str, why: str) -> ToolError:
    return ToolError(
        f"rule {path}: {why}, which the entities file (Config.json) cannot hold", EXIT_INVALID
    )
