"""The entity model: queues, topics, subscriptions and rules as records (docs/design.md §2.1).

Entities are records in the store's catalog (busd.storage.api Store.catalog_*), written by the
entities file at start-up and by the management API at run time, and read by every process
through its cached view (busd.broker.catalog). Each record is a frozen dataclass here and a
JSON-able dict in the store (`to_record` / `from_record`); the broker is written against these
and hands the store the small handle it needs (`QueueSpec`, via `.spec`).

Paths are lower-cased (Service Bus names are case-insensitive): a queue's or topic's name, a
subscription's `<topic>/subscriptions/<name>`, a rule's `<subscription path>/rules/<name>`.
`extra` keeps properties busd stores and echoes but does not act on (by Service Bus element
name: `UserMetadata`, `Status`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from busd.entities import properties as ep
from busd.storage.keys import EVEN_LAYOUT, FIRST_LAYOUT
from busd.storage.specs import QueueSpec, TopicSpec, subscription_path

DEFAULT_RULE_NAME = "$Default"
# The rule every new subscription gets unless its creator gives rules (spec: a TrueFilter).
TRUE_FILTER_RULE: dict[str, Any] = {"filter": {"type": "true"}}


def _default(name: str) -> Any:
    """A field's default, as busd.entities.properties declares the property."""
    return ep.BY_NAME[name].field_default


DEFAULT_LOCK_DURATION_MS: int = _default("LockDuration")
DEFAULT_MAX_DELIVERY_COUNT: int = _default("MaxDeliveryCount")
DEFAULT_MAX_MESSAGE_SIZE: int = _default("MaxMessageSizeInKilobytes")


# Fields: one per property busd acts on (busd.entities.properties names them by `attr`); the
# properties it only keeps are in `extra`.
@dataclass(frozen=True)
class QueueEntity:
    kind: ClassVar[str] = "queue"
    name: str
    requires_session: bool = _default("RequiresSession")
    lock_duration_ms: int = DEFAULT_LOCK_DURATION_MS
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    default_ttl_ms: int | None = _default("DefaultMessageTimeToLive")  # None: unbounded
    dead_letter_on_expiration: bool = _default("DeadLetteringOnMessageExpiration")
    dead_letter_session_on_max_delivery: bool = _default("DeadLetterSessionOnMaxDeliveryCount")
    session_idle_ttl_ms: int | None = _default("SessionIdleTimeToLive")  # None: never
    # redelivery backoff (docs/design.md §2.17): minimum None is off; maximum None the longest
    backoff_min_ms: int | None = _default("RedeliveryBackoffMinimum")
    backoff_max_ms: int | None = _default("RedeliveryBackoffMaximum")
    backoff_factor: float = _default("RedeliveryBackoffFactor")
    duplicate_detection_window_ms: int | None = None  # None: off
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    forward_to: str | None = None  # bare entity path
    forward_dead_lettered_to: str | None = None
    partitions: int | None = None  # None: not partitioned
    # how its partitions' keys are tagged (busd.storage.keys), fixed at creation: records
    # written before the even layout have none (`from_record`)
    partition_layout: int = EVEN_LAYOUT
    extra: dict[str, Any] = field(default_factory=dict, compare=True)
    created_ms: int | None = None

    @property
    def path(self) -> str:
        return self.name

    @classmethod
    def from_spec(cls, spec: QueueSpec) -> QueueEntity:
        """The queue a store handle describes (tests and tools that start from a handle)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: getattr(spec, k) for k in fields if k in QueueSpec.__dataclass_fields__})

    @functools.cached_property
    def spec(self) -> QueueSpec:
        # Built once per version of the queue (an entity is replaced, never changed): every
        # link's attach asks for it.
        return QueueSpec(
            name=self.name,
            partition_layout=self.partition_layout,
            **ep.store_fields(self.kind, self),
        )


@dataclass(frozen=True)
class TopicEntity:
    kind: ClassVar[str] = "topic"
    name: str
    default_ttl_ms: int | None = _default("DefaultMessageTimeToLive")
    duplicate_detection_window_ms: int | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    partitions: int | None = None  # None: not partitioned
    partition_layout: int = EVEN_LAYOUT  # as QueueEntity's; its subscriptions' too
    extra: dict[str, Any] = field(default_factory=dict)
    created_ms: int | None = None

    @property
    def path(self) -> str:
        return self.name

    @property
    def spec(self) -> TopicSpec:
        return TopicSpec(
            name=self.name,
            partition_layout=self.partition_layout,
            **ep.store_fields(self.kind, self),
        )


@dataclass(frozen=True)
class SubscriptionEntity:
    """Queue-like: its own locks, delivery counts, sessions, state, TTL and dead letters."""

    kind: ClassVar[str] = "subscription"
    topic: str
    name: str
    requires_session: bool = _default("RequiresSession")
    lock_duration_ms: int = DEFAULT_LOCK_DURATION_MS
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    default_ttl_ms: int | None = _default("DefaultMessageTimeToLive")
    dead_letter_on_expiration: bool = _default("DeadLetteringOnMessageExpiration")
    dead_letter_session_on_max_delivery: bool = _default("DeadLetterSessionOnMaxDeliveryCount")
    dead_letter_on_filter_exceptions: bool = _default("DeadLetteringOnFilterEvaluationExceptions")
    session_idle_ttl_ms: int | None = _default("SessionIdleTimeToLive")
    backoff_min_ms: int | None = _default("RedeliveryBackoffMinimum")
    backoff_max_ms: int | None = _default("RedeliveryBackoffMaximum")
    backoff_factor: float = _default("RedeliveryBackoffFactor")
    forward_to: str | None = None
    forward_dead_lettered_to: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    created_ms: int | None = None

    @property
    def path(self) -> str:
        return subscription_path(self.topic, self.name)

    def spec(self, topic: TopicEntity) -> QueueSpec:
        """The store's handle. A copy's time to live is capped by both the topic's and the
        subscription's default, so the subscription's ceiling is the lower of the two; its
        largest message is the topic's."""
        ttls = [t for t in (topic.default_ttl_ms, self.default_ttl_ms) if t is not None]
        fields = {
            **ep.store_fields(self.kind, self),
            "default_ttl_ms": min(ttls) if ttls else None,
            "max_message_size": topic.max_message_size,
            "partitions": topic.partitions,
            "partition_layout": topic.partition_layout,
        }  # a topic's partitions are its subscriptions'
        return QueueSpec(name=self.path, topic=self.topic, **fields)


@dataclass(frozen=True)
class RuleEntity:
    """A subscription's rule. `rule` is the rules package's JSON-able form of the filter and
    action (busd.rules); the catalog stores it as given."""

    kind: ClassVar[str] = "rule"
    topic: str
    subscription: str
    name: str  # as created (rule names compare case-insensitively: see `key`)
    rule: dict[str, Any] = field(default_factory=lambda: dict(TRUE_FILTER_RULE))
    created_ms: int | None = None

    @property
    def path(self) -> str:
        return rule_path(self.topic, self.subscription, self.name)

    @property
    def subscription_path(self) -> str:
        return subscription_path(self.topic, self.subscription)


Entity = QueueEntity | TopicEntity | SubscriptionEntity | RuleEntity
KINDS: dict[str, type] = {
    c.kind: c for c in (QueueEntity, TopicEntity, SubscriptionEntity, RuleEntity)
}


def rule_path(topic: str, subscription: str, rule: str) -> str:
    return f"{subscription_path(topic, subscription)}/rules/{rule.lower()}"


def lowered(entity: Entity) -> Entity:
    """The entity with its names lower-cased, as busd keeps them (Service Bus names are
    case-insensitive); a rule keeps its name as given (its path is lower-case)."""
    changes: dict[str, str] = {}
    if not isinstance(entity, RuleEntity):
        changes["name"] = entity.name.lower()
    if isinstance(entity, (SubscriptionEntity, RuleEntity)):
        changes["topic"] = entity.topic.lower()
    if isinstance(entity, RuleEntity):
        changes["subscription"] = entity.subscription.lower()
    return dataclasses.replace(entity, **changes)  # type: ignore[arg-type]


def to_record(entity: Entity) -> dict[str, Any]:
    """The JSON-able form kept in the store's catalog."""
    return dataclasses.asdict(entity)


def from_record(kind: str, record: dict[str, Any]) -> Entity:
    """The entity of a catalog record; fields this version does not know are ignored (a newer
    busd may have written them) and missing ones take their defaults."""
    cls = KINDS[kind]
    known = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in record.items() if k in known}
    if "partition_layout" in known and "partition_layout" not in record:
        fields["partition_layout"] = FIRST_LAYOUT  # written before the even layout
    return cls(**fields)
