"""Every property of a queue, topic or subscription, declared once (docs/design.md §3.14).

A `Property` (busd.entities.property_types: how each type of value is read, written and checked)
says how Service Bus names it (the same in the entities file's `Properties` and
as the management API's XML element), its type, default and bounds, which kinds of entity
have it, where busd keeps it (a field of busd.entities.records' records, or `extra`: stored and
answered back, not acted on), whether the store's calls carry it (`QueueSpec`), and its
command-line option. The entities file's reader (busd.config.settings), the management API's reader,
writer and checks (busd.http), the command line (busd.cli.entities) and the store's handle
(busd.entities.records `.spec`) are all derived from `PROPERTIES`; `ATOM_ORDER` is the order the
service writes elements in, read-only ones (filled from the store) included.

Values here are in the property's own unit, as Service Bus spells it: durations in
milliseconds (None: unbounded, TimeSpan.MaxValue on the wire), sizes in the unit the name
says (`MaxMessageSizeInKilobytes`), flags bool, counts int, entity names lower-cased bare
paths. A record field holds `value * scale` (bytes for kilobytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from busd.entities.property_types import (
    ACCESS_RULES,
    BOOL,
    DURATION,
    ENTITY,
    INT,
    NUMBER,
    STATUS,
    TEXT,
    Property,
    format_duration,
)
from busd.errors import ConfigError
from busd.storage.specs import BACKOFF_LONGEST_MS
from busd.units import KIB

QUEUE, TOPIC, SUBSCRIPTION = "queue", "topic", "subscription"
KINDS = (QUEUE, TOPIC, SUBSCRIPTION)
INT32_MAX = 2**31 - 1
MAX_MESSAGE_SIZE_KB = 100 * KIB  # Service Bus premium's largest message, 100 MiB
MAX_PARTITIONS = 32


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
        emulator="qs",
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
        emulator="qs",
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
        emulator="qs",
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
        emulator="qts",
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
        emulator="qs",
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
        emulator="qt",
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
        emulator="qt",
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
        emulator="qs",
    ),
    _p(
        "ForwardDeadLetteredMessagesTo",
        ENTITY,
        "qs",
        attr="forward_dead_lettered_to",
        flag="forward-dead-lettered-to",
        help="Queue or topic to move dead letters to.",
        emulator="qs",
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
    _p("UserMetadata", TEXT, "qts", maximum=1024, bounds="at most 1024 characters"),
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
