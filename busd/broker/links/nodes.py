"""The request/response plumbing of `$cbs` and `$management`.

A request/response node is a link pair in one AMQP session: the client's sender carries
requests to our `RequestEndpoint`; answers go back, pre-settled (the client never settles
them, docs/wire.md §3.4, §8.3), on our `ReplyEndpoint` whose address the request names in
`reply-to` (or, for `$cbs` which sets none, the session's `$cbs` reply link).
"""

from __future__ import annotations

import abc
import logging
import os

from proton import Delivery, Link

from busd.broker.links.base import (
    CREDIT_WINDOW,
    ConnectionScope,
    LinkEndpoint,
    amqp_condition,
)
from busd.errors import BusdError, Condition

log = logging.getLogger("busd.broker")


class ReplyEndpoint(LinkEndpoint):
    """Our sender for node responses: pre-settled, queued while the client gives no credit."""

    def __init__(self, conn: ConnectionScope, link: Link) -> None:
        super().__init__(conn, link)
        self.backlog: list[bytes] = []
        # Requests name this link by `reply-to`, which the SDK sets to the link's target
        # address; $cbs requests name none and are matched by the source address.
        self.addresses = {
            (link.remote_target.address or "").lower(),
            (link.remote_source.address or "").lower(),
        }
        for address in self.addresses:
            conn.links.add_reply(link.session, address, self)

    def send(self, payload: bytes) -> None:
        self.backlog.append(payload)
        self._flush()

    def on_flow(self) -> None:
        self._flush()

    def _flush(self) -> None:
        while self.backlog and self.link.credit > 0 and not self.detached:
            delivery = self.link.delivery(os.urandom(16))  # type: ignore[arg-type]  # binary tag
            self.link.send(self.backlog.pop(0))
            delivery.settle()
            self.link.advance()
        self.kick()

    def on_detach(self) -> None:
        super().on_detach()
        for address in self.addresses:
            self.conn.links.remove_reply(self.link.session, address, self)


class RequestEndpoint(LinkEndpoint, abc.ABC):
    """Our receiver for node requests. Each request is answered once, on the reply link, and
    accepted when its answer is ready, so that both go out in one write (docs/wire.md §8.1:
    a client thread that reads the disposition alone goes back to wait for the answer with its
    socket locked); requests are small, so proton's Python classes are fine here."""

    reply_key: str = ""

    def __init__(self, conn: ConnectionScope, link: Link, max_size: int | None = None) -> None:
        super().__init__(conn, link)
        # A larger request detaches the link (docs/design.md §3.12): `$cbs` (no max_size)
        # takes a token, `$management` up to its entity's largest message (set-session-state).
        self.max_size = conn.broker.limits.cbs_request if max_size is None else max_size
        # delivery (raw pointer) -> [size so far, bytes held, chunks...] of a request spanning
        # frames:
        # kept here, not on proton's delivery, so that it goes with the link
        self._partial: dict = {}

    def on_attach(self) -> None:
        super().on_attach()
        self.link.flow(CREDIT_WINDOW)

    def on_delivery(self, delivery: Delivery) -> None:
        if not delivery.readable:
            return
        chunks = self._partial.get(delivery._impl)
        if chunks is None:
            chunks = self._partial[delivery._impl] = [0, 0]  # size so far, bytes held
        data = self.link.recv(delivery.pending)
        if data:
            chunks[0] += len(data)
            if chunks[0] > self.max_size:
                return self._too_large(chunks[0])
            if delivery.partial:
                if not self.conn.buffers.take(len(data)):
                    return self._too_large(chunks[0])
                chunks[1] += len(data)
            chunks.append(data)
        if delivery.partial:
            return
        del self._partial[delivery._impl]
        self.conn.buffers.give(chunks[1])
        payload = b"".join(chunks[2:])
        self.link.advance()
        if self.link.credit < CREDIT_WINDOW // 2:
            self.link.flow(CREDIT_WINDOW - self.link.credit)
        if delivery.aborted:
            delivery.settle()
            return
        self.spawn(self._answer(payload, delivery))

    def _too_large(self, size: int) -> None:
        log.info(
            "connection %s: %s request of %d bytes or more refused",
            self.conn.proto.peer,
            self.reply_key or "node",
            size,
        )
        if not self.detached:
            self.conn.detach(
                self,
                amqp_condition(
                    BusdError(
                        Condition.MESSAGE_SIZE_EXCEEDED,
                        f"A request on this link may have at most {self.max_size} bytes.",
                    )
                ),
            )

    def on_detach(self) -> None:
        super().on_detach()
        self.drop_unfinished(self._partial)

    async def _answer(self, payload: bytes, delivery: Delivery) -> None:
        try:
            response, reply_to = await self.handle(payload)
        finally:
            self._accept(delivery)
        if response is None:
            return
        reply = self.conn.links.reply(self.link.session, reply_to or self.reply_key)
        if reply is None:
            # The client's own mistake, and any client can repeat it at will: debug only.
            log.debug("no reply link %r for a %s request", reply_to, self.reply_key)
            return
        reply.send(response)

    def _accept(self, delivery: Delivery) -> None:
        if not self.detached:
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()

    @abc.abstractmethod
    async def handle(self, payload: bytes) -> tuple[bytes | None, str | None]:
        """The encoded response to a request, and the address it names in `reply-to`."""
