"""The entities file written into the store's catalog at start (docs/design.md §2.1).

The whole file is checked against what the store holds before anything is written, with the
management API's rules for what cannot change on an existing entity, so a file that asks for
something the store cannot become changes nothing and stops the start with one line naming
the entity:

- an entity's kind is fixed: a queue the file declares as a topic (or the other way round) is
  refused, as the management API refuses a second entity of that name;
- RequiresSession is fixed while the entity holds messages: flipped, they would stay counted
  where no receiver can take them. On an empty entity the file wins, as for any property;
- partitioning is fixed at creation (its messages live in its partitions' keys): the stored
  one is kept, with a warning (busd.broker.catalog.Catalog.put).
"""

from __future__ import annotations

from dataclasses import replace

from busd.broker.catalog import Catalog
from busd.config.entities_file import EntitiesFile
from busd.entities import access_rules
from busd.entities.records import QueueEntity, SubscriptionEntity, TopicEntity
from busd.errors import BusdError, Condition, ConfigError


async def seed_catalog(catalog: Catalog, entities: EntitiesFile) -> None:
    """Write the entities file into the store's catalog: the file wins for the entities it
    names (their properties, and a subscription's rules, become the file's); entities created
    at run time and absent from the file are left alone. Keys and times of shared access rules
    the file leaves out are the stored ones (busd.entities.access_rules). ConfigError, before any
    write, when the file asks for a change the store's entities cannot take."""
    await check_against_store(catalog, entities)
    label = ""
    try:
        for queue in entities.queues:
            label = f"queue '{queue.name}'"
            await _put_keeping_keys(catalog, queue, catalog.queue(queue.name))
        for topic in entities.topics:
            label = f"topic '{topic.name}'"
            await _put_keeping_keys(catalog, topic, catalog.topic(topic.name))
        for sub in entities.subscriptions:
            label = f"subscription '{sub.path}'"
            await catalog.put(sub, rules=entities.rules_of(sub))
    except BusdError as exc:
        # another process changed the catalog between the check and this write
        raise ConfigError(f"entities file: {label}: {exc.description}") from None


async def check_against_store(catalog: Catalog, entities: EntitiesFile) -> None:
    """ConfigError naming the first entity of the file that the store's cannot become."""
    declared: list[QueueEntity | TopicEntity] = [*entities.queues, *entities.topics]
    for entity in declared:
        other = "topic" if isinstance(entity, QueueEntity) else "queue"
        name = entity.name.lower()
        # the view was read whole at start: no store call per entity of the file
        if (catalog.topic(name) if other == "topic" else catalog.queue(name)) is not None:
            raise ConfigError(
                f"entities file: {entity.kind} '{entity.name}' is a {other} in the store: an "
                f"entity's kind is fixed when it is created (delete the {other} first to "
                f"make it a {entity.kind})"
            )
    for queue in entities.queues:
        current = catalog.queue(queue.name)
        if current is not None and current.requires_session != queue.requires_session:
            await _check_session_flip(catalog, f"queue '{queue.name}'", current.spec, queue)
    for sub in entities.subscriptions:
        current_sub = catalog.subscription(sub.topic, sub.name)
        topic = catalog.topic(sub.topic)
        if (
            current_sub is not None
            and topic is not None
            and current_sub.requires_session != sub.requires_session
        ):
            await _check_session_flip(
                catalog, f"subscription '{sub.path}'", current_sub.spec(topic), sub
            )


async def _check_session_flip(
    catalog: Catalog, label: str, spec, wanted: QueueEntity | SubscriptionEntity
) -> None:
    counts = await catalog.store.counts(spec)
    held = counts.active + counts.locked + counts.scheduled + counts.deferred + counts.dead_letter
    if held:
        now = "on" if wanted.requires_session else "off"
        raise ConfigError(
            f"entities file: {label}: RequiresSession cannot be turned {now} while it holds "
            f"{held} messages (they would stay where no receiver could take them); receive "
            "or purge them, or keep the stored RequiresSession"
        )


async def _put_keeping_keys(
    catalog: Catalog, entity: QueueEntity | TopicEntity, current: QueueEntity | TopicEntity | None
) -> None:
    """Seed a queue or topic, its shared access rules keeping the stored keys. Where this
    process has not seen the entity, another one starting at the same time may be making it
    with keys of its own: only a create (which fails when the entity exists) may write new
    keys; otherwise the keys are those stored."""
    if current is None and entity.extra.get("AuthorizationRules"):
        try:
            await catalog.create(_kept_keys(entity, None), check=False)
            return
        except BusdError as exc:
            if exc.condition != Condition.ENTITY_ALREADY_EXISTS:
                raise
        stored = await catalog.stored(entity.kind, entity.name)
        assert stored is None or isinstance(stored, (QueueEntity, TopicEntity))
        current = stored
    await catalog.put(_kept_keys(entity, current))


def _kept_keys(entity, stored):
    rules = entity.extra.get("AuthorizationRules")
    if not rules:
        return entity
    before = None if stored is None else stored.extra.get("AuthorizationRules")
    return replace(
        entity, extra={**entity.extra, "AuthorizationRules": access_rules.kept(rules, before)}
    )
