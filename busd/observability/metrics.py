"""Prometheus metrics of one busd process.

Counters of what this process did (connections, messages in and out, settlements) are kept
here; what the store knows for the whole deployment (per-entity counts, sessions) is read from
the store at scrape time, so every process reports the same, exact figures.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from busd.errors import StoreStatus
from busd.storage.api import Outcome

_OUTCOME_NAMES = {
    Outcome.COMPLETE: "completed",
    Outcome.ABANDON: "abandoned",
    Outcome.DEFER: "deferred",
    Outcome.DEAD_LETTER: "dead_lettered",
    Outcome.RELEASE: "released",
}


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.connections = Gauge("busd_connections", "Open AMQP connections.", registry=registry)
        self.connections_total = Counter(
            "busd_connections_opened", "AMQP connections accepted.", registry=registry)
        self.links = Gauge("busd_links", "Attached links.", registry=registry)
        self.auth_refusals = Counter(
            "busd_auth_refused", "CBS put-token requests refused.", registry=registry)
        self.sent = Counter("busd_messages_sent", "Messages stored from senders.", ["entity"],
                            registry=registry)
        self.received = Counter("busd_messages_received", "Messages delivered to receivers.",
                                ["entity"], registry=registry)
        self.settled = Counter("busd_messages_settled", "Settlements applied, by outcome.",
                               ["entity", "outcome"], registry=registry)
        self.expired_locks = Counter("busd_lock_expiries", "Message locks that expired (sweep).",
                                     ["entity"], registry=registry)
        self.expired_session_locks = Counter(
            "busd_session_lock_expiries", "Session locks that expired (sweep).", ["entity"],
            registry=registry)
        self.expired = Counter("busd_messages_expired", "Messages expired by TTL (sweep).",
                               ["entity"], registry=registry)
        self.sweep_seconds = Histogram("busd_sweep_seconds", "Duration of one entity's sweep.",
                                       registry=registry)
        self.entity_messages = Gauge("busd_entity_messages", "Messages per entity and state.",
                                     ["entity", "state"], registry=registry)
        self.entity_sessions = Gauge("busd_entity_sessions",
                                     "Sessions with messages or state, and locked sessions.",
                                     ["entity", "kind"], registry=registry)
        self._sweep_started = 0.0

    # --- events from the broker -------------------------------------------------------------
    def connection_opened(self) -> None:
        self.connections.inc()
        self.connections_total.inc()

    def connection_closed(self) -> None:
        self.connections.dec()

    def link_attached(self) -> None:
        self.links.inc()

    def link_detached(self) -> None:
        self.links.dec()

    def auth_refused(self) -> None:
        self.auth_refusals.inc()

    def messages_sent(self, entity: str, count: int) -> None:
        self.sent.labels(entity).inc(count)

    def messages_received(self, entity: str, count: int) -> None:
        self.received.labels(entity).inc(count)

    def settled_batch(self, entity: str, outcomes: list[Outcome], statuses: list[int]) -> None:
        for outcome, status in zip(outcomes, statuses):
            if status == StoreStatus.OK:
                self.settled.labels(entity, _OUTCOME_NAMES[outcome]).inc()

    def on_sweep(self, entity: str, result, seconds: float) -> None:
        self.sweep_seconds.observe(seconds)
        if result.expired_message_locks:
            self.expired_locks.labels(entity).inc(result.expired_message_locks)
        if result.expired_session_locks:
            self.expired_session_locks.labels(entity).inc(len(result.expired_session_locks))
        if result.expired_messages:
            self.expired.labels(entity).inc(result.expired_messages)

    # --- scrape -----------------------------------------------------------------------------
    async def render(self, broker) -> bytes:
        from busd.storage.api import EntityRef

        for name, spec in broker.entities.items():
            counts = await broker.store.counts(EntityRef(spec))
            dlq = await broker.store.counts(EntityRef(spec, dlq=True))
            for state, value in (
                ("active", counts.active),
                ("locked", counts.locked),
                ("scheduled", counts.scheduled),
                ("deferred", counts.deferred),
                ("dead_letter", dlq.active + dlq.locked + dlq.deferred),
            ):
                self.entity_messages.labels(name, state).set(value)
            self.entity_sessions.labels(name, "with_messages").set(counts.sessions)
            self.entity_sessions.labels(name, "locked").set(counts.locked_sessions)
        return generate_latest(self.registry)

