"""Settings of one busd process, and the entities file (the Service Bus emulator's Config.json).

`Settings` only holds values; `Settings.validate()` checks them once at start-up. The CLI maps
its options one to one onto the fields. `load_entities()` reads the emulator's Config.json as
the emulator ships it (JSON with `//` and `/* */` comments) and turns its queues, topics,
subscriptions and rules into the records of entities.records, which seed the store's catalog, and
reads busd's own `SharedAccessKeys` entries of a namespace (keys with their rights).
Properties are read as busd.entities.properties declares them: a Service Bus property busd keeps
but does not act on is a warning; a name Service Bus does not know for that kind of entity (a
misspelling) refuses the start, naming the entity and the property.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from busd.auth.rights import SasKey, parse_rights
from busd.auth.sas import DEFAULT_SAS_KEY, DEFAULT_SAS_KEY_NAME
from busd.broker.limits import Limits
from busd.broker.settings import BrokerSettings
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
from busd.net import origins
from busd.rules import RuleError, rule_from_config, rule_record
from busd.units import KIB, MIB

DEFAULT_MAX_MESSAGE_SIZE = 1 * MIB
MAX_MESSAGE_SIZE_LIMIT = ep.MAX_MESSAGE_SIZE_KB * KIB  # Service Bus premium's largest message

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
DURABILITIES = ("local", "fsync", "replicated")

# URL schemes --redis-url takes; `+cluster` names a Redis/Valkey Cluster
# (busd.storage.redis.store, as does a `?cluster=true` parameter), `+sentinel` the Sentinels
# of a primary and its replicas.
REDIS_URL_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "valkey://",
    "valkeys://",
    "redis+cluster://",
    "rediss+cluster://",
    "valkey+cluster://",
    "valkeys+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "valkey+sentinel://",
    "valkeys+sentinel://",
)


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 5672
    redis_url: str | None = None  # None: start the embedded Valkey in data_dir
    store_wait_s: float = 30.0  # how long start-up waits for --redis-url to answer
    data_dir: str = "./busd-data"
    config_path: str | None = None  # the entities file (emulator Config.json)
    http_port: int = 5300  # health, metrics, admin
    tls_port: int | None = 5671  # AMQP over TLS (the SDKs' port outside the emulator); None: off
    ws_port: int | None = 5443  # AMQP over WebSockets, ws and wss (Service Bus: 443); None: off
    tls_cert: str | None = None  # PEM files; None: busd's own, its CA's, kept in data_dir
    tls_key: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    sas_keys: dict[str, str] = field(
        default_factory=lambda: {DEFAULT_SAS_KEY_NAME: DEFAULT_SAS_KEY}
    )
    sweep_interval_s: float = BrokerSettings.sweep_interval_s  # each process's sweep
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # default for queues that set none
    key_prefix: str = "busd"  # every store key starts with it, so one Redis can host several
    # store calls one process has in flight at once (pipelined on one connection); more wait
    # for a turn
    store_connections: int = 64
    # what one client may make the process hold (busd/broker/limits.py)
    limits: Limits = field(default_factory=Limits)
    transaction_timeout_s: float = BrokerSettings.transaction_timeout_s
    # busd processes serving the same ports of this host (busd/server/workers.py)
    workers: int = 1
    # whether `workers` came from `--workers auto` (said in the banner)
    workers_auto: bool = False
    # valkey-servers the embedded store runs as one local Cluster (None: auto, from the
    # cores); above 1, entities are partitioned by default (busd/storage/redis/embedded.py)
    store_shards: int | None = 1
    # what the store must have done with a write before busd acknowledges it: local (ran),
    # fsync (in the primary's append-only file), replicated (and received by a replica);
    # docs/design.md §3.9
    durability: str = "local"
    # namespaces other than the default one a process serves at once (docs/design.md §3.17)
    max_namespaces: int = 100
    # HTTP (busd/http/server.py): connections open at once (0: no cap), and from one peer
    # address; how long a request's head (an unauthenticated one's head and body) may take
    http_connections: int = 256
    http_connections_per_address: int = 64
    http_request_timeout_s: float = 5.0
    # the host names clients reach busd by beyond localhost and its addresses, and the web
    # origins that may open WebSockets beyond those hosts' (busd/net/origins.py)
    hostnames: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)

    def broker_settings(self) -> BrokerSettings:
        """What every broker of this server takes from these settings (one for all)."""
        return BrokerSettings(
            sweep_interval_s=self.sweep_interval_s,
            limits=self.limits,
            transaction_timeout_s=self.transaction_timeout_s,
        )

    def validate(self) -> None:
        """Raise ConfigError on the first invalid value; normalises log level and format case."""
        for name in ("port", "http_port", "tls_port", "ws_port"):
            value = getattr(self, name)
            if value is None and name in ("tls_port", "ws_port"):
                continue
            if not isinstance(value, int) or not 0 <= value <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0..65535), got {value!r}")
        self.log_level = str(self.log_level).lower()
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        self.log_format = str(self.log_format).lower()
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"log format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
        if not 1 <= self.max_message_size <= MAX_MESSAGE_SIZE_LIMIT:
            raise ConfigError(
                f"max message size must be 1..{MAX_MESSAGE_SIZE_LIMIT} bytes (100 MiB), "
                f"got {self.max_message_size}"
            )
        if not self.store_wait_s >= 0:
            raise ConfigError(f"store wait must be 0 or more seconds, got {self.store_wait_s}")
        if not self.sweep_interval_s > 0:
            raise ConfigError(f"sweep interval must be positive, got {self.sweep_interval_s}")
        if not self.transaction_timeout_s > 0:
            raise ConfigError(
                f"transaction timeout must be positive, got {self.transaction_timeout_s}"
            )
        if not self.sas_keys:
            raise ConfigError("at least one SAS key is needed (name and key)")
        for key_name, key in self.sas_keys.items():
            if not key_name or not key:
                raise ConfigError(f"SAS key {key_name!r} needs both a name and a key")
        if not 1 <= self.store_connections <= 10_000:
            raise ConfigError(f"store connections must be 1..10000, got {self.store_connections}")
        if self.durability not in DURABILITIES:
            raise ConfigError(
                f"durability must be one of {', '.join(DURABILITIES)}, got {self.durability!r}"
            )
        if not 1 <= self.max_namespaces <= 10_000:
            raise ConfigError(f"max namespaces must be 1..10000, got {self.max_namespaces}")
        if not 1 <= self.workers <= 1024:
            raise ConfigError(f"workers must be 1..1024, got {self.workers}")
        if self.store_shards is not None and not 1 <= self.store_shards <= 16:
            raise ConfigError(f"store shards must be 1..16 or auto, got {self.store_shards}")
        if self.store_shards != 1 and self.durability == "replicated":
            # local shards have no replicas (fsync works: each waits for its own append-only
            # file); a Cluster of the user's with replicas (--redis-url) takes replicated
            raise ConfigError(
                "--durability replicated needs replicas, which --store-shards' local shards do "
                "not have; give a Cluster with replicas as --redis-url instead"
            )
        if self.store_shards != 1 and self.redis_url:
            raise ConfigError(
                "--store-shards starts the embedded store as local shards; with --redis-url "
                "the store is the one it names"
            )
        if self.http_connections < 0:
            raise ConfigError(f"max HTTP connections must be 0 or more: {self.http_connections}")
        if self.http_connections_per_address < 0:
            raise ConfigError(
                "max HTTP connections per address must be 0 or more: "
                f"{self.http_connections_per_address}"
            )
        if not self.http_request_timeout_s > 0:
            raise ConfigError(
                f"HTTP request timeout must be positive, got {self.http_request_timeout_s}"
            )
        for hostname in self.hostnames:
            name = hostname.lower().rstrip(".")
            named = ":" not in name and origins.split_host(name) == name
            if not (named or origins.is_address(hostname)):
                raise ConfigError(f"--hostname takes a host name or address, got {hostname!r}")
        for origin in self.allowed_origins:
            if origins.normalize_origin(origin) is None:
                raise ConfigError(
                    "--allowed-origin takes an origin (scheme://host[:port]), null or *, "
                    f"got {origin!r}"
                )
        if (problem := self.limits.problem()) is not None:
            raise ConfigError(problem)
        if not self.key_prefix or any(c in self.key_prefix for c in "{} "):
            raise ConfigError("key prefix must be non-empty, without braces or spaces")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        for what, value in (("TLS certificate", self.tls_cert), ("TLS key", self.tls_key)):
            if value and not Path(value).is_file():
                raise ConfigError(f"{what} {value} does not exist or is not a file")
        if self.config_path is not None and not Path(self.config_path).is_file():
            raise ConfigError(f"entities file {self.config_path} does not exist or is not a file")
        if self.redis_url is not None and not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ConfigError(
                "redis url must start with redis://, rediss://, unix:// (or valkey://, "
                "valkeys://; redis+cluster://, rediss+cluster:// for a cluster; "
                f"redis+sentinel://host:port,.../service for Sentinel), "
                f"got {self.redis_url!r}"
            )

        url = self.redis_url or ""
        if "+sentinel://" in url and not url.split("://", 1)[1].partition("/")[2].strip("/"):
            raise ConfigError(
                "a Sentinel URL names its service: "
                "redis+sentinel://host:port[,host:port...]/service"
            )

    def connection_string(self) -> str:
        """The connection string clients use to reach this process (printed at start-up)."""
        host = "localhost" if self.host in ("", "0.0.0.0", "::", "127.0.0.1") else self.host
        if ":" in host:  # a bare IPv6 address
            host = f"[{host}]"
        key_name, key = next(iter(self.sas_keys.items()))
        return (
            f"Endpoint=sb://{host}:{self.port};SharedAccessKeyName={key_name};"
            f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
        )


# --- the entities file -------------------------------------------------------------------------


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
        if key in ep.KEPT_ONLY:
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
