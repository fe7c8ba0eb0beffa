"""Settings of one busd process, and the entities file (the Service Bus emulator's Config.json).

`Settings` only holds values; `Settings.validate()` checks them once at start-up. The CLI maps
its options one to one onto the fields. `load_entities()` reads the emulator's Config.json as
the emulator ships it (JSON with `//` and `/* */` comments) and turns its queues, topics,
subscriptions and rules into the records of busd.entities, which seed the store's catalog, and
reads busd's own `SharedAccessKeys` entries of a namespace (keys with their rights).
Properties busd does not use become warnings, never a refusal to start: users bring the file
they already have.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from busd.auth.rights import SasKey, parse_rights
from busd.broker.limits import Limits
from busd.entities import (
    DEFAULT_RULE_NAME,
    QueueEntity,
    RuleEntity,
    SubscriptionEntity,
    TopicEntity,
)
from busd.rules import RuleError, rule_from_config, rule_record

KIB = 1024
MIB = 1024 * KIB

DEFAULT_SAS_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_SAS_KEY = "SAS_KEY_VALUE"  # the emulator's, so existing connection strings work

DEFAULT_MAX_MESSAGE_SIZE = 1 * MIB
MAX_MESSAGE_SIZE_LIMIT = 100 * MIB  # Service Bus premium's largest message

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

# Queue property bounds (docs/design.md §2.1). Service Bus allows 5 s .. 5 min for LockDuration;
# busd goes down to 1 s because short locks make lock-expiry tests fast.
DEFAULT_LOCK_DURATION_MS = 60_000
MIN_LOCK_DURATION_MS = 1_000
MAX_LOCK_DURATION_MS = 5 * 60_000
DEFAULT_MAX_DELIVERY_COUNT = 10
DEFAULT_DUPLICATE_WINDOW_MS = 10 * 60_000
MIN_DUPLICATE_WINDOW_MS = 1_000
MAX_DUPLICATE_WINDOW_MS = 7 * 24 * 3600_000  # Service Bus's own ceiling

# .NET's TimeSpan.MaxValue (P10675199DT2H48M5.4775807S) is how Service Bus spells "unbounded";
# any duration of at least that many days means no limit.
_TIMESPAN_MAX_DAYS = 10_675_199

ENTITY_NAME_MAX_LENGTH = 260
_ENTITY_NAME_RE = re.compile(r"[A-Za-z0-9._/-]{1,260}", re.ASCII)
SUBSCRIPTION_NAME_MAX_LENGTH = 50  # Service Bus's limit, for rule names too
_SUBSCRIPTION_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,50}", re.ASCII)


class ConfigError(Exception):
    """A setting or the entities file is invalid; the message says which and why, in one line."""


# URL schemes --redis-url takes; `+cluster` names a Redis/Valkey Cluster
# (busd.storage.redis_store, as does a `?cluster=true` parameter).
REDIS_URL_SCHEMES = (
    "redis://", "rediss://", "unix://", "valkey://", "valkeys://",
    "redis+cluster://", "rediss+cluster://", "valkey+cluster://", "valkeys+cluster://",
)


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 5672
    redis_url: str | None = None  # None: start the embedded Valkey in data_dir
    data_dir: str = "./busd-data"
    config_path: str | None = None  # the entities file (emulator Config.json)
    http_port: int = 5300  # health, metrics, admin
    tls_port: int | None = 5671  # AMQP over TLS (the SDKs' port outside the emulator); None: off
    ws_port: int | None = 5443  # AMQP over WebSockets, ws and wss (Service Bus: 443); None: off
    tls_cert: str | None = None  # PEM files; None: a self-signed pair kept in data_dir
    tls_key: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    sas_keys: dict[str, str] = field(
        default_factory=lambda: {DEFAULT_SAS_KEY_NAME: DEFAULT_SAS_KEY}
    )
    sweep_interval_s: float = 1.0  # how often each process runs the lock/TTL/schedule sweep
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # default for queues that set none
    key_prefix: str = "busd"  # every store key starts with it, so one Redis can host several
    # store calls one process has in flight at once (pipelined on one connection); more wait
    # for a turn
    store_connections: int = 64
    # what one client may make the process hold (busd/broker/limits.py)
    limits: Limits = field(default_factory=Limits)
    # a transaction is rolled back this long after its first operation (Service Bus: 2 min)
    transaction_timeout_s: float = 120.0
    # busd processes serving the same ports of this host (busd/workers.py)
    workers: int = 1

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
            raise ConfigError(
                f"store connections must be 1..10000, got {self.store_connections}"
            )
        if not 1 <= self.workers <= 1024:
            raise ConfigError(f"workers must be 1..1024, got {self.workers}")
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
                f"valkeys://; redis+cluster://, rediss+cluster:// for a cluster), "
                f"got {self.redis_url!r}"
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


# --- entity names ------------------------------------------------------------------------------


def normalize_entity_name(name: object, what: str = "queue") -> str:
    """The lower-cased name (Service Bus names are case-insensitive), or ConfigError."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} name must be a non-empty string, got {name!r}")
    if len(name) > ENTITY_NAME_MAX_LENGTH:
        raise ConfigError(
            f"{what} name {name[:40]!r}... is {len(name)} characters long; "
            f"the limit is {ENTITY_NAME_MAX_LENGTH}"
        )
    if not _ENTITY_NAME_RE.fullmatch(name):
        bad = sorted({c for c in name if not _ENTITY_NAME_RE.fullmatch(c)})
        raise ConfigError(
            f"{what} name {name!r} contains {''.join(bad)!r}: only letters, digits, "
            f"'-', '.', '_' and '/' are allowed"
        )
    segments = name.split("/")
    if any(not s for s in segments):
        raise ConfigError(f"{what} name {name!r} must not start or end with '/' nor contain '//'")
    if len(segments) > 1 and any(s.lower() == "subscriptions" for s in segments):
        # `t/Subscriptions/s` is how a subscription is addressed; a queue named that way
        # could never be reached.
        raise ConfigError(f"{what} name {name!r} must not contain a 'Subscriptions' segment")
    return name.lower()


def normalize_subscription_name(name: object) -> str:
    """A subscription's lower-cased name (one path segment, at most 50 characters)."""
    if not isinstance(name, str) or not _SUBSCRIPTION_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"subscription name must be 1..{SUBSCRIPTION_NAME_MAX_LENGTH} letters, digits, "
            f"'-', '.' or '_', got {name!r}"
        )
    return name.lower()


def check_rule_name(name: object) -> str:
    """A rule's name as given (rule names compare case-insensitively)."""
    if (not isinstance(name, str) or not name or len(name) > SUBSCRIPTION_NAME_MAX_LENGTH
            or any(c in name for c in "/\\?#")):
        raise ConfigError(
            f"rule name must be 1..{SUBSCRIPTION_NAME_MAX_LENGTH} characters without "
            f"'/', '\\', '?' or '#', got {name!r}"
        )
    return name


def normalize_forward_target(value: object, what: str) -> str | None:
    """A ForwardTo-style value as a bare entity path: None for empty, scheme and authority of
    an absolute URL (`sb://host:port/q`, as the management API sends it) dropped."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be an entity name, got {value!r}")
    text = value.strip()
    scheme = text.find("://")
    if scheme >= 0:
        slash = text.find("/", scheme + 3)
        text = "" if slash < 0 else text[slash:]
    text = text.strip("/")
    if not text:
        return None
    return normalize_entity_name(text, what)


# --- ISO 8601 durations --------------------------------------------------------------------------

_DURATION_RE = re.compile(
    r"P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?",
    re.ASCII | re.IGNORECASE,
)
# .NET TimeSpan text ([d.]hh:mm:ss[.fffffff]), which some tools write into the same fields.
_TIMESPAN_RE = re.compile(
    r"(?:(?P<days>\d+)\.)?(?P<hours>\d{1,2}):(?P<minutes>\d{1,2}):(?P<seconds>\d{1,2}(?:\.\d+)?)",
    re.ASCII,
)


def parse_duration_ms(text: str) -> int | None:
    """Milliseconds of an ISO 8601 duration (PT1M, P14D, PT0.5S...), None for TimeSpan.MaxValue
    and anything as long (unbounded). Years count 365 days and months 30, as .NET's XmlConvert.
    Raises ValueError for text that is not a duration."""
    text = text.strip()
    m = _DURATION_RE.fullmatch(text) or _TIMESPAN_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as PT1M, PT30S or P14D")
    parts = {k: v for k, v in m.groupdict().items() if v is not None}
    days = (
        int(parts.get("years", 0)) * 365
        + int(parts.get("months", 0)) * 30
        + int(parts.get("weeks", 0)) * 7
        + int(parts.get("days", 0))
    )
    if days >= _TIMESPAN_MAX_DAYS:
        return None
    seconds = float(parts.get("seconds", "0"))
    total_ms = (
        days * 86_400_000
        + int(parts.get("hours", 0)) * 3_600_000
        + int(parts.get("minutes", 0)) * 60_000
        + round(seconds * 1000)
    )
    if total_ms >= _TIMESPAN_MAX_DAYS * 86_400_000:
        return None
    return total_ms


# --- the entities file -------------------------------------------------------------------------

# Properties busd reads, per kind; anything else in Properties is reported as ignored.
_QUEUE_PROPERTIES = {
    "RequiresSession",
    "LockDuration",
    "MaxDeliveryCount",
    "DefaultMessageTimeToLive",
    "DeadLetteringOnMessageExpiration",
    "RequiresDuplicateDetection",
    "DuplicateDetectionHistoryTimeWindow",
    "ForwardTo",
    "ForwardDeadLetteredMessagesTo",
    "MaxMessageSizeInKilobytes",  # busd's own: Service Bus sets this per namespace tier
}
_TOPIC_PROPERTIES = {
    "DefaultMessageTimeToLive",
    "RequiresDuplicateDetection",
    "DuplicateDetectionHistoryTimeWindow",
    "MaxMessageSizeInKilobytes",
}
_SUBSCRIPTION_PROPERTIES = {
    "RequiresSession",
    "LockDuration",
    "MaxDeliveryCount",
    "DefaultMessageTimeToLive",
    "DeadLetteringOnMessageExpiration",
    "DeadLetteringOnFilterEvaluationExceptions",
    "ForwardTo",
    "ForwardDeadLetteredMessagesTo",
}


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
        where = (f" at line {e.lineno} column {e.colno}"
                 if isinstance(e, json.JSONDecodeError) else "")
        message = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise ConfigError(f"entities file {path} is not valid JSON: {message}{where}") from e
    try:
        return _parse_document(document, default_max_message_size)
    except ConfigError as e:
        raise ConfigError(f"entities file {path}: {e}") from e


def _parse_document(document: Any, default_max_message_size: int) -> EntitiesFile:
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


def _parse_key(raw: Any) -> tuple[str, SasKey]:
    """`{"KeyName": "reader", "Key": "...", "Rights": ["Listen"]}` (busd's own entry: Service Bus
    namespaces have shared access rules, the emulator has none). No `Rights`: all three."""
    if not isinstance(raw, dict) or not isinstance(raw.get("KeyName"), str) \
            or not isinstance(raw.get("Key"), str) or not raw["KeyName"] or not raw["Key"]:
        raise ConfigError('each SharedAccessKeys entry needs a "KeyName" and a "Key" (strings)')
    name = raw["KeyName"]
    rights = raw.get("Rights")
    if rights is None:
        return name, SasKey(raw["Key"])
    if not isinstance(rights, list) or not rights or not all(isinstance(r, str) for r in rights):
        raise ConfigError(f"shared access key {name!r}: Rights must be a list of Send, Listen, "
                          "Manage")
    try:
        return name, SasKey(raw["Key"], parse_rights(",".join(rights)))
    except ValueError as e:
        raise ConfigError(f"shared access key {name!r}: {e}") from None


def _properties(raw: dict, label: str, known: set[str], warnings: list[str]) -> dict:
    props = raw.get("Properties") or {}
    if not isinstance(props, dict):
        raise ConfigError(f"{label}: Properties must be an object")
    warnings.extend(
        f"{label}: property {key!r} is not used by busd and is ignored"
        for key in props
        if key not in known
    )
    return props


def _lock_duration(props: dict, label: str) -> int:
    lock_ms = _duration(props, "LockDuration", label, DEFAULT_LOCK_DURATION_MS)
    if lock_ms is None or not MIN_LOCK_DURATION_MS <= lock_ms <= MAX_LOCK_DURATION_MS:
        raise ConfigError(
            f"{label}: LockDuration {props.get('LockDuration')!r} is out of range "
            "(1 second to 5 minutes, e.g. PT30S or PT5M)"
        )
    return lock_ms


def _ttl(props: dict, label: str) -> int | None:
    ttl_ms = _duration(props, "DefaultMessageTimeToLive", label, None)
    if ttl_ms is not None and ttl_ms <= 0:
        raise ConfigError(f"{label}: DefaultMessageTimeToLive must be longer than zero")
    return ttl_ms


def _max_delivery(props: dict, label: str) -> int:
    max_delivery = props.get("MaxDeliveryCount", DEFAULT_MAX_DELIVERY_COUNT)
    if isinstance(max_delivery, bool) or not isinstance(max_delivery, int) or max_delivery < 1:
        raise ConfigError(
            f"{label}: MaxDeliveryCount must be a whole number >= 1, got {max_delivery!r}"
        )
    return max_delivery


def _duplicate_window(props: dict, label: str) -> int | None:
    if not _flag(props, "RequiresDuplicateDetection", label):
        return None
    window_ms = _duration(
        props, "DuplicateDetectionHistoryTimeWindow", label, DEFAULT_DUPLICATE_WINDOW_MS
    )
    if window_ms is None or not MIN_DUPLICATE_WINDOW_MS <= window_ms <= MAX_DUPLICATE_WINDOW_MS:
        raise ConfigError(
            f"{label}: DuplicateDetectionHistoryTimeWindow "
            f"{props.get('DuplicateDetectionHistoryTimeWindow')!r} is out of range "
            "(1 second to 7 days)"
        )
    return window_ms


def _max_size(props: dict, label: str, default: int) -> int:
    if "MaxMessageSizeInKilobytes" not in props:
        return default
    kb = props["MaxMessageSizeInKilobytes"]
    if (isinstance(kb, bool) or not isinstance(kb, int)
            or not 1 <= kb * KIB <= MAX_MESSAGE_SIZE_LIMIT):
        raise ConfigError(
            f"{label}: MaxMessageSizeInKilobytes must be 1..{MAX_MESSAGE_SIZE_LIMIT // KIB}, "
            f"got {kb!r}"
        )
    return kb * KIB


def _receivable(props: dict, label: str) -> dict[str, Any]:
    """The properties queues and subscriptions share (those of what receivers take from)."""
    return {
        "requires_session": _flag(props, "RequiresSession", label),
        "lock_duration_ms": _lock_duration(props, label),
        "max_delivery_count": _max_delivery(props, label),
        "default_ttl_ms": _ttl(props, label),
        "dead_letter_on_expiration": _flag(props, "DeadLetteringOnMessageExpiration", label),
        "forward_to": normalize_forward_target(props.get("ForwardTo"), f"{label}: ForwardTo"),
        "forward_dead_lettered_to": normalize_forward_target(
            props.get("ForwardDeadLetteredMessagesTo"),
            f"{label}: ForwardDeadLetteredMessagesTo"),
    }


def _parse_queue(raw: Any, default_max_message_size: int) -> tuple[QueueEntity, list[str]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"each queue must be an object with a Name, got {raw!r}")
    name = normalize_entity_name(raw.get("Name"), "queue")
    label = f"queue {raw['Name']!r}"
    warnings: list[str] = []
    props = _properties(raw, label, _QUEUE_PROPERTIES, warnings)
    queue = QueueEntity(
        name=name,
        duplicate_detection_window_ms=_duplicate_window(props, label),
        max_message_size=_max_size(props, label, default_max_message_size),
        **_receivable(props, label),
    )
    return queue, warnings


def _parse_topic(raw: Any, default_max_message_size: int, found: EntitiesFile) -> TopicEntity:
    if not isinstance(raw, dict):
        raise ConfigError(f"each topic must be an object with a Name, got {raw!r}")
    name = normalize_entity_name(raw.get("Name"), "topic")
    label = f"topic {raw['Name']!r}"
    props = _properties(raw, label, _TOPIC_PROPERTIES, found.warnings)
    topic = TopicEntity(
        name=name,
        default_ttl_ms=_ttl(props, label),
        duplicate_detection_window_ms=_duplicate_window(props, label),
        max_message_size=_max_size(props, label, default_max_message_size),
    )
    subs = raw.get("Subscriptions") or []
    if not isinstance(subs, list):
        raise ConfigError(f"{label}: Subscriptions must be a list")
    seen: dict[str, str] = {}
    for sub_raw in subs:
        sub = _parse_subscription(name, sub_raw, label, found)
        if sub.name in seen:
            raise ConfigError(f"{label}: subscription {sub_raw.get('Name')!r} is declared "
                              f"twice (names are case-insensitive; first as {seen[sub.name]!r})")
        seen[sub.name] = sub_raw.get("Name")
        found.subscriptions.append(sub)
    return topic


def _parse_subscription(topic: str, raw: Any, topic_label: str,
                        found: EntitiesFile) -> SubscriptionEntity:  # fmt: skip
    if not isinstance(raw, dict):
        raise ConfigError(f"{topic_label}: each subscription must be an object with a Name, "
                          f"got {raw!r}")
    try:
        name = normalize_subscription_name(raw.get("Name"))
    except ConfigError as e:
        raise ConfigError(f"{topic_label}: {e}") from None
    label = f"subscription {raw['Name']!r} of {topic_label}"
    props = _properties(raw, label, _SUBSCRIPTION_PROPERTIES, found.warnings)
    sub = SubscriptionEntity(
        topic=topic,
        name=name,
        dead_letter_on_filter_exceptions=_flag(
            props, "DeadLetteringOnFilterEvaluationExceptions", label, default=True),
        **_receivable(props, label),
    )
    rules = raw.get("Rules") or []
    if not isinstance(rules, list):
        raise ConfigError(f"{label}: Rules must be a list")
    parsed: dict[str, RuleEntity] = {}
    for rule_raw in rules:
        rule = _parse_rule(sub, rule_raw, label)
        if rule.path in parsed:
            raise ConfigError(f"{label}: rule {rule.name!r} is declared twice (rule names are "
                              "case-insensitive)")
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
    """A forwarding destination is a queue or topic of the same file other than the source
    (Service Bus refuses a source whose destination does not exist), and a session-enabled
    source cannot forward (docs/design.md §2.15)."""
    names = {q.name for q in found.queues} | {t.name for t in found.topics}
    sources: list[tuple[str, QueueEntity | SubscriptionEntity]] = [
        (f"queue {q.name!r}", q) for q in found.queues
    ] + [(f"subscription {s.path!r}", s) for s in found.subscriptions]
    for label, source in sources:
        if source.forward_to is not None and source.requires_session:
            raise ConfigError(f"{label}: ForwardTo is not supported on an entity that "
                              "requires sessions")
        for key, target in (("ForwardTo", source.forward_to),
                            ("ForwardDeadLetteredMessagesTo", source.forward_dead_lettered_to)):
            if target is not None and target not in names:
                raise ConfigError(f"{label}: {key} {target!r} names no queue or topic of "
                                  "this file")
            if target is not None and target == source.path:
                raise ConfigError(f"{label}: {key} cannot name the entity itself")


def _flag(props: dict, key: str, label: str, *, default: bool = False) -> bool:
    value = props.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{label}: {key} must be true or false, got {value!r}")


def _duration(props: dict, key: str, label: str, default: int | None) -> int | None:
    value = props.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise ConfigError(f"{label}: {key} must be an ISO 8601 duration string, got {value!r}")
    try:
        return parse_duration_ms(value)
    except ValueError as e:
        raise ConfigError(f"{label}: {key}: {e}") from None
