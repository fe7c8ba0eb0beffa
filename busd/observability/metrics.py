"""Prometheus metrics of one busd process.

Two kinds, kept apart:
- What this process does (connections, links, refused authentications, sweep durations, and
  its share of messages in and out): counters and gauges kept here, fed by the broker.
- What happened to each queue, for the whole deployment: message totals (sent, received,
  completed, abandoned, dead-lettered, expired, ...), lock expiries, and what each queue
  holds now (active, scheduled, deferred, dead-lettered messages; sessions). The store counts
  the totals inside each state transition, so they are exact whichever process, path
  ($management, admin API, sweep, lazy housekeeping) made it happen; they are read at scrape
  time, and every process reports the same figures: aggregate them with max(), not sum().

With several workers on one host (busd/server/workers.py), the worker a scrape lands on adds up the
process figures of every worker (`merge`) and adds the store's figures once: the scrape
answers for the host.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from busd import __version__
from busd.errors import Condition
from busd.storage.counts import EntityCounts
from busd.storage.messages import Outcome
from busd.storage.specs import QueueSpec

_OUTCOME_NAMES = {
    Outcome.COMPLETE: "completed",
    Outcome.ABANDON: "abandoned",
    Outcome.DEFER: "deferred",
    Outcome.DEAD_LETTER: "dead_lettered",
    Outcome.RELEASE: "released",
}

# Store event -> (metric name, help). Queue and dead-letter sub-queue alike, except those in
# _QUEUE_ONLY (a dead-letter sub-queue is never sent to, and its messages do not expire).
_TOTALS = {
    "sent": ("busd_messages_sent", "Messages accepted from senders."),
    "duplicates": ("busd_messages_duplicate", "Messages dropped by duplicate detection."),
    "received": ("busd_messages_received", "Messages delivered to receivers (any mode)."),
    "completed": ("busd_messages_completed", "Messages completed."),
    "abandoned": ("busd_messages_abandoned", "Messages abandoned."),
    "released": ("busd_messages_released", "Messages released without a counted attempt."),
    "deferred": ("busd_messages_deferred", "Messages deferred."),
    "deadlettered": (
        "busd_messages_dead_lettered",
        "Messages moved to the dead-letter sub-queue, for any reason.",
    ),
    "expired": ("busd_messages_expired", "Messages past their time to live."),
    "resubmitted": (
        "busd_messages_resubmitted",
        "Dead-lettered messages sent back to their queue.",
    ),
    "purged": ("busd_messages_purged", "Messages deleted by a purge."),
    "forwarded": (
        "busd_messages_forwarded",
        "Messages moved to the entity's forwarding destination (auto-forwarding).",
    ),
    "lockexpired": ("busd_lock_expiries", "Message locks that ran out."),
    "sessionlockexpired": ("busd_session_lock_expiries", "Session locks that ran out."),
    "sessionexpired": (
        "busd_sessions_expired",
        "Idle sessions removed, state included, by SessionIdleTimeToLive.",
    ),
}
_QUEUE_ONLY = {
    "sent",
    "duplicates",
    "expired",
    "resubmitted",
    "sessionlockexpired",
    "sessionexpired",
}
# Store calls one scrape runs at once.
SCRAPE_CONCURRENCY = 16
# Label values of the counters docs/operating.md's alert rules read: the caps an eviction
# was made at (busd.net.listener, busd.http.server), the deadlines a handshake missed
# (busd.net.listener, busd.broker.links.connection), why a pre-settled settlement was refused
# (busd.broker.links.receiving).
LIMITS = ("process", "address")
HANDSHAKE_STAGES = ("handshake", "token")
REFUSAL_REASONS = (Condition.MESSAGE_LOCK_LOST.label, Condition.SESSION_LOCK_LOST.label)


class StoreCollector:
    """Yields the figures `Metrics.render` last read from the store (read before each scrape,
    since the registry's collectors are synchronous)."""

    def __init__(self) -> None:
        # entity name -> (its counts, its DLQ's counts)
        self.snapshot: dict[str, tuple[EntityCounts, EntityCounts]] = {}
        # entity name -> store server (`host:port`, a Cluster's shard) -> its partitions there
        self.placement: dict[str, dict[str, int]] = {}

    def describe(self):
        return []  # nothing to check at registration: the figures come at scrape time

    def collect(self):
        totals = {
            event: CounterMetricFamily(name, doc, labels=["entity"])
            for event, (name, doc) in _TOTALS.items()
        }
        messages = GaugeMetricFamily(
            "busd_entity_messages",
            "Messages per entity and state: active (ActiveMessageCount: available plus locked), "
            "locked (of the active ones), scheduled, deferred, dead_letter.",
            labels=["entity", "state"],
        )
        sessions = GaugeMetricFamily(
            "busd_entity_sessions",
            "Sessions with messages or state, or held; locked (held) sessions; free sessions "
            "(available messages, no holder).",
            labels=["entity", "kind"],
        )
        oldest = GaugeMetricFamily(
            "busd_entity_oldest_message_age_seconds",
            "Age of the entity's lowest-numbered message (not scheduled for later); 0 empty.",
            labels=["entity"],
        )
        partitions = GaugeMetricFamily(
            "busd_entity_partitions",
            "Partitions of each entity per store server (a Cluster's shard primary): an even "
            "spread holds as many on each; 1 on its server for an entity without partitions.",
            labels=["entity", "shard"],
        )
        for name, where in sorted(self.placement.items()):
            for shard, count in sorted(where.items()):
                partitions.add_metric([name, shard], count)
        now_ms = time.time() * 1000
        for name, (counts, dlq) in sorted(self.snapshot.items()):
            dlq_name = f"{name}/$deadletterqueue"
            for event, family in totals.items():
                family.add_metric([name], counts.totals.get(event, 0))
                if event not in _QUEUE_ONLY:
                    family.add_metric([dlq_name], dlq.totals.get(event, 0))
            for state, value in (
                ("active", counts.active_message_count),
                ("locked", counts.locked),
                ("scheduled", counts.scheduled),
                ("deferred", counts.deferred),
                ("dead_letter", dlq.active + dlq.locked + dlq.deferred),
            ):
                messages.add_metric([name, state], value)
            sessions.add_metric([name, "with_messages"], counts.sessions)
            sessions.add_metric([name, "locked"], counts.locked_sessions)
            sessions.add_metric([name, "free"], counts.free_sessions)
            for entity, figures in ((name, counts), (dlq_name, dlq)):
                enqueued = figures.oldest_enqueued_ms
                oldest.add_metric(
                    [entity], max(0.0, (now_ms - enqueued) / 1000) if enqueued else 0.0
                )
        yield from totals.values()
        yield messages
        yield sessions
        yield oldest
        yield partitions


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.connections = Gauge(
            "busd_connections", "Open AMQP connections (this process).", registry=registry
        )
        self.connections_total = Counter(
            "busd_connections_opened",
            "AMQP connections accepted (this process).",
            registry=registry,
        )
        self.links = Gauge("busd_links", "Attached links (this process).", registry=registry)
        # Connections before their first valid put-token (busd.net.listener.Admission).
        self.unauthenticated = Gauge(
            "busd_unauthenticated_connections",
            "Connections not authenticated yet: in their TLS, WebSocket or AMQP handshake, or "
            "without a valid put-token (this process; capped apart from busd_connections).",
            registry=registry,
        )
        self.unauthenticated_evictions = Counter(
            "busd_unauthenticated_evicted",
            "Unauthenticated connections closed to make room for a newer one: as many were open "
            "in the process (limit=process) or from the new one's address (limit=address) as "
            "allowed; the oldest (of that address, or of the address holding the most) went.",
            ["limit"],
            registry=registry,
        )
        # HTTP connections past --max-http-connections[-per-address] (busd.http.server)
        self.http_evictions = Counter(
            "busd_http_evicted",
            "HTTP connections not inside an authenticated request closed to make room for a "
            "newer one: as many were open in the process (limit=process) or from the new "
            "one's address (limit=address) as allowed.",
            ["limit"],
            registry=registry,
        )
        self.http_busy = Counter(
            "busd_http_busy",
            "HTTP connections answered 503 at a cap: every open one was inside an "
            "authenticated request.",
            registry=registry,
        )
        self.handshake_timeouts = Counter(
            "busd_handshake_timeouts",
            "Connections closed at a deadline before authenticating: no AMQP open by the "
            "handshake deadline (stage=handshake), or no valid put-token by the auth time-out "
            "(stage=token).",
            ["stage"],
            registry=registry,
        )
        # Not a count of events but of objects: a connection whose memory is never given back
        # shows here as a figure above busd_connections (set_census gives the function).
        self.connection_objects = Gauge(
            "busd_connection_objects",
            "Connection objects of this process still in memory, open or not yet freed.",
            registry=registry,
        )
        # The same for what proton keeps inside open connections (set_census gives them too).
        self.session_objects = Gauge(
            "busd_session_objects",
            "AMQP sessions of this process's open connections that proton keeps: begun, or "
            "ended and not yet freed.",
            registry=registry,
        )
        self.link_objects = Gauge(
            "busd_link_objects",
            "Links of this process's open connections that proton keeps: attached, or "
            "detached and not yet freed.",
            registry=registry,
        )
        self.transfer_bytes = Gauge(
            "busd_unfinished_transfer_bytes",
            "Bytes of unfinished transfers this process holds (bounded by --process-buffer).",
            registry=registry,
        )
        self.auth_refusals = Counter(
            "busd_auth_refused", "CBS put-token requests refused (this process).", registry=registry
        )
        self.sent = Counter(
            "busd_process_messages_sent",
            "Messages this process stored from sender links.",
            ["entity"],
            registry=registry,
        )
        self.received = Counter(
            "busd_process_messages_received",
            "Messages this process delivered on receiver links.",
            ["entity"],
            registry=registry,
        )
        self.settled = Counter(
            "busd_process_settlements",
            "Settlements this process applied for receiver links, by outcome.",
            ["entity", "outcome"],
            registry=registry,
        )
        self.settlements_refused = Counter(
            "busd_settlements_refused",
            "Settlements a client sent already settled that the store refused (lock lost): "
            "the client cannot hear of it, so each is logged at warning.",
            ["entity", "reason"],
            registry=registry,
        )
        self.faults = Counter(
            "busd_faults_injected",
            "Faults on demand (docs/faults.md): set (operation=set) and each operation, link, "
            "connection or lock one of them hit.",
            ["entity", "kind", "operation"],
            registry=registry,
        )
        self.sweep_seconds = Histogram(
            "busd_sweep_seconds", "Duration of one entity's sweep.", registry=registry
        )
        # The store's figures are the deployment's, not this process's: a registry of their
        # own, so that the workers of one host add up only their process figures.
        self.store_figures = StoreCollector()
        self.store_registry = CollectorRegistry()
        self.store_registry.register(self.store_figures)
        # The version this process runs, in a registry of its own: added once to a scrape,
        # not summed over the workers of the host as their process figures are.
        self.build_registry = CollectorRegistry()
        Gauge(
            "busd_build_info",
            "The busd version this host runs (always 1), as `busd --version` shows it.",
            ["version"],
            registry=self.build_registry,
        ).labels(version=__version__).set(1)
        # Set on a worker of several (busd/observability/peers.py): the process figures of
        # every worker of the host, as Prometheus text.
        self.host_figures: Callable[[], Awaitable[list[str]]] | None = None
        # Every label value an alert rule of docs/operating.md selects is there at 0 from the
        # start: a rule over a series not yet made is "no data" rather than 0. Settlements
        # refused are per entity: each entity's series are made at the scrape that first
        # sees it (`_zero_refusals`).
        for limit in LIMITS:
            self.unauthenticated_evictions.labels(limit)
            self.http_evictions.labels(limit)
        for stage in HANDSHAKE_STAGES:
            self.handshake_timeouts.labels(stage)
        self._refusals_made: set[str] = set()

    def process_text(self) -> str:
        """This process's own figures, as Prometheus text."""
        return generate_latest(self.registry).decode()

    def set_census(self, count, endpoints=None) -> None:
        """`count()`: how many connection objects are alive; `endpoints()`: (sessions, links)
        proton keeps for the open ones. Both read at each scrape."""
        self.connection_objects.set_function(count)
        if endpoints is not None:
            self.session_objects.set_function(lambda: endpoints()[0])
            self.link_objects.set_function(lambda: endpoints()[1])

    def set_buffers(self, held) -> None:
        """`held()`: bytes of unfinished transfers held now, read at each scrape."""
        self.transfer_bytes.set_function(held)

    # --- events from the broker -------------------------------------------------------------
    def connection_opened(self) -> None:
        self.connections.inc()
        self.connections_total.inc()

    def connection_closed(self) -> None:
        self.connections.dec()

    def unauthenticated_evicted(self, limit: str) -> None:
        self.unauthenticated_evictions.labels(limit).inc()

    def http_evicted(self, limit: str) -> None:
        self.http_evictions.labels(limit).inc()

    def http_refused_busy(self) -> None:
        self.http_busy.inc()

    def handshake_timed_out(self, stage: str) -> None:
        self.handshake_timeouts.labels(stage).inc()

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

    def settled_batch(
        self, entity: str, outcomes: list[Outcome], refused: list[Condition | None]
    ) -> None:
        # one label lookup per outcome in the batch, not per message (a batch is mostly one)
        counts: dict[Outcome, int] = {}
        for outcome, refusal in zip(outcomes, refused):
            if refusal is None:
                counts[outcome] = counts.get(outcome, 0) + 1
        for outcome, n in counts.items():
            self.settled.labels(entity, _OUTCOME_NAMES[outcome]).inc(n)

    def settlement_refused(self, entity: str, reason: str) -> None:
        self.settlements_refused.labels(entity, reason).inc()

    def fault_hit(self, entity: str, kind: str, operation: str) -> None:
        self.faults.labels(entity, kind, operation).inc()

    def _zero_refusals(self, specs: Iterable[QueueSpec]) -> None:
        for spec in specs:
            if spec.name not in self._refusals_made:
                self._refusals_made.add(spec.name)
                for entity in (spec.path, spec.dead_letter_queue.path):
                    for reason in REFUSAL_REASONS:
                        self.settlements_refused.labels(entity, reason)

    def on_sweep(self, entity: str, result, seconds: float) -> None:
        # what the sweep expired is in the store's totals (with what receives expired lazily)
        self.sweep_seconds.observe(seconds)

    # --- scrape -----------------------------------------------------------------------------
    async def render(self, broker) -> bytes:
        specs = list(broker.entities.values())
        self._zero_refusals(specs)
        refs = [e for spec in specs for e in (spec, spec.dead_letter_queue)]
        figures: list[EntityCounts] = []
        for start in range(0, len(refs), SCRAPE_CONCURRENCY):  # bounded: one connection each
            chunk = refs[start : start + SCRAPE_CONCURRENCY]
            figures += await asyncio.gather(*(broker.store.counts(ref) for ref in chunk))
        places = await broker.store.shards(specs)  # one slot map for the whole scrape
        # No await from here on: concurrent scrapes cannot mix their snapshots.
        self.store_figures.placement = {
            spec.name: dict(collections.Counter(where)) for spec, where in zip(specs, places)
        }
        self.store_figures.snapshot = {
            spec.name: (figures[2 * i], figures[2 * i + 1]) for i, spec in enumerate(specs)
        }
        store = generate_latest(self.store_registry) + generate_latest(self.build_registry)
        if self.host_figures is None:
            return generate_latest(self.registry) + store
        return merge(await self.host_figures()) + store


def merge(texts: Iterable[str]) -> bytes:
    """Prometheus texts of several processes as one: every sample summed over the processes
    (each holds its share of the host's connections, links and messages), except the
    `_created` time stamps, of which the earliest is kept."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, _, values = families.setdefault(family.name, (family.type, family.documentation, {}))
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    values[key] = sample.value
                elif sample.name.endswith("_created"):
                    values[key] = min(values[key], sample.value)
                else:
                    values[key] += sample.value
    lines = []
    for name, (kind, documentation, values) in families.items():
        lines.append(f"# HELP {name} {_escape(documentation, help_text=True)}")
        lines.append(f"# TYPE {name} {kind}")
        for (sample_name, labels), value in values.items():
            shown = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(
                f"{sample_name}{{{shown}}} {floatToGoString(value)}"
                if shown
                else f"{sample_name} {floatToGoString(value)}"
            )
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _escape(text: str, help_text: bool = False) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text if help_text else text.replace('"', '\\"')
