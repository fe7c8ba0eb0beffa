"""Settings of one busd process, and the entities file (the Service Bus emulator's Config.json).

`Settings` only holds values; `Settings.validate()` checks them once at start-up. The CLI maps
its options one to one onto the fields. `load_entities()` reads the emulator's Config.json as is
and turns each queue into the `QueueSpec` the broker and the store use. Whatever busd does not
support yet (topics, forwarding) becomes a warning, never a refusal to start: users bring the
file they already have.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from busd.broker.limits import Limits
from busd.storage.api import QueueSpec

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


class ConfigError(Exception):
    """A setting or the entities file is invalid; the message says which and why, in one line."""


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 5672
    redis_url: str | None = None  # None: start the embedded Valkey in data_dir
    data_dir: str = "./busd-data"
    config_path: str | None = None  # the entities file (emulator Config.json)
    http_port: int = 5300  # health, metrics, admin
    tls_port: int | None = 5671  # AMQP over TLS (the SDKs' port outside the emulator); None: off
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
    # store calls one process runs at once (one connection each); more wait for a turn
    store_connections: int = 64
    # what one client may make the process hold (busd/broker/limits.py)
    limits: Limits = field(default_factory=Limits)

    def validate(self) -> None:
        """Raise ConfigError on the first invalid value; normalises log level and format case."""
        for name in ("port", "http_port", "tls_port"):
            value = getattr(self, name)
            if value is None and name == "tls_port":
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
        if not self.sas_keys:
            raise ConfigError("at least one SAS key is needed (name and key)")
        for key_name, key in self.sas_keys.items():
            if not key_name or not key:
                raise ConfigError(f"SAS key {key_name!r} needs both a name and a key")
        if not 1 <= self.store_connections <= 10_000:
            raise ConfigError(
                f"store connections must be 1..10000, got {self.store_connections}"
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
        if self.redis_url is not None and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://", "valkey://", "valkeys://")
        ):
            raise ConfigError(
                f"redis url must start with redis://, rediss:// or unix://, got {self.redis_url!r}"
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

# Queue properties busd reads; anything else in Properties is reported as ignored.
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


def load_entities(
    path: str | Path, default_max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> tuple[list[QueueSpec], list[str]]:
    """Read an emulator Config.json: the queues it declares, and warnings for what is ignored.

    Raises ConfigError naming the file (and the entity) for anything that would make busd
    behave differently from what the file asks: bad JSON, bad names, out-of-range values.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a BOM, as Windows editors write
    except OSError as e:
        raise ConfigError(f"cannot read entities file {path}: {e.strerror or e}") from e
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"entities file {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from e
    try:
        return _parse_document(document, default_max_message_size)
    except ConfigError as e:
        raise ConfigError(f"entities file {path}: {e}") from e


def _parse_document(
    document: Any, default_max_message_size: int
) -> tuple[list[QueueSpec], list[str]]:
    if not isinstance(document, dict) or not isinstance(document.get("UserConfig"), dict):
        raise ConfigError('expected an object with "UserConfig" (the emulator Config.json format)')
    namespaces = document["UserConfig"].get("Namespaces")
    if not isinstance(namespaces, list):
        raise ConfigError('"UserConfig.Namespaces" must be a list')
    warnings: list[str] = []
    if len(namespaces) > 1:
        warnings.append(
            f"{len(namespaces)} namespaces declared: busd serves one namespace per endpoint, "
            "so the queues of all of them are merged"
        )
    queues: list[QueueSpec] = []
    seen: dict[str, str] = {}
    for ns in namespaces:
        if not isinstance(ns, dict):
            raise ConfigError("each entry of UserConfig.Namespaces must be an object")
        ns_queues = ns.get("Queues") or []
        if not isinstance(ns_queues, list):
            raise ConfigError(f"namespace {ns.get('Name')!r}: Queues must be a list")
        for raw in ns_queues:
            spec, queue_warnings = _parse_queue(raw, default_max_message_size)
            if spec.name in seen:
                raise ConfigError(
                    f"queue {raw.get('Name')!r} is declared twice (names are case-insensitive; "
                    f"first as {seen[spec.name]!r})"
                )
            seen[spec.name] = raw.get("Name")
            queues.append(spec)
            warnings.extend(queue_warnings)
        for topic in ns.get("Topics") or []:
            name = topic.get("Name") if isinstance(topic, dict) else topic
            subs = topic.get("Subscriptions") or [] if isinstance(topic, dict) else []
            warnings.append(
                f"topic {name!r} ({len(subs)} subscription(s)) ignored: "
                "topics are not supported yet"
            )
    return queues, warnings


def _parse_queue(raw: Any, default_max_message_size: int) -> tuple[QueueSpec, list[str]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"each queue must be an object with a Name, got {raw!r}")
    name = normalize_entity_name(raw.get("Name"), "queue")
    label = f"queue {raw['Name']!r}"
    props = raw.get("Properties") or {}
    if not isinstance(props, dict):
        raise ConfigError(f"{label}: Properties must be an object")
    warnings = [
        f"{label}: property {key!r} is not used by busd and is ignored"
        for key in props
        if key not in _QUEUE_PROPERTIES
    ]
    for key in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
        if props.get(key):
            warnings.append(f"{label}: {key}={props[key]!r} ignored: forwarding is not supported")

    lock_ms = _duration(props, "LockDuration", label, DEFAULT_LOCK_DURATION_MS)
    if lock_ms is None or not MIN_LOCK_DURATION_MS <= lock_ms <= MAX_LOCK_DURATION_MS:
        raise ConfigError(
            f"{label}: LockDuration {props.get('LockDuration')!r} is out of range "
            "(1 second to 5 minutes, e.g. PT30S or PT5M)"
        )

    ttl_ms = _duration(props, "DefaultMessageTimeToLive", label, None)
    if ttl_ms is not None and ttl_ms <= 0:
        raise ConfigError(f"{label}: DefaultMessageTimeToLive must be longer than zero")

    max_delivery = props.get("MaxDeliveryCount", DEFAULT_MAX_DELIVERY_COUNT)
    if isinstance(max_delivery, bool) or not isinstance(max_delivery, int) or max_delivery < 1:
        raise ConfigError(
            f"{label}: MaxDeliveryCount must be a whole number >= 1, got {max_delivery!r}"
        )

    window_ms: int | None = None
    if _flag(props, "RequiresDuplicateDetection", label):
        window_ms = _duration(
            props, "DuplicateDetectionHistoryTimeWindow", label, DEFAULT_DUPLICATE_WINDOW_MS
        )
        if window_ms is None or not MIN_DUPLICATE_WINDOW_MS <= window_ms <= MAX_DUPLICATE_WINDOW_MS:
            raise ConfigError(
                f"{label}: DuplicateDetectionHistoryTimeWindow "
                f"{props.get('DuplicateDetectionHistoryTimeWindow')!r} is out of range "
                "(1 second to 7 days)"
            )

    max_size = default_max_message_size
    if "MaxMessageSizeInKilobytes" in props:
        kb = props["MaxMessageSizeInKilobytes"]
        if (
            isinstance(kb, bool)
            or not isinstance(kb, int)
            or not 1 <= kb * KIB <= MAX_MESSAGE_SIZE_LIMIT
        ):
            raise ConfigError(
                f"{label}: MaxMessageSizeInKilobytes must be 1..{MAX_MESSAGE_SIZE_LIMIT // KIB}, "
                f"got {kb!r}"
            )
        max_size = kb * KIB

    spec = QueueSpec(
        name=name,
        requires_session=_flag(props, "RequiresSession", label),
        lock_duration_ms=lock_ms,
        max_delivery_count=max_delivery,
        default_ttl_ms=ttl_ms,
        dead_letter_on_expiration=_flag(props, "DeadLetteringOnMessageExpiration", label),
        duplicate_detection_window_ms=window_ms,
        max_message_size=max_size,
    )
    return spec, warnings


def _flag(props: dict, key: str, label: str) -> bool:
    value = props.get(key, False)
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
