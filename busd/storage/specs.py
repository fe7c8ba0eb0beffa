"""The handles of entities in every Store call: a queue or subscription (`QueueSpec`), a topic
(`TopicSpec`), with the properties the store needs on each call and the partition a handle
reaches (docs/design.md §3.18)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Self

from busd.storage.keys import EVEN_LAYOUT, partition_scope

# The longest redelivery backoff, and what one without a maximum grows to (docs/design.md
# §2.17): a week, as the longest duplicate detection window.
BACKOFF_LONGEST_MS = 7 * 86_400_000


class _Partitioned:
    """A handle's partitions (a queue's, a subscription's, a topic's)."""

    __slots__ = ()
    partitions: int | None

    def partition_spec(self, i: int) -> Self:
        """The handle of partition `i`: one queue to the store, its keys the partition's, its
        `partitions` None."""
        return dataclasses.replace(
            self,  # type: ignore[type-var]  # each subclass is a dataclass
            partitions=None,
            partition=i,
            partition_count=self.partitions,
        )

    @property
    def partition_specs(self) -> tuple[Self, ...]:
        """A handle of each partition (`partition_spec`), itself when not partitioned."""
        if not self.partitions:
            return (self,)
        return tuple(self.partition_spec(i) for i in range(self.partitions))


@dataclass(frozen=True, slots=True)
class QueueSpec(_Partitioned):
    """The handle of a queue-like entity in every Store call: a queue, or a topic's
    subscription (`topic` set), with the properties the store needs on each call; with `dlq`
    its dead-letter sub-queue (the same properties, other messages; `.dead_letter_queue`).

    `name` is the entity's path, lower-cased (Service Bus names are case-insensitive): the
    queue's name, or `<topic>/subscriptions/<subscription>`. It names the entity in logs,
    metrics and tools; the store builds keys from `key_scope`."""

    name: str
    requires_session: bool = False
    lock_duration_ms: int = 60_000
    max_delivery_count: int = 10
    default_ttl_ms: int | None = None  # None: unbounded; else also the ceiling of a message's ttl
    dead_letter_on_expiration: bool = False
    dead_letter_session_on_max_delivery: bool = False  # docs/design.md §2.9
    # None: never; else a session with no messages and no holder this long is removed (state
    # included) by the sweep (docs/design.md §2.6)
    session_idle_ttl_ms: int | None = None
    # redelivery backoff (docs/design.md §2.17): None off; else an abandoned or lock-expired
    # message is available again min * factor^(delivery count - 1) ms later, at most max
    backoff_min_ms: int | None = None
    backoff_max_ms: int | None = None  # None: the longest (busd.entities.properties)
    backoff_factor: float = 2.0
    duplicate_detection_window_ms: int | None = None  # None: duplicate detection off
    max_message_size: int = 1024 * 1024
    dlq: bool = False
    topic: str | None = None  # a subscription's topic; None for a queue
    partitions: int | None = None  # a partitioned entity's partition count; None: not one
    partition: int | None = None  # the one partition of one this handle reaches, if set
    # how its partitions' hash tags are made (busd.storage.keys: FIRST_LAYOUT, EVEN_LAYOUT)
    partition_layout: int = EVEN_LAYOUT
    partition_count: int | None = None  # a partition's handle: its entity's `partitions`

    @property
    def dead_letter_queue(self) -> QueueSpec:
        return self if self.dlq else dataclasses.replace(self, dlq=True)

    @property
    def path(self) -> str:
        return f"{self.name}/$deadletterqueue" if self.dlq else self.name

    @property
    def subscription(self) -> str | None:
        """A subscription's own name (the last segment of its path); None for a queue."""
        return None if self.topic is None else self.name.rsplit("/", 1)[1]

    @property
    def key_scope(self) -> tuple[str, str | None]:
        """(queue or topic, subscription or None): what busd.storage.keys builds keys from; a
        partition's is that of its own hash tag."""
        scope = (self.name, None) if self.topic is None else (self.topic, self.subscription)
        if self.partition is None:
            return scope
        place = partition_scope(
            scope[0], self.partition, self.partition_count, self.partition_layout
        )
        return (place, scope[1])


def subscription_path(topic: str, subscription: str) -> str:
    return f"{topic}/subscriptions/{subscription}"


@dataclass(frozen=True, slots=True)
class TopicSpec(_Partitioned):
    """The handle of a topic in Store calls: what the store needs to accept a message sent to
    it (its subscriptions are given beside it, as QueueSpecs with `topic` set)."""

    name: str
    default_ttl_ms: int | None = None  # the ceiling of a message's ttl at the topic
    duplicate_detection_window_ms: int | None = None
    max_message_size: int = 1024 * 1024
    partitions: int | None = None  # as QueueSpec's: its subscriptions share them
    partition: int | None = None
    partition_layout: int = EVEN_LAYOUT
    partition_count: int | None = None

    @property
    def key_scope(self) -> tuple[str, None]:
        """(topic, None): what busd.storage.keys builds the topic's own keys from (a
        partition's, for a partition's handle)."""
        if self.partition is None:
            return (self.name, None)
        place = partition_scope(
            self.name, self.partition, self.partition_count, self.partition_layout
        )
        return (place, None)
