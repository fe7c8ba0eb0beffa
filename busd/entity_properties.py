"""Every property of a queue, topic or subscription, declared once (docs/design.md §3.14).

A `Property` says how Service Bus names it (the same in the entities file's `Properties` and
as the management API's XML element), its type, default and bounds, which kinds of entity
have it, where busd keeps it (a field of busd.entities' records, or `extra`: stored and
answered back, not acted on), whether the store's calls carry it (`QueueSpec`), and its
command-line option. The entities file's reader (busd.config), the management API's reader,
writer and checks (busd.http), the command line (busd.entity_tools) and the store's handle
(busd.entities `.spec`) are all derived from `PROPERTIES`; `ATOM_ORDER` is the order the
service writes elements in, read-only ones (filled from the store) included.

Values here are in the property's own unit, as Service Bus spells it: durations in
milliseconds (None: unbounded, TimeSpan.MaxValue on the wire), sizes in the unit the name
says (`MaxMessageSizeInKilobytes`), flags bool, counts int, entity names lower-cased bare
paths. A record field holds `value * scale` (bytes for kilobytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from busd import access_rules
from busd.entity_values import normalize_forward_target, parse_duration_ms
from busd.errors import ConfigError
from busd.storage.specs import BACKOFF_LONGEST_MS

# Types: how a value is read and written.
BOOL = "bool"
INT = "int"
NUMBER = "number"  # a decimal number (float), as `1.5`
DURATION = "duration"  # ISO 8601 / TimeSpan text; milliseconds, None for unbounded
TEXT = "text"
STATUS = "status"  # one of STATUSES
ENTITY = "entity"  # a queue or topic of the namespace, by name or URL: a bare path
ACCESS_RULES = "access rules"  # a list of shared access rules (busd.access_rules)

QUEUE, TOPIC, SUBSCRIPTION = "queue", "topic", "subscription"
KINDS = (QUEUE, TOPIC, SUBSCRIPTION)
STATUSES = ("Active", "Disabled", "SendDisabled", "ReceiveDisabled")
INT32_MAX = 2**31 - 1
KIB = 1024
MAX_MESSAGE_SIZE_KB = 100 * KIB  # Service Bus premium's largest message, 100 MiB
MAX_PARTITIONS = 32
_RULE_TIMES = ("CreatedTime", "ModifiedTime")  # a shared access rule's, made at its creation
_RULE_DEFAULTS = {"ClaimType": access_rules.CLAIM_TYPE, "ClaimValue": "None"}


@dataclass(frozen=True)
class Property:
    name: str  # Service Bus's: the entities file's key and the management API's element
    type: str
    kinds: tuple[str, ...]
    default: Any = None  # what an entity that does not set it has (in the property's unit)
    attr: str | None = None  # the record field; None: kept in `extra` and answered back
    minimum: int | None = None  # inclusive bounds, in the property's unit
    maximum: int | None = None
    bounds: str = ""  # the bounds as people read them, for error messages
    # the management API's floor where Service Bus's tier (Premium, docs/management.md §3.2)
    # asks more than the entities file; a change may send a value below it back unchanged
    api_minimum: int | None = None
    unbounded: bool = True  # a duration may be TimeSpan.MaxValue (None)
    scale: int = 1  # record field = value * scale
    enabled_by: str | None = None  # the flag without which the field is off (None)
    store: bool = False  # the store's calls carry it (QueueSpec, the Lua scripts' arguments)
    immutable: bool = False  # a change may not alter it (the service refuses it too)
    flag: str | None = None  # command-line option, without `--`
    help: str = ""
    # busd's own, not Service Bus's: the management API writes it only when it is not the
    # default, so that a description stays the service's for entities that do not use it
    own: bool = False

    @property
    def field_default(self) -> Any:
        """The record field's default."""
        return self.to_field(self.default)

    def to_field(self, value: Any) -> Any:
        """The record field's value of the property's."""
        return value * self.scale if self.scale != 1 and value is not None else value

    # --- reading ------------------------------------------------------------------------------
    def from_text(self, text: str) -> Any:
        """The value of the XML element's text; ConfigError when it is not one."""
        text = text.strip()
        if self.type == BOOL:
            if text.lower() not in ("true", "false"):
                raise ConfigError(f"{self.name} must be true or false, got {text!r}")
            return text.lower() == "true"
        if self.type == INT:
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(f"{self.name} must be a whole number, got {text!r}") from None
            if not -(2**63) <= value < 2**63:
                raise ConfigError(f"{self.name} is out of range: {text}")
            return value
        if self.type == NUMBER:
            return self._number(text)
        return self._from_string(text)

    def _number(self, value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{self.name} must be a finite number, got {value!r}")
        return number

    def from_json(self, value: Any) -> Any:
        """The value of the entities file's JSON value; ConfigError when it is not one."""
        if self.type == BOOL:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be true or false, got {value!r}")
            return value
        if self.type == INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{self.name} must be a whole number, got {value!r}")
            return value
        if self.type == ACCESS_RULES:
            return access_rules.normalize(value)
        if self.type == NUMBER:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{self.name} must be a number, got {value!r}")
            return self._number(value)
        if not isinstance(value, str):
            what = {DURATION: "an ISO 8601 duration string", ENTITY: "an entity name"}.get(
                self.type, "a string"
            )
            raise ConfigError(f"{self.name} must be {what}, got {value!r}")
        return self._from_string(value)

    def _from_string(self, text: str) -> Any:
        if self.type == DURATION:
            try:
                return parse_duration_ms(text)
            except ValueError as exc:
                raise ConfigError(f"{self.name}: {exc}") from None
        if self.type == STATUS:
            for status in STATUSES:
                if status.lower() == text.strip().lower():
                    return status
            raise ConfigError(f"{self.name} must be one of {', '.join(STATUSES)}, got {text!r}")
        if self.type == ENTITY:
            return normalize_forward_target(text, self.name)
        return text

    def check(self, value: Any, api: bool = False) -> None:
        """ConfigError when the value is out of the property's bounds (`api`: the management
        API's)."""
        if value is None:
            if self.type == DURATION and not self.unbounded:
                raise ConfigError(f"{self.name} must be {self.bounds}, got an unbounded duration")
            return
        minimum, bounds = self.minimum, self.bounds
        if api and self.api_minimum is not None:
            minimum, bounds = self.api_minimum, f"{self.api_minimum}..{self.maximum}"
        if (minimum is not None and value < minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            shown = format_duration(value) if self.type == DURATION else value
            raise ConfigError(f"{self.name} must be {bounds}, got {shown}")

    # --- writing ------------------------------------------------------------------------------
    def to_json(self, value: Any) -> Any:
        """The entities file's JSON value, which from_json reads back (`busd config export`):
        an unset duration or entity name as "", as the emulator writes it; a shared access
        rule without its times, which busd keeps from start to start."""
        if value is None:
            return "" if self.type in (DURATION, ENTITY) else None
        if self.type == DURATION:
            return format_duration(value)
        if self.type == ACCESS_RULES:
            return [
                {
                    k: v
                    for k, v in rule.items()
                    if v is not None and k not in _RULE_TIMES and _RULE_DEFAULTS.get(k) != v
                }
                for rule in value
            ]
        return value

    def to_text(self, value: Any) -> str:
        if self.type == DURATION:
            return format_duration(value)
        if self.type == BOOL:
            return "true" if value else "false"
        if self.type == NUMBER:
            return f"{value:g}"
        return str(value)


def _p(name: str, type_: str, kinds: str, default: Any = None, **more: Any) -> Property:
    return Property(name, type_, tuple(k for k in KINDS if k[0] in kinds), default, **more)


# q: queue, t: topic, s: subscription. Bounds are Service Bus's, but for LockDuration (busd
# goes down to 1 s: short locks make lock-expiry tests fast) and MaxMessageSizeInKilobytes
# (busd's own per entity: Service Bus sets it per namespace tier).
PROPERTIES: tuple[Property, ...] = (
    _p(
        "RequiresSession",
        BOOL,
        "qs",
        False,
        attr="requires_session",
        store=True,
        immutable=True,
        flag="requires-session",
        help="Sessions.",
    ),
    _p(
        "LockDuration",
        DURATION,
        "qs",
        60_000,
        attr="lock_duration_ms",
        minimum=1_000,
        maximum=300_000,
        bounds="1 second to 5 minutes (e.g. PT30S or PT5M)",
        unbounded=False,
        store=True,
        flag="lock-duration",
        help="e.g. PT30S (1 s to 5 min).",
    ),
    _p(
        "MaxDeliveryCount",
        INT,
        "qs",
        10,
        attr="max_delivery_count",
        minimum=1,
        maximum=INT32_MAX,
        bounds=f"1..{INT32_MAX}",
        store=True,
        flag="max-delivery-count",
        help="Deliveries before dead-lettering.",
    ),
    _p(
        "DefaultMessageTimeToLive",
        DURATION,
        "qts",
        None,
        attr="default_ttl_ms",
        minimum=1,
        bounds="longer than zero",
        store=True,
        flag="default-ttl",
        help="Default time to live, e.g. P14D.",
    ),
    _p(
        "DeadLetteringOnMessageExpiration",
        BOOL,
        "qs",
        False,
        attr="dead_letter_on_expiration",
        store=True,
        flag="dead-letter-on-expiration",
        help="Dead-letter expired messages.",
    ),
    _p(
        "DeadLetteringOnFilterEvaluationExceptions",
        BOOL,
        "s",
        True,
        attr="dead_letter_on_filter_exceptions",
    ),
    # busd's own (docs/design.md §2.9): Service Bus dead-letters the failing message alone
    _p(
        "DeadLetterSessionOnMaxDeliveryCount",
        BOOL,
        "qs",
        False,
        attr="dead_letter_session_on_max_delivery",
        store=True,
        flag="dead-letter-session-on-max-delivery",
        own=True,
        help="A session message reaching MaxDeliveryCount dead-letters its whole session.",
    ),
    # busd's own (docs/design.md §2.6): Service Bus keeps an idle session's state forever
    _p(
        "SessionIdleTimeToLive",
        DURATION,
        "qs",
        None,
        attr="session_idle_ttl_ms",
        minimum=1_000,
        bounds="at least 1 second",
        store=True,
        flag="session-idle-ttl",
        own=True,
        help="Remove a session's state once it has had no messages and no holder this long.",
    ),
    # busd's own (docs/design.md §2.17): Service Bus makes an abandoned message available at
    # once; with a minimum, it is available again min * factor^(delivery count - 1) later
    _p(
        "RedeliveryBackoffMinimum",
        DURATION,
        "qs",
        None,
        attr="backoff_min_ms",
        minimum=1,
        maximum=BACKOFF_LONGEST_MS,
        bounds="longer than zero, at most 7 days",
        store=True,
        flag="backoff-min",
        own=True,
        help="Redelivery backoff after a first failed delivery, e.g. PT1S (off unless set).",
    ),
    _p(
        "RedeliveryBackoffMaximum",
        DURATION,
        "qs",
        None,
        attr="backoff_max_ms",
        minimum=1,
        maximum=BACKOFF_LONGEST_MS,
        bounds="longer than zero, at most 7 days",
        store=True,
        flag="backoff-max",
        own=True,
        help="Longest redelivery backoff (7 days unless set).",
    ),
    _p(
        "RedeliveryBackoffFactor",
        NUMBER,
        "qs",
        2.0,
        attr="backoff_factor",
        minimum=1,
        maximum=1000,
        bounds="1 to 1000",
        store=True,
        flag="backoff-factor",
        own=True,
        help="Growth of the redelivery backoff per failed delivery (2).",
    ),
    _p(
        "RequiresDuplicateDetection",
        BOOL,
        "qt",
        False,
        flag="duplicate-detection",
        help="Drop messages whose id was seen within the window.",
    ),
    _p(
        "DuplicateDetectionHistoryTimeWindow",
        DURATION,
        "qt",
        600_000,
        attr="duplicate_detection_window_ms",
        minimum=1_000,
        maximum=7 * 86_400_000,
        bounds="1 second to 7 days",
        unbounded=False,
        enabled_by="RequiresDuplicateDetection",
        store=True,
        flag="duplicate-window",
        help="e.g. PT10M.",
    ),
    _p(
        "MaxMessageSizeInKilobytes",
        INT,
        "qt",
        1024,
        attr="max_message_size",
        minimum=1,
        maximum=MAX_MESSAGE_SIZE_KB,
        bounds=f"1..{MAX_MESSAGE_SIZE_KB}",
        api_minimum=1024,
        scale=KIB,
        store=True,
        flag="max-message-size-kb",
        help="Largest message, in KiB.",
    ),
    _p(
        "ForwardTo",
        ENTITY,
        "qs",
        attr="forward_to",
        flag="forward-to",
        help="Queue or topic to move every message to.",
    ),
    _p(
        "ForwardDeadLetteredMessagesTo",
        ENTITY,
        "qs",
        attr="forward_dead_lettered_to",
        flag="forward-dead-lettered-to",
        help="Queue or topic to move dead letters to.",
    ),
    # Partitioned entities (docs/design.md §3.18): PartitionCount is busd's own (Service Bus
    # Standard always has 16). At most 32: a sequence number carries its partition in its top
    # 16 bits, and the store's scripts count in doubles, exact up to 2^53 (32 << 48).
    _p(
        "EnablePartitioning",
        BOOL,
        "qt",
        False,
        immutable=True,
        flag="partitioning",
        help="Spread the entity over partitions, each in its own cluster slot.",
    ),
    _p(
        "PartitionCount",
        INT,
        "qt",
        16,
        attr="partitions",
        minimum=1,
        maximum=MAX_PARTITIONS,
        bounds=f"1..{MAX_PARTITIONS}",
        enabled_by="EnablePartitioning",
        store=True,
        immutable=True,
        own=True,
        flag="partitions",
        help="Partitions of a partitioned entity (16).",
    ),
    # kept in `extra`: tokens signed with its keys are accepted (busd.auth.rights)
    _p("AuthorizationRules", ACCESS_RULES, "qt", ()),
    # stored and answered back, not acted on
    _p("MaxSizeInMegabytes", INT, "qt", 1024, minimum=1, bounds="at least 1"),
    _p("EnableBatchedOperations", BOOL, "qts", True),
    _p("IsAnonymousAccessible", BOOL, "qt", False),
    _p("Status", STATUS, "qts", "Active"),
    _p("UserMetadata", TEXT, "qts"),
    _p("SupportOrdering", BOOL, "qt", True),
    _p("AutoDeleteOnIdle", DURATION, "qts", None, minimum=300_000, bounds="at least 5 minutes"),
    _p("EnableExpress", BOOL, "qt", False),
    _p("FilteringMessagesBeforePublishing", BOOL, "t", False),
    _p("EnableSubscriptionPartitioning", BOOL, "t", False),
)
BY_NAME: dict[str, Property] = {p.name: p for p in PROPERTIES}
OF_KIND: dict[str, dict[str, Property]] = {
    kind: {p.name: p for p in PROPERTIES if kind in p.kinds} for kind in KINDS
}
STORE: dict[str, tuple[Property, ...]] = {
    kind: tuple(p for p in OF_KIND[kind].values() if p.store) for kind in KINDS
}
# flags that only switch another property's field on (RequiresDuplicateDetection)
_SWITCHES = {p.enabled_by for p in PROPERTIES if p.enabled_by}
# what busd keeps and answers back without acting on it
KEPT_ONLY = frozenset(
    p.name
    for p in PROPERTIES
    if p.attr is None and p.name not in _SWITCHES and p.type != ACCESS_RULES
)

# The management API's elements in the service's order; the names that are no property are
# read-only, filled from the store (busd.http.atom_xml).
ATOM_ORDER: dict[str, tuple[str, ...]] = {
    QUEUE: (
        "LockDuration",
        "MaxSizeInMegabytes",
        "RequiresDuplicateDetection",
        "RequiresSession",
        "DefaultMessageTimeToLive",
        "DeadLetteringOnMessageExpiration",
        "DuplicateDetectionHistoryTimeWindow",
        "MaxDeliveryCount",
        "EnableBatchedOperations",
        "SizeInBytes",
        "MessageCount",
        "IsAnonymousAccessible",
        "AuthorizationRules",
        "Status",
        "ForwardTo",
        "UserMetadata",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "SupportOrdering",
        "CountDetails",
        "AutoDeleteOnIdle",
        "EnablePartitioning",
        "EntityAvailabilityStatus",
        "ForwardDeadLetteredMessagesTo",
        "EnableExpress",
        "MaxMessageSizeInKilobytes",
        "PartitionCount",
        "DeadLetterSessionOnMaxDeliveryCount",
        "SessionIdleTimeToLive",
        "RedeliveryBackoffMinimum",
        "RedeliveryBackoffMaximum",
        "RedeliveryBackoffFactor",
    ),
    TOPIC: (
        "DefaultMessageTimeToLive",
        "MaxSizeInMegabytes",
        "RequiresDuplicateDetection",
        "DuplicateDetectionHistoryTimeWindow",
        "EnableBatchedOperations",
        "SizeInBytes",
        "FilteringMessagesBeforePublishing",
        "IsAnonymousAccessible",
        "AuthorizationRules",
        "Status",
        "UserMetadata",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "SupportOrdering",
        "CountDetails",
        "SubscriptionCount",
        "AutoDeleteOnIdle",
        "EnablePartitioning",
        "EntityAvailabilityStatus",
        "EnableSubscriptionPartitioning",
        "EnableExpress",
        "MaxMessageSizeInKilobytes",
        "PartitionCount",
    ),
    SUBSCRIPTION: (
        "LockDuration",
        "RequiresSession",
        "DefaultMessageTimeToLive",
        "DeadLetteringOnMessageExpiration",
        "DeadLetteringOnFilterEvaluationExceptions",
        "MessageCount",
        "MaxDeliveryCount",
        "EnableBatchedOperations",
        "Status",
        "ForwardTo",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "CountDetails",
        "ForwardDeadLetteredMessagesTo",
        "AutoDeleteOnIdle",
        "EntityAvailabilityStatus",
        "UserMetadata",
        "DeadLetterSessionOnMaxDeliveryCount",
        "SessionIdleTimeToLive",
        "RedeliveryBackoffMinimum",
        "RedeliveryBackoffMaximum",
        "RedeliveryBackoffFactor",
    ),
}


def defaults(kind: str) -> dict[str, Any]:
    """What the service answers for each property of `kind` nobody set."""
    return {name: p.default for name, p in OF_KIND[kind].items()}


def check(
    values: Mapping[str, Any], *, api: bool = False, current: Mapping[str, Any] | None = None
) -> None:
    """ConfigError for the first value out of its property's bounds: the management API's
    with `api` (a change may send a value of `current` back unchanged)."""
    for name, value in values.items():
        prop = BY_NAME.get(name)
        if prop is not None and not (
            current is not None and current.get(name) == value and prop.api_minimum is not None
        ):
            prop.check(value, api)
    check_together(values, kept=current)


def check_together(values: Mapping[str, Any], kept: Mapping[str, Any] | None = None) -> None:
    """ConfigError when values of several properties contradict each other: a redelivery
    backoff's minimum above its maximum. `kept`: the entity's current properties, which a
    change keeps for busd's own ones it leaves out (busd.http.entities)."""
    given = dict(values)
    for name in ("RedeliveryBackoffMinimum", "RedeliveryBackoffMaximum"):
        if name not in given and kept is not None:
            given[name] = kept.get(name)
    low, high = given.get("RedeliveryBackoffMinimum"), given.get("RedeliveryBackoffMaximum")
    if low is not None and high is not None and low > high:
        raise ConfigError(
            f"RedeliveryBackoffMinimum ({format_duration(low)}) must not be longer than "
            f"RedeliveryBackoffMaximum ({format_duration(high)})"
        )


# The partitions of a queue or topic whose description does not say whether it is
# partitioned; None: it is not, as in Service Bus. `busd serve --store-shards N` sets it
# above 1 (docs/design.md §3.9).
_default_partitions: int | None = None


def partition_by_default(count: int | None) -> None:
    """Entities created from now on without EnablePartitioning are partitioned in `count`
    partitions (None: not partitioned), and those that enable it without a PartitionCount
    have `count`."""
    global _default_partitions
    _default_partitions = count


def default_of(prop: Property) -> Any:
    """What an entity whose description leaves `prop` out gets (`partition_by_default`)."""
    if _default_partitions is not None and prop.name == "EnablePartitioning":
        return True
    if _default_partitions is not None and prop.name == "PartitionCount":
        return _default_partitions
    return prop.default


def record_fields(kind: str, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(record fields, extra) of an entity whose properties are `values` (by name, as given:
    what is not given keeps the record's default). A field that a flag switches on is None
    while the flag is off; its value, if given, is kept in `extra` to be answered back."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    of_kind = OF_KIND[kind]
    for name, value in values.items():
        prop = of_kind.get(name)
        if prop is None or name in _SWITCHES:
            continue
        if prop.attr is None:
            extra[name] = value
        elif prop.enabled_by is not None:
            switch = BY_NAME[prop.enabled_by]
            if not values.get(switch.name, default_of(switch)):
                extra[name] = value
        else:
            fields[prop.attr] = prop.to_field(value)
    for prop in of_kind.values():  # switched on, the field takes the value or its default
        if prop.enabled_by is not None and prop.attr is not None:
            switch = BY_NAME[prop.enabled_by]
            on = values.get(switch.name, default_of(switch))
            value = values.get(prop.name, default_of(prop))
            fields[prop.attr] = prop.to_field(value) if on else None
    return fields, extra


def property_values(kind: str, entity: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The properties an entity record holds, by name (its fields and what `extra` keeps);
    None only for durations (unbounded), other unset values are left out."""
    values: dict[str, Any] = {}
    for name, prop in OF_KIND[kind].items():
        if prop.attr is None:
            if name in extra and name not in _SWITCHES:
                values[name] = extra[name]
            continue
        value = getattr(entity, prop.attr)
        if prop.enabled_by is not None:
            values[prop.enabled_by] = value is not None
            if value is None:
                value = extra.get(name)
                if value is None:
                    continue
        if value is not None and prop.scale != 1:
            value = max(1, value // prop.scale)
        values[name] = value
    return {k: v for k, v in values.items() if v is not None or BY_NAME[k].type == DURATION}


def store_fields(kind: str, entity: Any) -> dict[str, Any]:
    """The record's fields the store's handle (QueueSpec) carries."""
    return {p.attr: getattr(entity, p.attr) for p in STORE[kind] if p.attr is not None}


# --- durations as .NET writes them ------------------------------------------------------------

# .NET's TimeSpan.MaxValue: how the service spells an unbounded duration.
UNBOUNDED = "P10675199DT2H48M5.4775807S"


def format_duration(ms: int | None) -> str:
    """xs:duration as .NET writes it: PT1M, PT30S, P14D, PT0.5S; None is TimeSpan.MaxValue."""
    if ms is None:
        return UNBOUNDED
    days, rest = divmod(ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    text = "P" + (f"{days}D" if days else "")
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if millis:
        clock += f"{seconds}.{millis:03d}".rstrip("0") + "S"
    elif seconds:
        clock += f"{seconds}S"
    if clock:
        text += "T" + clock
    return text if text != "P" else "PT0S"
