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

from busd.amqp import codec, engine
from busd.broker.connection import amqp_condition, echo_termini
from busd.broker.nodes import CREDIT_WINDOW, LinkEndpoint
from busd.errors import BusdError, Condition
from busd.storage.api import NewMessage, QueueSpec

log = logging.getLogger("busd.broker")

MAX_SESSION_ID_LENGTH = 128


class QueueSenderEndpoint(LinkEndpoint):
    def __init__(self, conn, link, queue: QueueSpec) -> None:
        super().__init__(conn, link)
        self.queue = queue
        self.max_size = queue.max_message_size
        self._pending: list = []  # (raw delivery, payload, size) waiting for the store
        self._busy = False
        self._store_task: asyncio.Task | None = None

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
        self._raw_link = self.link._impl
        self._partial: dict = {}  # raw delivery -> chunks of a transfer spanning frames
        self.conn.proto.raw_links[self._raw_link] = self

    def on_raw_delivery(self, delivery) -> None:
        """A transfer frame arrived (engine.py: raw, this is the per-message path)."""
        if not engine.readable(delivery):
            return
        link = self._raw_link
        data = engine.recv(link, engine.pending(delivery))
        chunks = self._partial.get(delivery)
        if engine.partial(delivery):
            if chunks is None:
                chunks = self._partial[delivery] = [0]
            chunks[0] += len(data)
            # Past the limit keep counting but stop storing: the answer is a refusal anyway.
            if chunks[0] <= self.max_size + 64 * 1024:
                chunks.append(data)
            return
        if chunks is not None:
            del self._partial[delivery]
            size = chunks[0] + len(data)
            chunks.append(data)
            data = b"".join(chunks[1:])
        else:
            size = len(data)
        if engine.aborted(delivery):
            engine.settle(delivery)
            engine.link_advance(link)
            return
        engine.link_advance(link)
        credit = engine.link_credit(link)
        if credit < CREDIT_WINDOW // 2:
            engine.link_flow(link, CREDIT_WINDOW - credit)
        engine.hold(delivery)  # answered after the store call
        self._pending.append((delivery, data, size))
        if not self._busy:
            self._busy = True
            self._store_task = self.spawn(self._store_pending())

    def on_detach(self) -> None:
        super().on_detach()
        self.conn.proto.raw_links.pop(self._raw_link, None)

    async def finish(self) -> None:
        """Transfers received before the detach are stored (and answered) first."""
        if self._store_task is not None:
            await asyncio.gather(self._store_task, return_exceptions=True)

    async def _store_pending(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._store(batch)
        finally:
            self._busy = False

    async def _store(self, batch: list) -> None:
        accepted: list = []
        messages: list[NewMessage] = []
        for delivery, payload, size in batch:
            try:
                messages.extend(self._decode(payload, size))
                accepted.append(delivery)
            except BusdError as error:
                _reject(delivery, error)
        if messages:
            try:
                await self.broker.store.send(self.queue, messages)
            except Exception as exc:
                log.error("storing %d messages in %s failed: %s", len(messages), self.queue.name, exc)
                error = BusdError(Condition.SERVER_BUSY, "The store is unavailable; try again.")
                for delivery in accepted:
                    _reject(delivery, error)
                accepted = []
            else:
                if self.broker.metrics is not None:
                    self.broker.metrics.messages_sent(self.queue.name, len(messages))
        for delivery in accepted:
            engine.settle(delivery, engine.ACCEPTED)
        for delivery, _, _ in batch:
            engine.release(delivery)
        self.kick()

    def _decode(self, payload: bytes, size: int) -> list[NewMessage]:
        if size > self.queue.max_message_size:
            raise BusdError(
                Condition.MESSAGE_SIZE_EXCEEDED,
                f"The message of {size} bytes exceeds the limit of "
                f"{self.queue.max_message_size} bytes of '{self.queue.name}'.",
            )
        try:
            # One message, or each message of a batch envelope (format 0x80013700).
            return [self._new_message(m) for m in codec.parse_transfer(payload)]
        except codec.CodecError as exc:
            raise BusdError(Condition.DECODE_ERROR, f"Malformed message: {exc}") from None

    def _new_message(self, incoming) -> NewMessage:
        session_id = incoming.session_id
        if session_id is not None:
            if len(session_id) > MAX_SESSION_ID_LENGTH or "\0" in session_id:
                raise BusdError(
                    Condition.ARGUMENT_OUT_OF_RANGE,
                    f"The session id must be at most {MAX_SESSION_ID_LENGTH} characters "
                    "and contain no NUL character.",
                )
        if self.queue.requires_session:
            if not session_id:
                raise BusdError(
                    Condition.NOT_ALLOWED,
                    f"The SessionId was not set on a message, and it cannot be sent to "
                    f"'{self.queue.name}', which requires sessions.",
                )
        else:
            session_id = None  # a plain queue ignores group-id (it stays in the message)
        return NewMessage(
            blob=incoming.blob,
            session_id=session_id,
            message_id=incoming.message_id,
            ttl_ms=incoming.ttl_ms,
            scheduled_ms=incoming.scheduled_ms,
        )


def _reject(raw_delivery, error: BusdError) -> None:
    log.debug("send rejected: %s", error)
    delivery = engine.wrap(raw_delivery)
    delivery.local.condition = amqp_condition(error)
    delivery.update(Delivery.REJECTED)
    delivery.settle()
