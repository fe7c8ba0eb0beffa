"""Sending to a topic: which copies each subscription gets, then one store call per batch
(docs/design.md §2.13).

The subscriptions' rules are compiled once per change of the catalog (busd.rules.RuleSet) and
evaluated here, in the process that received the message; the store's fan-out script
(`Store.publish`) then stores every copy atomically. When every subscription of a topic takes
every message unchanged (TrueFilter rules only, the common case), the store is told so and no
message is looked at: the sent bytes go straight to the store, as for a queue.
"""

from __future__ import annotations

import logging

from busd.broker.catalog import Catalog
from busd.entities.records import Entity, RuleEntity, SubscriptionEntity, TopicEntity
from busd.errors import BusdError, Condition
from busd.rules import FilterEvaluationError, MessageView, RuleError, RuleSet, rule_from_record
from busd.storage.api import Store
from busd.storage.messages import NewMessage, Placement
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import StagedPublish

log = logging.getLogger("busd.broker")

# The dead-letter reason of a copy whose rule failed on it (docs/rules.md §4.2).
FILTER_ERROR_REASON = "FilterEvaluationException"


def topic_spec(topic: TopicEntity) -> TopicSpec:
    return topic.spec


class _Route:
    """What one topic's sends need, built once per catalog change."""

    __slots__ = ("topic", "subscriptions", "specs", "rules", "match_all")

    def __init__(
        self, topic: TopicEntity, subscriptions: list[SubscriptionEntity], rules: list[RuleSet]
    ) -> None:
        self.topic = topic_spec(topic)
        self.subscriptions = subscriptions
        self.specs: list[QueueSpec] = [s.spec(topic) for s in subscriptions]
        self.rules = rules
        self.match_all = all(r.is_match_all for r in rules)


class Fanout:
    def __init__(self, catalog: Catalog, store: Store) -> None:
        self.catalog = catalog
        self.store = store
        self._routes: dict[str, _Route] = {}  # topic -> its route
        catalog.listen(self._changed)

    def _changed(self, old: Entity | None, new: Entity | None) -> None:
        for entity in (old, new):
            if isinstance(entity, (TopicEntity, SubscriptionEntity, RuleEntity)):
                topic = entity.name if isinstance(entity, TopicEntity) else entity.topic
                self._routes.pop(topic, None)

    def route(self, topic: str) -> _Route:
        found = self._routes.get(topic)
        if found is None:
            entity = self.catalog.topic(topic)
            if entity is None:
                raise BusdError(
                    Condition.NOT_FOUND, f"The messaging entity '{topic}' could not be found."
                )
            subs = self.catalog.subscriptions(topic)
            found = self._routes[topic] = _Route(entity, subs, [self._compile(s) for s in subs])
        return found

    def _compile(self, sub: SubscriptionEntity) -> RuleSet:
        rules = []
        for entity in self.catalog.rules(sub.topic, sub.name):
            try:
                rules.append(rule_from_record(entity.name, entity.rule, entity.created_ms))
            except RuleError as exc:  # written by another version, or damaged: skip it
                log.error("rule %s cannot be read and is ignored: %s", entity.path, exc)
        return RuleSet.compile(rules)

    async def publish(self, topic: TopicSpec, messages: list[NewMessage]) -> list[int]:
        """Store messages sent to a topic in its subscriptions; the topic's number for each
        (0: a duplicate dropped)."""
        route = self.route(topic.name)
        placements = None if route.match_all else [self.placements(route, m) for m in messages]
        return await self.store.publish(route.topic, route.specs, messages, placements)

    def staged(
        self, topic: TopicSpec, message: NewMessage, seq: int | None = None
    ) -> StagedPublish:
        """A message sent to a topic in a transaction, with its copies decided now, as
        `publish` decides them: the rules are evaluated when the send arrives, and a rule
        changed before the commit does not change them (docs/design.md §3.15)."""
        route = self.route(topic.name)
        placements = (
            [Placement(i) for i in range(len(route.specs))]
            if route.match_all
            else self.placements(route, message)
        )
        return StagedPublish(
            route.topic, message, [s.subscription or "" for s in route.specs], placements, seq
        )

    async def cancel_scheduled(self, topic: TopicSpec, seqs: list[int]) -> None:
        route = self.route(topic.name)
        await self.store.cancel_topic_scheduled(route.topic, route.specs, seqs)

    def placements(self, route: _Route, message: NewMessage) -> list[Placement]:
        """The copies of one message, per the subscriptions' rules (also for a message
        forwarded to the topic, busd.broker.forwarding)."""
        out: list[Placement] = []
        view: MessageView | None = None
        for i, rules in enumerate(route.rules):
            if rules.is_match_all:
                out.append(Placement(i))
                continue
            if rules.is_match_none:
                continue
            if view is None:
                view = MessageView(message.blob, size=len(message.blob))
            try:
                for copy in rules.copies(view):
                    if copy.is_plain:
                        out.append(Placement(i))
                        continue
                    placement = Placement(i, blob=copy.apply(message.blob))
                    overrides = copy.overrides
                    if "session_id" in overrides:
                        placement.own_session_id = True
                        placement.session_id = overrides["session_id"]
                    if "ttl_ms" in overrides:
                        placement.own_ttl = True
                        ttls = [
                            t
                            for t in (overrides["ttl_ms"], route.topic.default_ttl_ms)
                            if t is not None
                        ]
                        placement.ttl_ms = min(ttls) if ttls else None
                    out.append(placement)
            except FilterEvaluationError as exc:
                if route.subscriptions[i].dead_letter_on_filter_exceptions:
                    out.append(Placement(i, dead_letter=(FILTER_ERROR_REASON, str(exc))))
                else:
                    log.debug("%s: no copy: %s", route.specs[i].name, exc)
        return out
