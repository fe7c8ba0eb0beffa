"""Connection scope: routes proton events to the right link endpoint.

Every link the client attaches becomes one endpoint object, chosen by busd.broker.routing and
kept in the connection's `LinkRegistry`: the CBS node, a `$management` node, a queue sender
(client sends), or a queue receiver (client receives). Refusals follow docs/wire.md §4.3:
answer the attach with the broker-owned terminus null, then detach with the error.

A link that goes (the client detaches it, ends its session or closes the connection) first
finishes its store work in the order the client sent it (`LinkEndpoint.finish`); only then is
the detach, end or close answered. So a client that completes messages and detaches in one
burst has its completions stored before the session is released, and may accept the same
session again as soon as it hears the answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from proton import Condition, Link

from busd.auth.sas import audience_covers
from busd.broker.links import LinkEndpoint, LinkRegistry, close_link, refuse_link
from busd.broker.routing import make_endpoint
from busd.errors import BusdError
from busd.errors import Condition as Cond

if TYPE_CHECKING:
    from busd.amqp.protocol import AmqpProtocol
    from busd.broker.broker import Broker

log = logging.getLogger("busd.broker")

# Bytes the engine may buffer per session for incoming transfers: keeps the session's
# incoming window open for clients that pipeline many transfers (docs/wire.md §1.4).
SESSION_INCOMING_CAPACITY = 64 * 1024 * 1024

# Every connection handler still in memory (open, or closed and not yet freed): the census
# behind the busd_connection_objects gauge, which shows a connection that is never freed.
LIVE_CONNECTIONS: weakref.WeakSet[ConnectionHandler] = weakref.WeakSet()


class ConnectionHandler:
    """Connection scope: the proton connection, its CBS grants and its links."""

    def __init__(self, proto: AmqpProtocol, broker: Broker) -> None:
        self.proto = proto
        self.broker = broker
        self.remote_container = "?"
        # audience (lower-cased, without trailing '/') -> token expiry (unix seconds)
        self.grants: dict[str, float] = {}
        # this connection's live links; `raw` is read by the protocol on every delivery
        self.links = LinkRegistry()
        self.raw_links = self.links.raw
        # store work of links that went, still running (see the module docstring)
        self._finishing: set[asyncio.Task] = set()
        LIVE_CONNECTIONS.add(self)
        if broker.metrics is not None:
            broker.metrics.connection_opened()

    # --- event dispatch -------------------------------------------------------------------
    def dispatch(self, event) -> None:
        method = getattr(self, event.type.method, None)
        if method is not None:
            method(event)

    def on_connection_remote_open(self, event) -> None:
        conn = event.connection
        self.remote_container = conn.remote_container or "?"
        conn.container = self.broker.container_id
        conn.open()
        log.info("connection opened: peer=%s container=%s", self.proto.peer, self.remote_container)

    def on_connection_remote_close(self, event) -> None:
        conn = event.connection
        for endpoint in self.links:
            self._end(endpoint)
        self._after_finishing(conn.close)

    def on_session_remote_open(self, event) -> None:
        session = event.session
        session.incoming_capacity = SESSION_INCOMING_CAPACITY
        session.open()

    def on_session_remote_close(self, event) -> None:
        # Ending a session ends its links too: their work goes first, as for a detach.
        session = event.session
        for endpoint in [e for e in self.links if e.link.session == session]:
            self._end(endpoint)
        self._after_finishing(session.close)

    def on_link_remote_open(self, event) -> None:
        link = event.link
        try:
            endpoint = make_endpoint(self, link)
        except BusdError as error:
            log.debug("link %s refused: %s", link.name, error)
            refuse_link(link, error)
            return
        self.links.add(endpoint)
        if self.broker.metrics is not None:
            self.broker.metrics.link_attached()
        endpoint.on_attach()

    def on_link_flow(self, event) -> None:
        endpoint = self.links.of(event.link)
        if endpoint is not None:
            endpoint.on_flow()

    def on_delivery(self, event) -> None:
        delivery = event.delivery
        endpoint = self.links.of(delivery.link)
        if endpoint is not None:
            endpoint.on_delivery(delivery)

    def on_link_remote_close(self, event) -> None:
        self._link_gone(event.link)

    def on_link_remote_detach(self, event) -> None:
        self._link_gone(event.link)

    def on_transport_error(self, event) -> None:
        cond = event.transport.condition
        # The SDK detaches a $management link after ending its session (docs/wire.md §1.5): proton
        # answers with "no such channel"; the client is leaving anyway.
        late_frame = cond is not None and "no such channel" in (cond.description or "")
        log.log(logging.DEBUG if late_frame else logging.INFO,
                "connection %s: transport error: %s", self.proto.peer, cond)

    def on_transport_closed(self, event) -> None:
        self.proto.kick()

    def _link_gone(self, link: Link) -> None:
        endpoint = self.links.of(link)
        if endpoint is not None:
            self._end(endpoint, then=lambda: close_link(link))
        else:
            close_link(link)

    def _end(self, endpoint: LinkEndpoint, then: Callable[[], None] | None = None) -> None:
        """The endpoint's link is gone: stop it at once, finish its store work in the
        background, then call `then` (answer the client) and write what that produced."""
        self._forget(endpoint)
        endpoint.on_detach()
        task = asyncio.get_running_loop().create_task(endpoint.finish())
        self._finishing.add(task)

        def done(task: asyncio.Task) -> None:
            self._finishing.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("finishing link %s failed", endpoint.link.name,
                          exc_info=task.exception())
            if then is not None:
                then()
            self.proto.kick()

        task.add_done_callback(done)

    def _after_finishing(self, then: Callable[[], None]) -> None:
        """Call `then` once every link that went has finished its store work."""
        pending = list(self._finishing)
        if not pending:
            then()
            return

        async def wait() -> None:
            await asyncio.gather(*pending, return_exceptions=True)
            then()
            self.proto.kick()

        asyncio.get_running_loop().create_task(wait())

    def detach(self, endpoint: LinkEndpoint, condition: Condition) -> None:
        """Detach a link on our side with an error (e.g. its session lock was lost)."""
        link = endpoint.link

        def close() -> None:
            link.condition = condition
            close_link(link)

        self._end(endpoint, then=close)

    def refuse(self, endpoint: LinkEndpoint, error: BusdError) -> None:
        """Refuse a link whose attach is still unanswered (docs/wire.md §4.3)."""
        self._forget(endpoint)
        endpoint.on_detach()
        refuse_link(endpoint.link, error)
        self.proto.kick()

    def _forget(self, endpoint: LinkEndpoint) -> None:
        if self.links.remove(endpoint) and self.broker.metrics is not None:
            self.broker.metrics.link_detached()

    def closed(self) -> None:
        """The socket is gone: release what this connection's links held, each after the work
        the client sent before it went."""
        for endpoint in self.links:
            self._end(endpoint)
        if self.broker.metrics is not None:
            self.broker.metrics.connection_closed()
        log.info("connection closed: peer=%s container=%s", self.proto.peer, self.remote_container)

    # --- authorisation --------------------------------------------------------------------
    def grant(self, audience: str, expiry: float) -> None:
        self.grants[audience.lower()] = expiry

    def authorize(self, entity_path: str) -> None:
        """Raise unless a live CBS token of this connection covers `entity_path`."""
        now = time.time()
        for audience, expiry in self.grants.items():
            if expiry > now and audience_covers(audience, entity_path):
                return
        raise BusdError(
            Cond.UNAUTHORIZED,
            f"Unauthorized access to '{entity_path}': put a valid token for it on $cbs first.",
        )
