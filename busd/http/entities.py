"""Entities as the management API sees them: what `busd.http.atom` asks of the broker's
entities, and the counts it answers with.

Properties are carried by Service Bus element name (`LockDuration` in ms, `RequiresSession`, ...;
busd.http.atom_xml); this module maps them to and from the broker's entity specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from busd.config import DEFAULT_DUPLICATE_WINDOW_MS, KIB
from busd.http import atom_xml as ax
from busd.storage.api import EntityCounts, QueueSpec


@dataclass
class Entity:
    kind: str  # queue, topic, subscription, rule
    path: str  # lower-cased: q, t, t/s, t/s/r
    properties: dict[str, Any] = field(default_factory=dict)  # by element name
    created_ms: int | None = None
    updated_ms: int | None = None
    title: str | None = None  # the name as created, when the path is lower-cased (rules)

    @property
    def name(self) -> str:
        """What `<title>` carries: a subscription's or rule's own name, a queue's whole path."""
        if self.title:
            return self.title
        return self.path if self.kind in ("queue", "topic") else self.path.rsplit("/", 1)[1]


class Entities(Protocol):
    async def get(self, kind: str, path: str) -> Entity | None: ...

    async def list(self, kind: str, parent: str | None = None) -> list[Entity]: ...

    async def create(self, kind: str, path: str, properties: dict[str, Any]) -> Entity: ...

    async def update(self, kind: str, path: str, properties: dict[str, Any]) -> Entity: ...

    async def delete(self, kind: str, path: str) -> bool: ...

    async def runtime(self, entity: Entity) -> ax.Runtime: ...


def queue_properties(spec: QueueSpec) -> dict[str, Any]:
    """A queue's spec as ATOM properties."""
    window = spec.duplicate_detection_window_ms
    return {
        "LockDuration": spec.lock_duration_ms,
        "RequiresSession": spec.requires_session,
        "MaxDeliveryCount": spec.max_delivery_count,
        "DefaultMessageTimeToLive": spec.default_ttl_ms,
        "DeadLetteringOnMessageExpiration": spec.dead_letter_on_expiration,
        "RequiresDuplicateDetection": window is not None,
        "DuplicateDetectionHistoryTimeWindow": window or DEFAULT_DUPLICATE_WINDOW_MS,
        "MaxMessageSizeInKilobytes": max(1, spec.max_message_size // KIB),
    }


def runtime_of(counts: EntityCounts) -> ax.Runtime:
    """The counts the SDKs (and KEDA) read, from the store's (docs/management.md §4).

    ActiveMessageCount is what a receiver has yet to finish: available now or locked by a
    receiver that has not settled it (Service Bus counts a locked message as active until it
    is completed). Deferred messages are not active (only a receive by sequence number gets
    them) but are in MessageCount, the total of every state."""
    active = counts.active + counts.locked
    return ax.Runtime(
        active=active,
        dead_letter=counts.dead_letter,
        scheduled=counts.scheduled,
        message_count=active + counts.deferred + counts.scheduled + counts.dead_letter,
    )


class ConfigEntities:
    """The queues a process read from its entities file: served, not changed."""

    def __init__(self, broker) -> None:
        self.broker = broker

    async def get(self, kind: str, path: str) -> Entity | None:
        spec = self.broker.queue(path) if kind == "queue" else None
        return Entity("queue", spec.name, queue_properties(spec)) if spec else None

    async def list(self, kind: str, parent: str | None = None) -> list[Entity]:
        if kind != "queue":
            return []
        return [Entity("queue", q.name, queue_properties(q.spec))
                for q in self.broker.catalog.queues()]

    async def create(self, kind: str, path: str, properties: dict[str, Any]) -> Entity:
        raise ax.AtomError(403, "entities come from the entities file: none can be created",
                           40301)

    async def update(self, kind: str, path: str, properties: dict[str, Any]) -> Entity:
        raise ax.AtomError(403, "entities come from the entities file: none can be changed",
                           40301)

    async def delete(self, kind: str, path: str) -> bool:
        if await self.get(kind, path) is None:
            return False
        raise ax.AtomError(403, "entities come from the entities file: none can be deleted",
                           40301)

    async def runtime(self, entity: Entity) -> ax.Runtime:
        spec = self.broker.queue(entity.path)
        if spec is None:
            return ax.Runtime()
        return runtime_of(await self.broker.store.counts(spec))
