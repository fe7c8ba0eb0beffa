"""A client's receiver link on a queue, its dead-letter queue, or one of its sessions.

Delivery follows AMQP credit (docs/wire.md §6.2): when the client grants credit, one store call
takes up to that many messages and they go out in one burst, through the link's outbox
(busd.broker.links.outbox). With fewer available than asked, the same store call registers the link
as a waiter, and the store wakes it (from any broker process) when a message becomes available
for it. Settlements that arrive together are applied
with one store call and each is answered with the settled outcome the SDK waits for
(docs/wire.md §7.2).

A link's store calls keep the client's order: one fetch and one settlement batch at a time,
and when the link goes, what it still had under way is finished before its last store call
(a session's release) and before the detach is answered.

A session receiver (busd.broker.links.sessions) is this same link once it holds a session's lock.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

from proton import Delivery, Link

from busd.amqp import engine
from busd.broker.forwarding import forward_target
from busd.broker.links import outcomes, staging
from busd.broker.links.base import (
    ConnectionScope,
    LinkEndpoint,
    amqp_condition,
    echo_termini,
    is_open,
)
from busd.broker.links.outbox import Outbox
from busd.broker.messages import delivery_payload, new_tokens
from busd.errors import BusdError, refusal, store_unavailable
from busd.storage.messages import Outcome, ReceiveMode, Settlement, StoredMessage
from busd.storage.specs import QueueSpec

log = logging.getLogger("busd.broker")
# A receive-and-delete delivery's tag (docs/wire.md §6.4): settled as it goes, so unique
# need not be; not 16 bytes, so no SDK reads a lock token in it.
SETTLED_TAG = b"\x00"


def lock_tag(token: bytes) -> bytes:
    """Delivery tag = the lock token GUID in .NET byte layout (docs/wire.md §6.4): the first three
    fields little-endian, i.e. `uuid.UUID(bytes=token).bytes_le`, without building a UUID."""
    return token[3::-1] + token[5:3:-1] + token[7:5:-1] + token[8:]


class QueueReceiverEndpoint(LinkEndpoint):
    """Link scope: a receiver on a queue or dead-letter queue (no session)."""

    raw_deliveries = True  # the client's dispositions, per message

    def __init__(self, conn: ConnectionScope, link: Link, entity: QueueSpec) -> None:
        super().__init__(conn, link)
        self.entity = entity
        self.queue = entity  # (a dead-letter queue is named and counted by its queue)
        self.mode = (
            ReceiveMode.RECEIVE_AND_DELETE
            if link.remote_snd_settle_mode == Link.SND_SETTLED
            else ReceiveMode.PEEK_LOCK
        )
        # identifies this link in the store: lock holder, waiter, target of wake-ups
        self.holder = self.broker.new_waiter_id()
        self.session_id: str | None = None
        self.outbox = Outbox(self)  # every message the link sends goes through it
        # The entity's messages are forwarded: its forwarder takes every one of them, and this
        # link (attached, e.g. to peek) gets none (docs/design.md §2.15).
        self._forwarded = forward_target(self.broker.catalog, entity) is not None
        self._settling = False
        self._settle_task: asyncio.Task | None = None
        self._settle_queue: list[tuple[Delivery, Settlement]] = []
        self._raw_link = link._impl
        # raw delivery (held, engine.py) -> lock token, for peek-lock deliveries not yet settled
        self._inflight: dict = {}
        self._opened = True  # False while a fault on demand may refuse the attach

    # --- delivery -------------------------------------------------------------------------
    def on_attach(self) -> None:
        self.broker.receivers.listen(self.holder, self.outbox.wake)
        if self.broker.faults.active:  # faults on demand (docs/faults.md): may refuse it
            self._opened = False
            self.spawn(self._open_unless_refused())
            return
        echo_termini(self.link)
        self.link.open()

    async def _open_unless_refused(self) -> None:
        error = await self.broker.faults.refusal("receive", self.queue.name)
        if self.detached:
            return
        if error is not None:
            self.conn.refuse(self, error)
            return
        echo_termini(self.link)
        self.link.open()
        self._opened = True
        self.kick()
        self.outbox.pump()

    @property
    def waiters(self) -> str:
        """Which waiters of the store this link joins when it runs dry."""
        return "d" if self.entity.dlq else "q"

    def on_flow(self) -> None:
        self.outbox.pump()

    @property
    def ready(self) -> bool:
        return self._opened

    @property
    def delivering(self) -> bool:
        return not self._forwarded

    async def take(self, count: int) -> list[StoredMessage]:
        if self.broker.faults.active:  # faults on demand (docs/faults.md)
            await self.broker.faults.check("deliver", self.queue.name, self.session_id)
        tokens = new_tokens(count) if self.mode == ReceiveMode.PEEK_LOCK else []
        try:
            return await self._receive(count, tokens)
        except BusdError:
            raise
        except Exception as exc:
            log.warning("receive on %s failed: %s", self.entity.path, exc)
            raise store_unavailable() from exc

    async def _receive(self, count: int, tokens: Sequence[bytes]) -> list[StoredMessage]:
        # Registers this link as a waiter when fewer are available (and wakes arrive at its
        # outbox, listening since the attach, so none can come before we listen).
        return await self.broker.store.receive(self.entity, count, self.mode, tokens, self.holder)

    def transmit(self, messages: list[StoredMessage]) -> None:
        for message in messages:
            self._send(message)
        if messages and self.broker.metrics is not None:
            self.broker.metrics.messages_received(self.queue.name, len(messages))
        self.kick()

    async def give_back(self, messages: list[StoredMessage]) -> None:
        """Release what was taken for the link and will not go out on it (count unchanged)."""
        if self.mode != ReceiveMode.PEEK_LOCK:
            return
        releases = [
            Settlement(
                token=m.lock_token or b"", outcome=Outcome.RELEASE, session_id=self.session_id
            )
            for m in messages
        ]
        await self.broker.store.settle(self.entity, releases, self.holder)

    def _send(self, message: StoredMessage) -> None:
        peek_lock = self.mode == ReceiveMode.PEEK_LOCK
        payload = delivery_payload(message, locked=peek_lock)
        # receive-and-delete: settled before it goes, so nothing refers to it; one byte, since
        # proton sends an empty tag as none at all, which the Java SDK cannot take
        # (docs/wire.md §6.4)
        tag = lock_tag(message.lock_token) if peek_lock else SETTLED_TAG  # type: ignore[arg-type]
        delivery = engine.send(self._raw_link, tag, payload)
        if peek_lock:
            engine.hold(delivery)
            self._inflight[delivery] = message.lock_token
        else:
            engine.settle(delivery)

    def locked_tokens(self) -> list[bytes]:
        """The lock tokens of the messages this link delivered and the client has not settled
        (plain message locks: a session receiver's messages are locked by the session)."""
        return [] if self.session_id is not None else list(self._inflight.values())

    # --- settlement -------------------------------------------------------------------------
    def on_raw_delivery(self, delivery) -> None:
        """The client's disposition of one of our deliveries (engine.py: raw, per message)."""
        token = self._inflight.get(delivery)
        if token is None:  # receive-and-delete, or already being settled
            return
        if not engine.updated(delivery) and not engine.remote_settled(delivery):
            return
        if engine.remote_state(delivery) == staging.TRANSACTIONAL_STATE:
            del self._inflight[delivery]
            staging.stage_disposition(self, delivery, token)  # applied at the commit
            return
        settlement = outcomes.of_disposition(delivery)
        if settlement is None:
            return
        del self._inflight[delivery]  # settle once
        settlement.token = token
        # The lock to check: the session's for a session receiver; a DLQ message keeps its
        # session id but is settled like any plain message.
        settlement.session_id = self.session_id
        self._settle_queue.append((delivery, settlement))
        if not self._settling:
            self._settling = True
            self._settle_task = self.spawn(self._settle_pending())

    async def _settle_batch(
        self, batch: list[tuple[Delivery, Settlement]]
    ) -> list[BusdError | None]:
        """One store call for the settlements that arrived together: each one's refusal,
        None where applied."""
        here = self.settlement_refusal()
        if here is None and self.broker.faults.active:  # faults on demand (docs/faults.md)
            here = await self.broker.faults.refusal("settle", self.queue.name, self.session_id)
        if here is not None:
            return [here] * len(batch)
        try:
            refused = await self.broker.store.settle(
                self.entity, [s for _, s in batch], self.holder
            )
        except Exception as exc:
            log.error("settlement on %s failed: %s", self.entity.path, exc)
            return [store_unavailable()] * len(batch)
        if self.broker.metrics is not None:
            self.broker.metrics.settled_batch(
                self.entity.path, [s.outcome for _, s in batch], refused
            )
        return [None if c is None else refusal(c) for c in refused]

    def settlement_refusal(self) -> BusdError | None:
        """Why settlements on this link are refused without asking the store (a session
        receiver whose lock ended here, busd.broker.links.sessions); None: the store decides."""
        return None

    async def _settle_pending(self) -> None:
        try:
            while self._settle_queue:
                batch, self._settle_queue = self._settle_queue, []
                results = await self._settle_batch(batch)
                for (delivery, settlement), error in zip(batch, results):
                    self.answer_settlement(delivery, settlement, error)
                self.kick()
                if any(s.outcome in (Outcome.ABANDON, Outcome.RELEASE) for _, s in batch):
                    self.outbox.wake()  # the same message may be next again (the store wakes
                    # no one for the holder's own abandon)
        finally:
            self._settling = False

    def answer_settlement(self, delivery, settlement: Settlement, error: BusdError | None) -> None:
        """Answer the client's settlement of a raw delivery (here, or staged in a
        transaction): echo the outcome as a settled disposition (docs/wire.md §7.2), or reject
        it with `error`; then let go of the delivery."""
        if engine.remote_settled(delivery):  # the client settled first: nothing to echo
            if error is not None:
                self._refused_silently(settlement, error)
            engine.settle(delivery)
        elif error is None:
            outcomes.echo(delivery, settlement.outcome)
        else:
            wrapped = engine.wrap(delivery)
            wrapped.local.condition = amqp_condition(error, triple=False)
            wrapped.update(Delivery.REJECTED)
            wrapped.settle()
        engine.release(delivery)

    def _refused_silently(self, settlement: Settlement, error: BusdError) -> None:
        """A settlement the client sent already settled was refused: it cannot be told, so the
        operator is (the message comes back when its lock ends)."""
        reason = error.condition.label
        log.warning(
            "settlement %s of lock token %s on %s refused: %s",
            settlement.outcome.value,
            uuid_text(settlement.token),
            self.entity.path,
            reason,
        )
        if self.broker.metrics is not None:
            self.broker.metrics.settlement_refused(self.entity.path, reason)

    # --- end of the link ----------------------------------------------------------------------
    def lost(self, error: BusdError) -> None:
        """Detach with an error (e.g. session lock lost)."""
        if self.detached or not is_open(self.link):
            return
        self.conn.detach(self, amqp_condition(error, triple=False))

    def on_detach(self) -> None:
        super().on_detach()
        self.broker.receivers.forget(self.holder)
        for delivery in self._inflight:
            engine.release(delivery)
        self._inflight.clear()

    async def finish(self) -> None:
        """In the client's order: the fetch under way (it returns what it took too late), the
        settlements received before the detach, then the link's last store call."""
        await self.outbox.idle()
        # (a done task is not awaited: gather would still cost an event-loop turn per link)
        if self._settle_task is not None and not self._settle_task.done():
            await asyncio.gather(self._settle_task, return_exceptions=True)
        await self._last_call()

    async def _last_call(self) -> None:
        """A plain receiver stops waiting (passing on a wake-up it may have been sent)."""
        try:
            await self.broker.store.stop_waiting(self.queue, self.waiters, self.holder)
        except Exception as exc:  # the store's sweep drops it later anyway
            log.debug("leaving the waiters of %s failed: %s", self.entity.path, exc)


def uuid_text(token: bytes | None) -> str:
    return str(uuid.UUID(bytes=token)) if token else "?"
