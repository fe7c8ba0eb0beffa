"""Server scope: the entity catalog, the store, wake-ups of waiting receivers, and the sweep.

One `Broker` per process. It holds no state of record: the store does. What it holds is
local bookkeeping (the receivers of this process that may be woken, by id, and the sessions
they hold: busd.broker.receivers), rebuilt by simply reconnecting after a crash.

Wake-ups are targeted in the store (busd.storage.api.Store.subscribe): a message that becomes
available wakes the one receiver that can take it, on whichever process it lives, by its id.
So the work per message does not grow with the number of idle receivers; there is no poll of
them either: the store's sweep makes good a wake-up that was lost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
import weakref

from busd.amqp.addresses import Address, AddressError, parse_address
from busd.broker.attached import AttachedLink
from busd.broker.catalog import Catalog
from busd.broker.fanout import Fanout, topic_spec
from busd.broker.faults import Faults
from busd.broker.forwarding import Forwarding
from busd.broker.limits import Buffers
from busd.broker.receivers import Receivers, hand_over
from busd.broker.settings import BrokerSettings
from busd.entities.records import Entity, QueueEntity, SubscriptionEntity, TopicEntity
from busd.errors import BusdError, Condition
from busd.storage.api import Store
from busd.storage.messages import NewMessage
from busd.storage.specs import QueueSpec, TopicSpec

log = logging.getLogger("busd.broker")

TRANSACTION_SWEEP_EVERY = 10  # sweep rounds


class Broker:
    """Server scope. The entities are the catalog's (`catalog`), shared through the store."""

    def __init__(
        self,
        store: Store,
        *,
        sas_keys: dict[str, str],
        settings: BrokerSettings | None = None,
        metrics=None,
    ) -> None:
        self.store = store
        self.catalog = Catalog(store)
        self.catalog.listen(self._entity_changed)
        self.fanout = Fanout(self.catalog, store)
        # this process's receivers: what the store's wake-ups reach, and the sessions they hold
        self.receivers = Receivers()
        self.forwarding = Forwarding(
            self.catalog,
            store,
            self.fanout,
            new_id=self.new_waiter_id,
            wakeable=self.receivers.listen,
            forget=self.receivers.forget,
        )
        # entity path -> the links attached to it (detached when the entity is deleted)
        self._attached: dict[str, weakref.WeakSet[AttachedLink]] = {}
        self.sas_keys = sas_keys
        self.settings = settings or BrokerSettings()
        self.metrics = metrics
        self.limits = self.settings.limits.effective(0)
        # bytes of unfinished transfers held by every connection of this process
        self.buffers = Buffers(self.limits.process_buffer)
        self.authenticated_connections = 0  # those with a valid put-token (--max-connections)
        self.container_id = f"busd-{uuid.uuid4().hex[:12]}"
        self._ids = itertools.count(1)
        # faults on demand set on this namespace (docs/faults.md), when on (`--faults`): the
        # hot path checks `faults.active` only
        self.faults = Faults(store, self, metrics, enabled=self.settings.faults)
        self._tasks: list[asyncio.Task] = []

    def queue(self, name: str) -> QueueSpec | None:
        """The store handle of a queue."""
        queue = self.catalog.queue(name)
        return None if queue is None else queue.spec

    def spec(self, path: str) -> QueueSpec | None:
        """The store handle of a queue or a subscription (`<topic>/subscriptions/<name>`)."""
        return self.catalog.spec(path)

    def receivable(self, name: str) -> QueueSpec | None:
        """The queue or subscription a name or address names (`q`,
        `t/Subscriptions/s`, any case), None when there is none."""
        try:
            address = parse_address(name)
        except AddressError:
            return None
        if address.sub is not None and address.sub != "deadletter":
            return None
        if address.is_subscription:
            return self.spec(f"{address.entity}/subscriptions/{address.subscription}")
        return self.queue(address.entity)

    def topic(self, name: str) -> TopicSpec | None:
        topic = self.catalog.topic(name)
        return None if topic is None else topic_spec(topic)

    async def send(self, target: QueueSpec | TopicSpec, messages: list[NewMessage]) -> list[int]:
        """Store messages sent to a queue, or to a topic (fanned out to its subscriptions):
        every way in (sender links, schedule-message, tools) comes here. The sequence number
        of each, 0 for a duplicate dropped."""
        if isinstance(target, TopicSpec):
            return await self.fanout.publish(target, messages)
        made = self.receivers.offers(target, messages)
        if not made:
            return await self.store.send(target, messages)
        try:
            sent = await self.store.send_handing_over(target, messages, [o for _, o, _ in made])
        except BaseException as failure:
            hand_over(made, None, failure)
            raise
        hand_over(made, sent)
        return sent.seqs

    async def cancel_scheduled(self, target: QueueSpec | TopicSpec, seqs: list[int]) -> None:
        if isinstance(target, TopicSpec):
            await self.fanout.cancel_scheduled(target, seqs)
        else:
            await self.store.cancel_scheduled(target, seqs)

    @property
    def entities(self) -> dict[str, QueueSpec]:
        """Every queue-like entity (queues and subscriptions) by path: what tools and metrics
        list."""
        return {spec.name: spec for spec in self.catalog.specs()}

    def has_entity(self, address: Address) -> bool:
        """Whether the entity `address` names exists: what a put-token for it is answered
        (404 when not, busd.broker.links.cbs). Every kind of entity served must answer here."""
        if address.sub == "cbs" or not address.entity:
            return False
        if address.subscription is not None:
            return self.catalog.subscription(address.entity, address.subscription) is not None
        return (
            self.catalog.queue(address.entity) is not None
            or self.catalog.topic(address.entity) is not None
        )

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.connect()
        await self.store.subscribe(self.receivers.wake)
        await self.catalog.start()
        await self.faults.start()
        self.forwarding.start()
        self._tasks.append(asyncio.create_task(self._sweep_loop(), name="busd-sweep"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.forwarding.stop()
        await self.catalog.stop()
        await self.store.close()

    # --- entities going away ------------------------------------------------------------------
    def track(self, path: str, endpoint: AttachedLink) -> None:
        """An endpoint attached to an entity (a queue, topic or subscription path; its
        dead-letter sub-queue and `$management` count as the entity): it is detached with
        `amqp:not-found` when the entity is deleted, by any process."""
        self._attached.setdefault(path, weakref.WeakSet()).add(endpoint)

    def attached(self, path: str) -> list[AttachedLink]:
        """The links of this process attached to an entity (as `track` has them)."""
        return list(self._attached.get(path, ()))

    def _refresh_limits(self) -> None:
        """Buffers follow the largest message an entity accepts (busd.broker.limits)."""
        sizes = [q.max_message_size for q in self.catalog.queues()]
        sizes += [t.max_message_size for t in self.catalog.topics()]
        largest = max(sizes, default=0)
        self.limits = self.settings.limits.effective(largest)
        self.buffers.limit = self.limits.process_buffer

    def _entity_changed(self, old: Entity | None, new: Entity | None) -> None:
        if isinstance(old, (QueueEntity, TopicEntity)) or isinstance(
            new, (QueueEntity, TopicEntity)
        ):
            self._refresh_limits()
        if new is not None or not isinstance(old, (QueueEntity, TopicEntity, SubscriptionEntity)):
            return
        paths = [old.path]
        if isinstance(old, TopicEntity):  # its subscriptions went with it
            prefix = f"{old.path}/subscriptions/"
            paths += [p for p in self._attached if p.startswith(prefix)]
        for path in paths:
            self.entity_gone(path)

    def entity_gone(self, path: str) -> None:
        """Detach every link of this process attached to a deleted entity."""
        endpoints = self._attached.pop(path, None)
        if not endpoints:
            return
        error = BusdError(Condition.NOT_FOUND, f"The messaging entity '{path}' was deleted.")
        for endpoint in list(endpoints):
            if endpoint.detached:
                continue
            try:
                endpoint.detach_with(error)
            except Exception:
                log.exception("detaching a link of deleted entity %s failed", path)

    # --- wake-ups ---------------------------------------------------------------------------
    def new_waiter_id(self) -> str:
        """An id for a receiver of this process, as the store knows it (lock holder, waiter):
        its process part routes the store's wake-ups here."""
        return f"{self.store.process_id}:{next(self._ids)}"

    # --- sweep ------------------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        for rounds in itertools.count():
            await asyncio.sleep(self.settings.sweep_interval_s)
            await self.faults.sweep()
            # Staged transactions past their time are only garbage (a commit refuses them):
            # they are dropped every tenth round.
            transactions = rounds % TRANSACTION_SWEEP_EVERY == 0
            for listed in self.catalog.specs():
                # An entity deleted while the round was under way is not swept: its sweep would
                # write its keys again after the delete dropped them.
                spec = self.catalog.spec(listed.name)
                if spec is None:
                    continue
                started = time.monotonic()
                try:
                    result = await self.store.sweep(spec)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # store unreachable: keep serving, try again later
                    log.warning("sweep of %s failed: %s", spec.name, exc)
                    continue
                if self.metrics is not None:
                    self.metrics.on_sweep(spec.name, result, time.monotonic() - started)
                self.receivers.expired_in_store(spec.name, result.expired_session_locks)
                if not transactions:
                    continue
                try:  # what transactions past their time left staged (docs/design.md §3.15)
                    await self.store.sweep_transactions(spec)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("transaction sweep of %s failed: %s", spec.name, exc)
            if not transactions:
                continue
            for topic in self.catalog.topics():  # a topic can be a transaction's via entity
                try:
                    await self.store.sweep_transactions(topic_spec(topic))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("transaction sweep of %s failed: %s", topic.name, exc)
