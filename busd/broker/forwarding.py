"""Auto-forwarding: the forwarders of this process (docs/design.md §2.15, §3.16).

Every queue or subscription with `ForwardTo` has a forwarder in every busd process, and so has
the dead-letter sub-queue of one with `ForwardDeadLetteredMessagesTo`. A forwarder is a
receiver without a link: it takes the entity's messages (`Store.take_forwarding`, under the
entity's forwarding lease, so one forwarder at a time moves them, in order) and moves them to
the destination (`Store.forward`), where each is a new message. With nothing to take it waits
like a receiver: registered among the entity's waiters by the same store call, woken by the
script that makes a message available, on whichever process. An idle forwarder costs nothing.

The destination is looked up in the catalog for each batch, and for a topic its rules make the
copies (busd.broker.fanout), as for a message sent to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from busd.broker.catalog import Catalog
from busd.broker.fanout import Fanout
from busd.broker.messages import new_tokens
from busd.entities.records import QueueEntity, SubscriptionEntity
from busd.rules import MessageView
from busd.storage.api import Store
from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult
from busd.storage.messages import NewMessage, StoredMessage
from busd.storage.specs import QueueSpec

log = logging.getLogger("busd.broker")

# Service Bus follows at most 4 hops; a message that would need a fifth is dead-lettered.
HOP_LIMIT = 4
# Most messages one forwarder moves per store call.
BATCH = 128
# How long a forwarder's locks, and so its lease, last: what a forwarder of a process that died
# leaves behind for at most this long.
LOCK_MS = 10_000
# After a failed store call (the store away), the pause before the next try.
RETRY_S = 1.0


def forward_target(catalog: Catalog, entity: QueueSpec) -> str | None:
    """Where the messages of `entity` (a queue or subscription, or its dead-letter
    sub-queue) are forwarded to; None when they are not. A queue that names itself keeps
    its messages (docs/design.md §2.15): forwarding them there would only loop."""
    found: QueueEntity | SubscriptionEntity | None
    if entity.topic is None:
        found = catalog.queue(entity.name)
    else:
        found = catalog.subscription(entity.topic, entity.subscription or "")
    if found is None:
        return None
    target = found.forward_dead_lettered_to if entity.dlq else found.forward_to
    if target is not None and target.lower() == found.path:
        return None
    return target


class Forwarding:
    """Owns the forwarders of this process, one per forwarding entity of the catalog."""

    def __init__(
        self,
        catalog: Catalog,
        store: Store,
        fanout: Fanout,
        *,
        new_id: Callable[[], str],
        wakeable: Callable[[str, Callable[[], None]], None],
        forget: Callable[[str], None],
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.fanout = fanout
        self._new_id = new_id
        self._wakeable = wakeable
        self._forget = forget
        self._forwarders: dict[str, Forwarder] = {}  # entity path -> its forwarder
        self._running = False
        self._stopping: set[asyncio.Task[None]] = set()  # forwarders of entities that stopped
        self._sync_soon: asyncio.Handle | None = None
        catalog.listen(self._changed)

    def start(self) -> None:
        self._running = True
        self._sync()

    async def stop(self) -> None:
        self._running = False
        if self._sync_soon is not None:
            self._sync_soon.cancel()
            self._sync_soon = None
        forwarders, self._forwarders = list(self._forwarders.values()), {}
        await asyncio.gather(*(f.stop() for f in forwarders), return_exceptions=True)

    def _changed(self, old: object, new: object) -> None:
        """One look at the whole catalog for every burst of changes (a reload announces each
        entity): O(entities) per burst, not per change."""
        if self._running and self._sync_soon is None:
            self._sync_soon = asyncio.get_running_loop().call_soon(self._sync)

    def _sync(self) -> None:
        """Start a forwarder for each entity that forwards, stop those of entities that no
        longer do (the catalog changed: entities change rarely, this is O(entities))."""
        self._sync_soon = None
        if not self._running:
            return
        wanted: dict[str, tuple[QueueSpec, str]] = {}
        for spec in self.catalog.specs():
            for entity in (spec, spec.dead_letter_queue):
                target = forward_target(self.catalog, entity)
                if target is not None:
                    wanted[entity.path] = (entity, target)
        for path in list(self._forwarders):
            if path not in wanted:
                task = asyncio.get_running_loop().create_task(self._forwarders.pop(path).stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        for path, (entity, target) in wanted.items():
            found = self._forwarders.get(path)
            if found is None:
                found = self._forwarders[path] = Forwarder(self, entity, target)
                found.start()
            else:
                found.entity, found.target = entity, target

    def destination(self, target: str) -> ForwardDestination:
        """The store's view of a destination by name (neither queue nor topic when it does
        not exist)."""
        queue = self.catalog.queue(target)
        if queue is not None:
            return ForwardDestination(f"queue:{queue.path}", queue=queue.spec)
        if self.catalog.topic(target) is not None:
            route = self.fanout.route(target)
            return ForwardDestination(
                f"topic:{route.topic.name}", topic=route.topic, subscriptions=route.specs
            )
        return ForwardDestination(f"gone:{target.lower()}")


class Forwarder:
    """Moves the messages of one entity, as they become available, to its destination."""

    def __init__(self, owner: Forwarding, entity: QueueSpec, target: str) -> None:
        self.owner = owner
        self.entity = entity
        self.target = target
        # a waiter id: the store's wake-ups for it come here
        self.id = owner._new_id()
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.owner._wakeable(self.id, self._woken.set)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"busd-forward:{self.entity.path}"
        )

    async def stop(self) -> None:
        self.owner._forget(self.id)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # (a dropped registration is cleaned up by the sweep anyway); the forwarder of a
        # queue or subscription also waits for its sessions (lua/forwardTake.lua)
        kinds = ["d"] if self.entity.dlq else ["q", "s"]
        try:
            for kind in kinds:
                await self.owner.store.stop_waiting(self.entity, kind, self.id)
        except Exception as exc:
            log.debug("forwarder of %s: leaving the waiters failed: %s", self.entity.path, exc)

    async def _run(self) -> None:
        store = self.owner.store
        while True:
            # cleared before the look: a wake-up that comes during it is not lost
            self._woken.clear()
            try:
                taken = await store.take_forwarding(
                    self._locked_spec(), self.id, BATCH, new_tokens(BATCH)
                )
                if taken:
                    await self._move(taken)
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: the locks we hold come back
                log.warning("forwarding from %s failed: %s", self.entity.path, exc)
                await asyncio.sleep(RETRY_S)
                continue
            # nothing to take, or another forwarder holds the entity: registered as a waiter
            await self._woken.wait()

    def _locked_spec(self) -> QueueSpec:
        """The entity as the forwarder takes from it: with the forwarder's own lock time."""
        return dataclasses.replace(self.entity, lock_duration_ms=LOCK_MS)

    async def _move(self, taken: list[StoredMessage]) -> None:
        owner = self.owner
        destination = owner.destination(self.target)
        route = None
        if destination.topic is not None:
            route = owner.fanout.route(destination.topic.name)
            if route.match_all:
                route = None
        moves = []
        for m in taken:
            view = MessageView(m.blob, size=len(m.blob))
            session_id = m.session_id
            if session_id is None:
                session_id = view.sys("SessionId")
            message_id = view.sys("MessageId")
            moved = ForwardedMessage(
                token=m.lock_token or b"",
                seq=m.seq,
                hops=m.hops,
                session_id=session_id,
                message_id=message_id,
                message=m,
            )
            if route is not None:
                moved.placements = owner.fanout.placements(
                    route, NewMessage(m.blob, session_id=session_id, message_id=message_id)
                )
            moves.append(moved)
        results = await owner.store.forward(
            self._locked_spec(), destination, moves, hop_limit=HOP_LIMIT
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "forwarded from %s to %s: %s",
                self.entity.path,
                self.target,
                [r.name for r in results],
            )
        if ForwardResult.LOCK_LOST in results:
            log.warning(
                "forwarding from %s: %d locks ended before the move; those messages move later",
                self.entity.path,
                results.count(ForwardResult.LOCK_LOST),
            )
