"""A client's sender link to a queue: transfers in, one store call per burst, one settled
outcome per delivery (docs/wire.md §5).

Transfers that arrive together (one socket read, or while the previous store call runs) are
stored with one `Store.send` call; each delivery is then answered `accepted`, or `rejected`
with a full error triple (docs/wire.md §5.4, §9.4). `released`/`modified` are never sent to a
sender.
"""

from __future__ import annotations

import asyncio
import logging

from proton import Delivery, symbol

from busd.amqp import engine
from busd.broker import messages
from busd.broker.links import staging
from busd.broker.links.base import (
    CREDIT_WINDOW,
    ConnectionScope,
    LinkEndpoint,
    amqp_condition,
    echo_termini,
)
from busd.errors import BusdError, Condition, store_unavailable
from busd.storage.messages import NewMessage
from busd.storage.specs import QueueSpec, TopicSpec

log = logging.getLogger("busd.broker")

# Most transfers one store call takes: a client that ignores credit (docs/wire.md §5.1) and
# floods the link still meets a store that answers each call in milliseconds.
MAX_STORE_BATCH = 256


class QueueSenderEndpoint(LinkEndpoint):
    raw_deliveries = True

    def __init__(self, conn: ConnectionScope, link, queue: QueueSpec | TopicSpec) -> None:
        super().__init__(conn, link)
        self.queue = queue
        self.max_size = queue.max_message_size
        self._pending: list = []  # (raw delivery, payload, size) waiting for the store
        self._busy = False
        self._store_task: asyncio.Task | None = None
        self._unanswered = 0  # transfers held until the store answers (pending or in a call)
        self._raw_link = link._impl
        # raw delivery -> [size so far, bytes held, chunks...] of a transfer spanning frames
        self._partial: dict = {}
        self.ceiling = self.broker.limits.link_ceiling(queue.max_message_size)

    def on_attach(self) -> None:
        self.link.max_message_size = self.queue.max_message_size
        self.link.properties = {
            symbol("com.microsoft:max-message-batch-size"): self.queue.max_message_size
        }
        echo_termini(self.link)
        # Receiver-settles-first: we settle each transfer ourselves (docs/wire.md §4.1).
        self.link.rcv_settle_mode = 0
        self.link.open()
        self.link.flow(CREDIT_WINDOW)

    def on_raw_delivery(self, delivery) -> None:
        """A transfer frame arrived (engine.py: raw, this is the per-message path)."""
        if not engine.readable(delivery):
            return
        link = self._raw_link
        data = engine.recv(link, engine.pending(delivery))
        chunks = self._partial.get(delivery)
        if engine.partial(delivery):
            if chunks is None:
                chunks = self._partial[delivery] = [0, 0]
            chunks[0] += len(data)
            # Past the link's ceiling keep counting but stop holding: the answer is a refusal
            # (message-size-exceeded) anyway.
            if chunks[0] <= self.ceiling:
                if not self.conn.buffers.take(len(data)):
                    self._over_budget()
                    return
                chunks[1] += len(data)
                chunks.append(data)
            return
        if chunks is not None:
            del self._partial[delivery]
            self.conn.buffers.give(chunks[1])
            size = chunks[0] + len(data)
            chunks.append(data)
            data = b"".join(chunks[2:])
        else:
            size = len(data)
        if engine.aborted(delivery):
            engine.settle(delivery)
            engine.link_advance(link)
            return
        engine.link_advance(link)
        if engine.remote_state(delivery) == staging.TRANSACTIONAL_STATE:
            staging.stage_transfer(self, delivery, data, size)  # answered once staged
            self._top_up()
            return
        engine.hold(delivery)  # answered after the store call
        self._unanswered += 1
        self._pending.append((delivery, data, size))
        self._top_up()
        if not self._busy:
            self._busy = True
            self._store_task = self.spawn(self._store_pending())

    def _over_budget(self) -> None:
        """The connection's or the process's unfinished transfers would pass their limit:
        this link goes, and what it held with it."""
        log.warning(
            "connection %s: unfinished transfers past the buffer limit; detaching %s",
            self.conn.proto.peer,
            self.queue.name,
        )
        if not self.detached:
            self.conn.detach(
                self,
                amqp_condition(
                    BusdError(
                        Condition.RESOURCE_LIMIT,
                        "Too many bytes of unfinished transfers are buffered; send fewer at once.",
                    )
                ),
            )

    def on_detach(self) -> None:
        super().on_detach()
        self.drop_unfinished(self._partial)

    async def finish(self) -> None:
        """Transfers received before the detach are stored (and answered) first."""
        if self._store_task is not None:
            await asyncio.gather(self._store_task, return_exceptions=True)

    def _top_up(self) -> None:
        """Keep credit plus unanswered transfers at the window: a client that honours credit
        never has more than CREDIT_WINDOW transfers waiting for the store."""
        outstanding = engine.link_credit(self._raw_link) + self._unanswered
        if outstanding < CREDIT_WINDOW // 2 and not self.detached:
            engine.link_flow(self._raw_link, CREDIT_WINDOW - outstanding)

    async def _store_pending(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:MAX_STORE_BATCH]
                del self._pending[:MAX_STORE_BATCH]
                try:
                    await self._store(batch)
                finally:
                    self._unanswered -= len(batch)
                self._top_up()
                self.kick()  # the answers and the new credit in one write
        finally:
            self._busy = False

    async def _store(self, batch: list) -> None:
        accepted: list = []
        new: list[NewMessage] = []
        for delivery, payload, size in batch:
            try:
                new.extend(self._decode(payload, size))
                accepted.append(delivery)
            except BusdError as refused:
                _reject(delivery, refused)
        if new:
            try:
                if self.broker.faults.active:  # faults on demand (docs/faults.md)
                    await self.broker.faults.check("send", self.queue.name)
                await self.broker.send(self.queue, new)
            except BusdError as error:  # refused, every transfer of the call
                for delivery in accepted:
                    _reject(delivery, error)
                accepted = []
            except Exception as exc:
                log.error("storing %d messages in %s failed: %s", len(new), self.queue.name, exc)
                unavailable = store_unavailable()
                for delivery in accepted:
                    _reject(delivery, unavailable)
                accepted = []
            else:
                if self.broker.metrics is not None:
                    self.broker.metrics.messages_sent(self.queue.name, len(new))
        for delivery in accepted:
            engine.settle(delivery, engine.ACCEPTED)
        for delivery, _, _ in batch:
            engine.release(delivery)

    def _decode(self, payload: bytes, size: int) -> list[NewMessage]:
        messages.check_size(self.queue, size)  # the whole transfer, batch envelope included
        return [messages.admit(self.queue, m) for m in messages.parse(payload)]


def _reject(raw_delivery, error: BusdError) -> None:
    log.debug("send rejected: %s", error)
    delivery = engine.wrap(raw_delivery)
    delivery.local.condition = amqp_condition(error)
    delivery.update(Delivery.REJECTED)
    delivery.settle()
