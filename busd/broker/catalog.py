"""The entities every process serves: a cached view of the store's catalog
(docs/design.md §3.14).

The store holds the records (busd.storage.api Store.catalog_*); each process keeps them all in
memory, so a link attach or a send looks an entity up without a store call. The view follows
the store: a change made by any process is announced over pub/sub and read again here, and a
(re)subscription reloads everything (changes may have been missed meanwhile). Changes made
through this object are applied to the view at once as well.

Writes keep the store's entity data consistent with the records: a subscription is marked live
in its topic before its record is written (fan-out stores copies only in live subscriptions),
and an entity's record is deleted before its messages, sessions and state are, so no process
keeps routing to data that is gone. Listeners hear of every entity that appeared, changed or
went (`listen`): the broker detaches the links of a deleted entity.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from busd.auth.rights import rule_keys
from busd.entities.records import (
    DEFAULT_RULE_NAME,
    KINDS,
    Entity,
    QueueEntity,
    RuleEntity,
    SubscriptionEntity,
    TopicEntity,
    from_record,
    lowered,
    rule_path,
    to_record,
)
from busd.errors import BusdError, Condition
from busd.storage.api import Store
from busd.storage.specs import QueueSpec, subscription_path

log = logging.getLogger("busd.broker")

# Called with (the entity before, the entity after) a change; None for absent.
Listener = Callable[[Entity | None, Entity | None], None]


class RecordFollower(Protocol):
    """Follows the catalog's records of a kind that is no entity (a fault on demand's): read
    and announced with the entities', from the one subscription to the catalog's changes."""

    def replace(self, records: dict[str, dict[str, Any]]) -> None:
        """Every record of the kind, by path (at a reload)."""

    def changed(self, path: str, record: dict[str, Any] | None) -> None:
        """One record was written (None: deleted)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class Catalog:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._entities: dict[tuple[str, str], Entity] = {}  # (kind, path) -> entity
        # derived indexes, rebuilt by _index()
        self._specs: dict[str, QueueSpec] = {}  # queue-like path -> store handle
        self._subs_of: dict[str, list[SubscriptionEntity]] = {}  # topic -> subscriptions
        self._rules_of: dict[str, list[RuleEntity]] = {}  # subscription path -> rules
        # queue or topic -> its AuthorizationRules' keys (busd.auth.rights.EntityKeys), read at
        # each put-token: kept here so that needs no store call and follows every change
        self._access_keys: dict[str, tuple[Mapping[str, str], ...]] = {}
        self._listeners: list[Listener] = []
        self._followers: dict[str, RecordFollower] = {}  # record kind -> its follower
        self._dirty: set[str | None] = set()  # catalog fields to read again; None: all
        self._worker: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Load every record and follow changes from then on."""
        await self.store.catalog_subscribe(self._changed)
        await self.reload()

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def follow_records(self, kind: str, follower: RecordFollower) -> None:
        """`follower` hears of every record of `kind` from now (what is stored already: its
        own read, or the next reload)."""
        self._followers[kind] = follower

    async def reload(self) -> None:
        records = await self.store.catalog_all()
        fresh: dict[tuple[str, str], Entity] = {}
        followed: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in self._followers}
        for name, record in records.items():
            kind, _, path = name.partition(":")
            if kind in followed:
                followed[kind][path] = record
                continue
            entity = self._parse(kind, path, record)
            if entity is not None:
                fresh[(kind, path)] = entity
        for kind, of_kind in followed.items():
            self._followers[kind].replace(of_kind)
        old, self._entities = self._entities, fresh
        self._index()
        for key in old.keys() | fresh.keys():
            if old.get(key) != fresh.get(key):
                self._announce(old.get(key), fresh.get(key))

    async def settled(self) -> None:
        """Wait until every announced change has been read (tests, tools)."""
        while self._worker is not None and not self._worker.done():
            await asyncio.wait([self._worker])

    # --- lookups (no store call) -------------------------------------------------------------
    def queue(self, name: str) -> QueueEntity | None:
        found = self._entities.get(("queue", name.lower()))
        return found if isinstance(found, QueueEntity) else None

    def topic(self, name: str) -> TopicEntity | None:
        found = self._entities.get(("topic", name.lower()))
        return found if isinstance(found, TopicEntity) else None

    def subscription(self, topic: str, name: str) -> SubscriptionEntity | None:
        found = self._entities.get(("subscription", subscription_path(topic.lower(), name.lower())))
        return found if isinstance(found, SubscriptionEntity) else None

    def rule(self, topic: str, subscription: str, name: str) -> RuleEntity | None:
        found = self._entities.get(("rule", rule_path(topic.lower(), subscription.lower(), name)))
        return found if isinstance(found, RuleEntity) else None

    async def stored(self, kind: str, path: str) -> Entity | None:
        """An entity as the store holds it now (this view may not have heard of it yet)."""
        path = path.lower()
        record = await self.store.catalog_get(kind, path)
        return None if record is None else self._parse(kind, path, record)

    def queues(self) -> list[QueueEntity]:
        return sorted(
            (e for e in self._entities.values() if isinstance(e, QueueEntity)), key=lambda e: e.name
        )

    def topics(self) -> list[TopicEntity]:
        return sorted(
            (e for e in self._entities.values() if isinstance(e, TopicEntity)), key=lambda e: e.name
        )

    def subscriptions(self, topic: str) -> list[SubscriptionEntity]:
        """A topic's subscriptions, by name."""
        return list(self._subs_of.get(topic.lower(), ()))

    def rules(self, topic: str, subscription: str) -> list[RuleEntity]:
        """A subscription's rules in creation order, `$Default` first."""
        return list(self._rules_of.get(subscription_path(topic.lower(), subscription.lower()), ()))

    def access_keys(self, name: str) -> tuple[Mapping[str, str], ...]:
        """The keys of a queue's or topic's own shared access rules (busd.auth.rights.EntityKeys:
        primary keys by KeyName, then secondary ones); () when it has none."""
        return self._access_keys.get(name.lower(), ())

    def spec(self, path: str) -> QueueSpec | None:
        """The store handle of a queue or subscription by its path (`t/subscriptions/s`)."""
        return self._specs.get(path.lower())

    def specs(self) -> list[QueueSpec]:
        """Every queue-like entity (queues and subscriptions): what the sweep visits."""
        return list(self._specs.values())

    def __len__(self) -> int:
        return len(self._entities)

    # --- changes ------------------------------------------------------------------------------
    async def create(
        self, entity: Entity, *, rules: Iterable[RuleEntity] | None = None, check: bool = True
    ) -> Entity:
        """Create an entity; BusdError ENTITY_ALREADY_EXISTS when it (or a queue or topic of
        the same name) exists, NOT_FOUND when its parent does not, ARGUMENT_ERROR when its
        forwarding is refused (`check_forwarding`; `check=False`: the caller checked, as the
        entities file does for all its entities at once). A subscription gets `rules`, or the
        `$Default` TrueFilter rule when none are given."""
        entity = self._stamped(lowered(entity))
        self._check_parent(entity)
        if check:
            self.check_forwarding(entity)
        if entity.kind in ("queue", "topic"):
            other = "topic" if entity.kind == "queue" else "queue"
            if (other, entity.path) in self._entities or await self.store.catalog_get(
                other, entity.path
            ) is not None:
                raise _exists(entity)
        if isinstance(entity, SubscriptionEntity):
            await self._open_subscription(entity)
        if not await self.store.catalog_put(
            entity.kind, entity.path, to_record(entity), only_new=True
        ):
            raise _exists(entity)
        self._apply(entity.kind, entity.path, entity)
        if isinstance(entity, SubscriptionEntity):
            given = (
                list(rules)
                if rules is not None
                else [RuleEntity(entity.topic, entity.name, DEFAULT_RULE_NAME)]
            )
            for rule in given:
                await self.create(rule)
        return entity

    async def update(self, entity: Entity, *, check: bool = True) -> Entity:
        """Replace an existing entity's properties (its creation time stays)."""
        entity = lowered(entity)
        if check:
            self.check_forwarding(entity)
        current = self._entities.get((entity.kind, entity.path))
        if current is None:
            current = await self.stored(entity.kind, entity.path)
        if current is None:
            raise _not_found(entity.path)
        entity = _kept(entity, current)
        await self.store.catalog_put(entity.kind, entity.path, to_record(entity))
        self._apply(entity.kind, entity.path, entity)
        return entity

    async def put(self, entity: Entity, *, rules: Iterable[RuleEntity] | None = None) -> Entity:
        """Create or update (the entities file's seeding, which several processes may do at
        once). A subscription's rules, when given, replace the stored ones."""
        try:
            return await self.create(entity, rules=rules, check=False)
        except BusdError as exc:
            if exc.condition != Condition.ENTITY_ALREADY_EXISTS:
                raise
        entity = lowered(entity)
        current = self._entities.get((entity.kind, entity.path))
        if (
            isinstance(current, (QueueEntity, TopicEntity))
            and isinstance(entity, (QueueEntity, TopicEntity))
            and entity.partitions != current.partitions
        ):
            # Its messages live in the keys of its partitions: fixed at creation
            # (docs/design.md §3.18).
            log.warning(
                "%s '%s': partitioning is fixed when an entity is created; the file's "
                "EnablePartitioning/PartitionCount is ignored (delete the entity to "
                "change it)",
                entity.kind,
                entity.path,
            )
            entity = replace(entity, partitions=current.partitions)
        if current is not None:
            entity = _kept(entity, current)
        if current is None or replace(current, created_ms=None) != replace(entity, created_ms=None):
            entity = await self.update(entity, check=False)
        if isinstance(entity, SubscriptionEntity) and rules is not None:
            await self._open_subscription(entity)
            wanted = {r.path: r for r in rules}
            stale = [
                ("rule", r.path)
                for r in self.rules(entity.topic, entity.name)
                if r.path not in wanted
            ]
            await self._delete_records(stale)
            for rule in wanted.values():
                existing = self._entities.get(("rule", rule.path))
                if existing is None:
                    try:
                        await self.create(rule)
                        continue
                    except BusdError as exc:
                        if exc.condition != Condition.ENTITY_ALREADY_EXISTS:
                            raise
                        existing = self._entities.get(("rule", rule.path))
                if not isinstance(existing, RuleEntity) or existing.rule != rule.rule:
                    await self.update(rule)
        return entity

    async def delete(self, kind: str, path: str) -> bool:
        """Delete an entity with what hangs off it (a topic's subscriptions, a subscription's
        rules) and its messages, sessions and state. False when it does not exist."""
        path = path.lower()
        entity = self._entities.get((kind, path))
        if entity is None:
            entity = await self.stored(kind, path)
        if entity is None:
            return False
        if isinstance(entity, RuleEntity):
            await self._delete_records([("rule", path)])
            return True
        if isinstance(entity, QueueEntity):
            await self._delete_records([("queue", path)])
            await self.store.drop_queue(entity.spec)
            return True
        if isinstance(entity, SubscriptionEntity):
            topic = self.topic(entity.topic) or TopicEntity(entity.topic)
            subs = [entity]
        else:
            assert isinstance(entity, TopicEntity)
            topic, subs = entity, self.subscriptions(entity.name)
        records = [(s.kind, s.path) for s in subs]
        records += [("rule", r.path) for s in subs for r in self.rules(s.topic, s.name)]
        if isinstance(entity, TopicEntity):
            records.append(("topic", path))
        await self._delete_records(records)
        await self.store.drop_subscriptions(
            topic.spec, [s.spec(topic) for s in subs], with_topic=isinstance(entity, TopicEntity)
        )
        return True

    async def _open_subscription(self, entity: SubscriptionEntity) -> None:
        """Mark the subscription live in its topic (in each of its partitions)."""
        topic = self.topic(entity.topic) or TopicEntity(entity.topic)
        await self.store.open_subscriptions(topic.spec, [entity.name])

    async def _delete_records(self, records: list[tuple[str, str]]) -> None:
        if not records:
            return
        await self.store.catalog_delete(records)
        for kind, path in records:
            self._apply(kind, path, None)

    def check_forwarding(self, entity: Entity) -> None:
        """Service Bus forwards from a queue or subscription to a queue or topic that exists
        (the source itself, or from a session-enabled source, included: docs/design.md
        §2.15): anything else is refused with ARGUMENT_ERROR."""
        if not isinstance(entity, (QueueEntity, SubscriptionEntity)):
            return
        for element, target in (
            ("ForwardTo", entity.forward_to),
            ("ForwardDeadLetteredMessagesTo", entity.forward_dead_lettered_to),
        ):
            if target is None or target.lower() == entity.path:  # itself: it exists
                continue
            destination = self.queue(target) or self.topic(target)
            if destination is None:
                raise BusdError(
                    Condition.ARGUMENT_ERROR,
                    f"{element} of '{entity.path}': the destination '{target}' "
                    "is not a queue or topic of this namespace.",
                )
            if getattr(destination, "partitions", None):
                raise BusdError(
                    Condition.ARGUMENT_ERROR,
                    f"{element} of '{entity.path}': auto-forwarding to a "
                    "partitioned entity is not supported.",
                )

    def _stamped(self, entity: Entity) -> Entity:
        if entity.created_ms is not None:
            return entity
        return replace(entity, created_ms=_now_ms())

    def _check_parent(self, entity: Entity) -> None:
        if isinstance(entity, SubscriptionEntity) and self.topic(entity.topic) is None:
            raise _not_found(entity.topic)
        if (
            isinstance(entity, RuleEntity)
            and self.subscription(entity.topic, entity.subscription) is None
        ):
            raise _not_found(entity.subscription_path)

    # --- following the store ------------------------------------------------------------------
    def _changed(self, field: str | None) -> None:
        """A record changed somewhere (None: reload all): read it again, in order."""
        self._dirty.add(field)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(
                self._follow(), name="busd-catalog-follow"
            )

    async def _follow(self) -> None:
        while self._dirty:
            if None in self._dirty:
                self._dirty.clear()
                await self._retrying(self.reload)
                continue
            field = self._dirty.pop()
            assert field is not None
            kind, _, path = field.partition(":")
            await self._retrying(functools.partial(self._read_one, kind, path))

    async def _read_one(self, kind: str, path: str) -> None:
        record = await self.store.catalog_get(kind, path)
        follower = self._followers.get(kind)
        if follower is not None:
            follower.changed(path, record)
            return
        self._apply(kind, path, None if record is None else self._parse(kind, path, record))

    async def _retrying(self, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await step()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: the view waits for it
                log.warning("reading the entity catalog failed: %s", exc)
                await asyncio.sleep(1.0)

    def _parse(self, kind: str, path: str, record: dict) -> Entity | None:
        if kind not in KINDS:
            return None
        try:
            return from_record(kind, record)
        except (TypeError, ValueError) as exc:
            log.error("catalog record %s:%s is unreadable and is ignored: %s", kind, path, exc)
            return None

    def _apply(self, kind: str, path: str, entity: Entity | None) -> None:
        key = (kind, path)
        old = self._entities.get(key)
        if old == entity:
            return
        if entity is None:
            del self._entities[key]
        else:
            self._entities[key] = entity
        self._index()
        self._announce(old, entity)

    def _announce(self, old: Entity | None, new: Entity | None) -> None:
        for listener in self._listeners:
            try:
                listener(old, new)
            except Exception:
                log.exception("catalog listener failed")

    def _index(self) -> None:
        """Rebuild the derived lookups (entities change rarely; this is O(entities))."""
        specs: dict[str, QueueSpec] = {}
        subs_of: dict[str, list[SubscriptionEntity]] = {}
        rules_of: dict[str, list[RuleEntity]] = {}
        access_keys: dict[str, tuple[Mapping[str, str], ...]] = {}
        for entity in self._entities.values():
            if isinstance(entity, (QueueEntity, TopicEntity)) and entity.extra.get(
                "AuthorizationRules"
            ):
                access_keys[entity.path] = rule_keys(entity.extra["AuthorizationRules"])
            if isinstance(entity, QueueEntity):
                specs[entity.path] = entity.spec
            elif isinstance(entity, SubscriptionEntity):
                topic = self._entities.get(("topic", entity.topic))
                if isinstance(topic, TopicEntity):  # an orphan (topic half-deleted) is not served
                    specs[entity.path] = entity.spec(topic)
                    subs_of.setdefault(entity.topic, []).append(entity)
            elif isinstance(entity, RuleEntity):
                rules_of.setdefault(entity.subscription_path, []).append(entity)
        for subs in subs_of.values():
            subs.sort(key=lambda s: s.name)
        for rules in rules_of.values():
            rules.sort(
                key=lambda r: (
                    r.name.lower() != DEFAULT_RULE_NAME.lower(),
                    r.created_ms or 0,
                    r.name.lower(),
                )
            )
        self._specs, self._subs_of, self._rules_of = specs, subs_of, rules_of
        self._access_keys = access_keys


def _kept(entity: Entity, current: Entity) -> Entity:
    """`entity` as an update writes it: with what was fixed when `current` was created (its
    creation time; how its partitions' keys are tagged, busd.storage.keys)."""
    entity = replace(entity, created_ms=current.created_ms)
    if isinstance(entity, (QueueEntity, TopicEntity)) and isinstance(
        current, (QueueEntity, TopicEntity)
    ):
        entity = replace(entity, partition_layout=current.partition_layout)
    return entity


def _exists(entity: Entity) -> BusdError:
    return BusdError(
        Condition.ENTITY_ALREADY_EXISTS, f"The messaging entity '{entity.path}' already exists."
    )


def _not_found(path: str) -> BusdError:
    return BusdError(Condition.NOT_FOUND, f"The messaging entity '{path}' could not be found.")
