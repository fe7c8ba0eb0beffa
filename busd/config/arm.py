"""`busd config import`: an ARM template's Service Bus resources as the entities file
(the emulator's Config.json), docs/topology.md §2.

Read: Microsoft.ServiceBus/namespaces with their queues, topics, subscriptions, rules and
authorization rules, nested in their parent's `resources` or at the top level named
`ns/queue`, with `condition` and `copy` loops; expressions through busd.config.arm_expressions.
Properties map by name onto busd.entities.properties (ARM's `lockDuration` is the file's
`LockDuration`), so every property busd keeps is read and nothing else is. What busd cannot
honour is refused, one line naming the resource and the property: a misread template would
otherwise give tests a namespace unlike the one deployed. Other resource providers' resources
(a storage account beside the namespace), and the Service Bus resources that change no entity
and no key (network rules, a Geo-DR alias: `SKIPPED`, as the portal's exports carry them), are
left out with a note each.

As Azure does, a subscription keeps its `$Default` rule (TrueFilter) beside the rules the
template declares, unless the template declares a rule named `$Default` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from busd.config.arm_expressions import Scope, TemplateError
from busd.config.entities_file import parse_document
from busd.config.settings import DEFAULT_MAX_MESSAGE_SIZE
from busd.entities import access_rules
from busd.entities import properties as ep
from busd.entities import property_types as pt
from busd.errors import ConfigError
from busd.rules.model import DEFAULT_RULE_NAME

PROVIDER = "microsoft.servicebus"
NAMESPACES = "microsoft.servicebus/namespaces"
# the kinds of Service Bus resource read, by their full type lower-cased
KINDS = {
    NAMESPACES: "namespace",
    f"{NAMESPACES}/queues": "queue",
    f"{NAMESPACES}/topics": "topic",
    f"{NAMESPACES}/topics/subscriptions": "subscription",
    f"{NAMESPACES}/topics/subscriptions/rules": "rule",
    f"{NAMESPACES}/authorizationrules": "namespace key",
    f"{NAMESPACES}/queues/authorizationrules": "entity key",
    f"{NAMESPACES}/topics/authorizationrules": "entity key",
}
# Service Bus resources (ARM reference, 2025-05-01-preview and older) that change neither the
# entities nor the keys busd serves, with what the note says of them: the portal exports them
# (`networkRuleSets` `default` in every namespace), so they are skipped, not refused.
_NETWORK = "network access rules: busd serves whoever reaches its ports (--host)"
SKIPPED = {
    f"{NAMESPACES}/networkrulesets": _NETWORK,
    f"{NAMESPACES}/ipfilterrules": _NETWORK,
    f"{NAMESPACES}/virtualnetworkrules": _NETWORK,
    f"{NAMESPACES}/privateendpointconnections": _NETWORK,
    f"{NAMESPACES}/networksecurityperimeterconfigurations": _NETWORK,
    f"{NAMESPACES}/disasterrecoveryconfigs": "a Geo-DR alias pairs Azure namespaces",
    f"{NAMESPACES}/disasterrecoveryconfigs/authorizationrules": "a Geo-DR alias's keys are "
    "its namespace's",
    f"{NAMESPACES}/migrationconfigurations": "a migration from Standard to Premium",
}
# A resource's members that say how Azure deploys it, not what busd serves: never evaluated.
DEPLOYMENT_MEMBERS = frozenset(
    ("apiversion", "location", "tags", "dependson", "comments", "metadata", "identity", "scope",
     "zones", "sku", "kind", "plan", "existing")
)  # fmt: skip
# Read-only properties an exported template may carry: Azure ignores them, so does busd.
READ_ONLY = frozenset(
    ("countDetails", "createdAt", "updatedAt", "accessedAt", "sizeInBytes", "messageCount",
     "subscriptionCount", "serviceBusEndpoint", "metricId", "provisioningState")
)  # fmt: skip
# Namespace properties that describe Azure's infrastructure: nothing busd serves changes.
NAMESPACE_INFRASTRUCTURE = frozenset(
    ("zoneRedundant", "minimumTlsVersion", "publicNetworkAccess", "premiumMessagingPartitions",
     "alternateName", "encryption", "privateEndpointConnections", "disableLocalAuth",
     "geoDataReplication", "platformCapabilities")
)  # fmt: skip
# A namespace's read-only properties (its `status` is Azure's provisioning state, not an
# entity's Status).
NAMESPACE_READ_ONLY = READ_ONLY | {"status"}
# A subscription property Azure's schema has and Service Bus ignores.
IGNORED_SUBSCRIPTION = frozenset(("duplicateDetectionHistoryTimeWindow",))
CORRELATION_FIELDS = {
    "correlationId": "CorrelationId",
    "messageId": "MessageId",
    "to": "To",
    "replyTo": "ReplyTo",
    "label": "Label",
    "sessionId": "SessionId",
    "replyToSessionId": "ReplyToSessionId",
    "contentType": "ContentType",
}
ROOT_KEY = "RootManageSharedAccessKey"
# Azure's limit on the copies of one copy loop
MAX_COPIES = 800


@dataclass
class _Namespace:
    name: str
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)  # lower name -> entry
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "Name": self.name,
            "Queues": list(self.queues.values()),
            "Topics": list(self.topics.values()),
        }
        if self.keys:
            out["SharedAccessKeys"] = list(self.keys.values())
        return out


@dataclass
class Conversion:
    """The entities file (`document`) and what the user should know (`notes`)."""

    document: dict[str, Any]
    notes: list[str]


def convert(
    template: Any,
    parameters: Mapping[str, Any] | None = None,
    keys: Mapping[str, str] | None = None,
) -> Conversion:
    """The entities file of an ARM template; `parameters` by name override the template's
    defaults, `keys` give namespace authorization rules their keys (by KeyName). Raises
    TemplateError, one line naming the resource and property, for what cannot be mapped."""
    if not isinstance(template, dict):
        raise TemplateError("an ARM template is a JSON object")
    resources = template.get("resources")
    if isinstance(resources, dict):  # languageVersion 2.0: resources by symbolic name
        resources = list(resources.values())
    if not isinstance(resources, list):
        raise TemplateError('the template has no "resources" list')
    for what in ("parameters", "variables"):
        if not isinstance(template.get(what) or {}, dict):
            raise TemplateError(f'the template\'s "{what}" must be an object')
    given = dict(parameters or {})
    declared = template.get("parameters") or {}
    for name in given:
        if not any(name.lower() == k.lower() for k in declared):
            raise TemplateError(f"--parameter {name}: the template declares no such parameter")
    reader = _Reader(Scope(declared, given, template.get("variables") or {}), dict(keys or {}))
    try:
        for raw in resources:
            reader.resource(raw, None)
        reader.finish()
    except RecursionError:  # values, expressions or variables nested thousands deep
        raise TemplateError("the template nests values or expressions too deeply") from None
    document = {
        "UserConfig": {
            "Namespaces": [ns.document() for ns in reader.namespaces.values()],
            "Logging": {"Type": "File"},
        }
    }
    try:  # what busd serve would say of it: names, bounds, forwarding destinations
        parse_document(document, DEFAULT_MAX_MESSAGE_SIZE)
    except ConfigError as exc:
        raise TemplateError(f"the converted template would not be served: {exc}") from None
    return Conversion(document, reader.notes)


@dataclass
class _Resource:
    kind: str
    names: list[str]  # its name's segments, the namespace's first
    label: str  # how errors name it: its type and full name
    properties: dict[str, Any]


class _Reader:
    def __init__(self, scope: Scope, keys: dict[str, str]) -> None:
        self.scope = scope
        self.keys = keys
        self.used_keys: set[str] = set()
        self.namespaces: dict[str, _Namespace] = {}
        self.notes: list[str] = []
        # subscription path -> its rules, declared before or after it
        self.rules: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.entity_keys: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        # resources by kind, read once all are known: a child may come before its parent
        self.pending: dict[str, list[_Resource]] = {}

    # --- resources -----------------------------------------------------------------------------
    def resource(self, raw: Any, parent: tuple[str, list[str]] | None) -> None:
        if not isinstance(raw, dict):
            raise TemplateError(f"each resource must be an object, got {raw!r}")
        rtype = raw.get("type")
        relative = parent is not None and isinstance(rtype, str) and "/" not in rtype
        if not relative and not (
            isinstance(rtype, str) and rtype.lower().startswith(PROVIDER + "/")
        ):  # left unevaluated: its name may well use uniqueString()
            self.notes.append(
                f"left out {rtype} {raw.get('name')!r}: only Service Bus resources are read"
            )
            return
        copy = raw.get("copy")
        if copy is None:
            self._one(raw, parent)
            return
        if not isinstance(copy, dict) or "count" not in copy:
            raise TemplateError(f"resource {raw.get('name')!r}: copy needs a name and a count")
        count = self.scope.evaluate(copy["count"], f"resource {raw.get('name')!r}: copy count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise TemplateError(f"resource {raw.get('name')!r}: copy count {count!r} is no count")
        if count > MAX_COPIES:
            raise TemplateError(
                f"resource {raw.get('name')!r}: copy count {count} is more than Azure's "
                f"{MAX_COPIES} copies of one loop"
            )
        loop = str(copy.get("name", "")).lower()
        for index in range(count):
            self.scope.copy_index.update({loop: index, "": index})
            try:
                self._one(raw, parent)
            finally:
                self.scope.copy_index.pop(loop, None)
                self.scope.copy_index.pop("", None)

    def _one(self, raw: dict[str, Any], parent: tuple[str, list[str]] | None) -> None:
        where = f"resource {raw.get('name')!r}"
        if "condition" in raw and not self.scope.evaluate(raw["condition"], f"{where}: condition"):
            return
        rtype = raw.get("type")
        name = self.scope.evaluate(raw.get("name"), f"{where}: name")
        if not isinstance(rtype, str) or not isinstance(name, str) or not rtype or not name:
            raise TemplateError(f"{where}: each resource needs a type and a name (strings)")
        full_type, names = _full_name(rtype, name, parent, where)
        label = f"{full_type} {'/'.join(names)!r}"
        skipped = SKIPPED.get(full_type.lower())
        if skipped is not None:  # its children (a Geo-DR alias's keys) go with it
            self.notes.append(f"skipped {label}: {skipped}")
            return
        kind = KINDS.get(full_type.lower())
        if kind is None:
            raise TemplateError(
                f"{label}: busd cannot serve this kind of resource (it serves namespaces, "
                "queues, topics, subscriptions, rules and authorization rules)"
            )
        if len(names) != full_type.count("/"):
            raise TemplateError(
                f"{label}: its name must have {full_type.count('/')} segment(s) separated "
                f"by '/', one per level of {full_type}"
            )
        unknown = sorted(
            k
            for k in raw
            if k.lower() not in DEPLOYMENT_MEMBERS
            and k.lower() not in ("type", "name", "properties", "resources", "copy", "condition")
        )
        if unknown:
            raise TemplateError(f"{label}: unknown member {unknown[0]!r} of a resource")
        properties = self.scope.evaluate(raw.get("properties") or {}, f"{label}: properties")
        if not isinstance(properties, dict):
            raise TemplateError(f"{label}: properties must be an object")
        if kind == "namespace":
            self._namespace_properties(_Resource(kind, names, label, properties))
        self._namespace(names[0])
        self.pending.setdefault(kind, []).append(_Resource(kind, names, label, properties))
        children = raw.get("resources") or []
        if isinstance(children, dict):
            children = list(children.values())
        if not isinstance(children, list):
            raise TemplateError(f"{label}: its resources must be a list")
        for child in children:
            self.resource(child, (full_type, names))

    def _add(self, res: _Resource) -> None:
        ns = self._namespace(res.names[0])
        if res.kind == "queue":
            entry = {"Name": res.names[1], "Properties": self._entity("queue", res)}
            _claim(ns.queues, ns.topics, res, entry)
        elif res.kind == "topic":
            entry = {"Name": res.names[1], "Properties": self._entity("topic", res)}
            entry["Subscriptions"] = []
            _claim(ns.topics, ns.queues, res, entry)
        elif res.kind == "subscription":
            self._subscription(ns, res)
        elif res.kind == "rule":
            path = _key(res.names[:3])
            self.rules.setdefault(path, []).append(_rule(res))
        elif res.kind == "namespace key":
            self._namespace_key(ns, res)
        else:
            path = _key(res.names[:2])
            self.entity_keys.setdefault(path, []).append(_entity_key(res))

    def _namespace(self, name: str) -> _Namespace:
        return self.namespaces.setdefault(name.lower(), _Namespace(name))

    def _namespace_properties(self, res: _Resource) -> None:
        for key, value in res.properties.items():
            if key == "disableLocalAuth" and value is True:
                raise TemplateError(
                    f"{res.label}: property 'disableLocalAuth' true cannot be honoured: "
                    "busd authenticates with shared access keys only"
                )
            if key not in NAMESPACE_INFRASTRUCTURE and key not in NAMESPACE_READ_ONLY:
                raise TemplateError(
                    f"{res.label}: property {key!r} is not one busd can serve for a namespace"
                )

    def _namespace_key(self, ns: _Namespace, res: _Resource) -> None:
        name = res.names[1]
        rights = _rights(res)
        if name.lower() in (k.lower() for k in ns.keys):
            raise TemplateError(f"{res.label}: declared twice")
        given = next((v for k, v in self.keys.items() if k.lower() == name.lower()), None)
        if given is not None:
            self.used_keys.add(name.lower())
        elif name == ROOT_KEY:
            self.notes.append(
                f"{res.label}: left to busd's own {ROOT_KEY} (--sas-key, SAS_KEY_VALUE by "
                f"default); give --key {ROOT_KEY}=KEY to set it here"
            )
            return
        else:
            given = access_rules.new_key()
            self.notes.append(
                f"{res.label}: Azure makes its key at deployment; busd's is made now, in the "
                f"output's SharedAccessKeys (give --key {name}=KEY to choose it)"
            )
        ns.keys[name] = {"KeyName": name, "Key": given, "Rights": rights}

    def _entity(self, kind: str, res: _Resource) -> dict[str, Any]:
        """The entry's Properties: ARM's camelCase names as the file's, values checked."""
        out: dict[str, Any] = {}
        known = ep.OF_KIND[kind]
        for key, value in res.properties.items():
            if key in READ_ONLY:
                continue
            if kind == "subscription" and key in IGNORED_SUBSCRIPTION:
                self.notes.append(f"{res.label}: ignored {key!r}, as Service Bus ignores it")
                continue
            if kind == "subscription" and key in ("isClientAffine", "clientAffineProperties"):
                if value in (False, None, {}):
                    continue
                raise TemplateError(
                    f"{res.label}: property {key!r} (Premium's JMS shared subscriptions) "
                    "cannot be honoured: busd serves AMQP clients of Service Bus's SDKs"
                )
            name = key[:1].upper() + key[1:]
            prop = known.get(name)
            if prop is None or prop.type == pt.ACCESS_RULES:
                raise TemplateError(f"{res.label}: property {key!r}: {_unknown(kind, name)}")
            try:
                parsed = prop.from_json(value)
                prop.check(parsed)
            except ConfigError as exc:
                raise TemplateError(f"{res.label}: property {key!r}: {exc}") from None
            out[name] = prop.to_json(parsed)
        return out

    def _subscription(self, ns: _Namespace, res: _Resource) -> None:
        topic = ns.topics.get(res.names[1].lower())
        if topic is None:  # deployed into an existing topic: busd would not have it
            raise TemplateError(
                f"{res.label}: its topic {res.names[1]!r} is not declared in the template"
            )
        name = res.names[2]
        if any(s["Name"].lower() == name.lower() for s in topic["Subscriptions"]):
            raise TemplateError(f"{res.label}: declared twice")
        topic["Subscriptions"].append(
            {"Name": name, "Properties": self._entity("subscription", res)}
        )

    # --- after every resource ------------------------------------------------------------------
    def finish(self) -> None:
        for kind in ("queue", "topic", "subscription", "rule", "namespace key", "entity key"):
            for res in self.pending.get(kind, ()):
                self._add(res)
        unused = sorted(set(k.lower() for k in self.keys) - self.used_keys)
        if unused:
            raise TemplateError(f"--key {unused[0]}: the template declares no such namespace rule")
        for (ns_name, topic_name, sub_name), rules in self.rules.items():
            sub = self._find_subscription(ns_name, topic_name, sub_name)
            if sub is None:
                raise TemplateError(
                    f"rule {rules[0]['Name']!r}: subscription {ns_name}/{topic_name}/{sub_name} "
                    "is not declared in the template"
                )
            names = [r["Name"].lower() for r in rules]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:
                raise TemplateError(f"rule {twice!r} of {topic_name}/{sub_name} is declared twice")
            if DEFAULT_RULE_NAME.lower() not in names:  # Azure keeps it beside them
                rules = [_true_rule(), *rules]
            sub["Rules"] = rules
        for (ns_name, entity_name, _), rules in self.entity_keys.items():
            ns = self.namespaces[ns_name]
            entity = ns.queues.get(entity_name) or ns.topics.get(entity_name)
            if entity is None:
                raise TemplateError(
                    f"authorization rule {rules[0]['KeyName']!r}: {ns_name}/{entity_name} "
                    "is not declared in the template"
                )
            entity["Properties"]["AuthorizationRules"] = rules

    def _find_subscription(self, ns: str, topic: str, sub: str) -> dict[str, Any] | None:
        found = self.namespaces.get(ns)
        entry = found.topics.get(topic) if found else None
        subs = entry["Subscriptions"] if entry else []
        return next((s for s in subs if s["Name"].lower() == sub), None)


# --- names -----------------------------------------------------------------------------------


def _full_name(
    rtype: str, name: str, parent: tuple[str, list[str]] | None, where: str
) -> tuple[str, list[str]]:
    """(full type, name segments) of a resource, nested in `parent` or not."""
    names = name.split("/")
    if parent is None:
        return rtype, names
    parent_type, parent_names = parent
    full_type = rtype if "/" in rtype else f"{parent_type}/{rtype}"
    if len(names) == full_type.count("/"):  # a full name, given inside its parent
        return full_type, names
    if len(names) != 1:
        raise TemplateError(f"{where}: a nested resource's name is one segment, got {name!r}")
    return full_type, [*parent_names, name]


def _key(names: list[str]) -> tuple[str, str, str]:
    lowered = [n.lower() for n in names] + ["", ""]
    return lowered[0], lowered[1], lowered[2]


def _claim(
    into: dict[str, dict[str, Any]],
    other: dict[str, dict[str, Any]],
    res: _Resource,
    entry: dict[str, Any],
) -> None:
    key = res.names[1].lower()
    if key in into or key in other:
        raise TemplateError(
            f"{res.label}: declared twice (queue and topic names share one namespace)"
        )
    into[key] = entry


def _unknown(kind: str, name: str) -> str:
    other = ep.BY_NAME.get(name)
    if other is not None and other.type != pt.ACCESS_RULES:
        kinds = " and ".join(f"{k}s" for k in other.kinds)
        return f"not one of a {kind} (only {kinds} have it)"
    return f"not a {kind} property busd serves"


# --- rules and keys ----------------------------------------------------------------------------


def _true_rule() -> dict[str, Any]:
    return {
        "Name": DEFAULT_RULE_NAME,
        "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}},
    }


def _rule(res: _Resource) -> dict[str, Any]:
    props = res.properties
    known = {"filterType", "sqlFilter", "correlationFilter", "action"}
    unknown = sorted(set(props) - known)
    if unknown:
        raise TemplateError(f"{res.label}: property {unknown[0]!r} is not one of a rule")
    kind = props.get("filterType")
    if kind is None:
        kind = "CorrelationFilter" if "correlationFilter" in props else "SqlFilter"
    out: dict[str, Any] = {}
    if kind == "SqlFilter":
        sql = _object(res, props, "sqlFilter")
        expression = sql.get("sqlExpression")
        if not isinstance(expression, str) or not expression.strip():
            raise TemplateError(f"{res.label}: property 'sqlFilter.sqlExpression' is required")
        _only(
            res, "sqlFilter", sql, {"sqlExpression", "compatibilityLevel", "requiresPreprocessing"}
        )
        out = {"FilterType": "Sql", "SqlFilter": {"SqlExpression": expression}}
    elif kind == "CorrelationFilter":
        corr = _object(res, props, "correlationFilter")
        _only(
            res,
            "correlationFilter",
            corr,
            {*CORRELATION_FIELDS, "properties", "requiresPreprocessing"},
        )
        fields: dict[str, Any] = {
            CORRELATION_FIELDS[k]: v
            for k, v in corr.items()
            if k in CORRELATION_FIELDS and v is not None
        }
        user = corr.get("properties") or {}
        if not isinstance(user, dict):
            raise TemplateError(
                f"{res.label}: property 'correlationFilter.properties' must be an object"
            )
        if user:
            fields["Properties"] = user
        out = {"FilterType": "Correlation", "CorrelationFilter": fields}
    else:
        raise TemplateError(
            f"{res.label}: property 'filterType' is {kind!r}: SqlFilter or CorrelationFilter"
        )
    action = props.get("action")
    if action:
        if not isinstance(action, dict):
            raise TemplateError(f"{res.label}: property 'action' must be an object")
        _only(
            res, "action", action, {"sqlExpression", "compatibilityLevel", "requiresPreprocessing"}
        )
        expression = action.get("sqlExpression")
        if expression is not None and not isinstance(expression, str):
            raise TemplateError(f"{res.label}: property 'action.sqlExpression' must be a string")
        if (expression or "").strip():
            out["Action"] = {"SqlExpression": expression}
    return {"Name": res.names[3], "Properties": out}


def _object(res: _Resource, props: dict[str, Any], key: str) -> dict[str, Any]:
    value = props.get(key)
    if not isinstance(value, dict):
        raise TemplateError(f"{res.label}: property {key!r} must be an object")
    return value


def _only(res: _Resource, where: str, value: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise TemplateError(f"{res.label}: property '{where}.{unknown[0]}' is not one busd knows")


def _rights(res: _Resource) -> list[str]:
    unknown = sorted(set(res.properties) - {"rights"})
    if unknown:
        raise TemplateError(
            f"{res.label}: property {unknown[0]!r} is not one of an authorization rule"
        )
    rights = res.properties.get("rights")
    if not isinstance(rights, list) or not rights:
        raise TemplateError(f"{res.label}: property 'rights' must list Listen, Send or Manage")
    named = []
    for right in rights:
        match = next(
            (
                r
                for r in access_rules.RIGHTS
                if isinstance(right, str) and r.lower() == right.lower()
            ),
            None,
        )
        if match is None:
            raise TemplateError(
                f"{res.label}: property 'rights': {right!r} is not Listen, Send or Manage"
            )
        named.append(match)
    if "Manage" in named and not {"Send", "Listen"} <= set(named):
        raise TemplateError(
            f"{res.label}: property 'rights': Manage needs Send and Listen too, as Azure requires"
        )
    return named


def _entity_key(res: _Resource) -> dict[str, Any]:
    """A queue's or topic's rule: busd makes its keys at its first start and keeps them."""
    return {"KeyName": res.names[2], "Rights": _rights(res)}
