"""Connection scope: routes proton events to the right link endpoint.

Every link the client attaches becomes one endpoint object, chosen by busd.broker.links.routing and
kept in the connection's `LinkRegistry`: the CBS node, a `$management` node, a queue sender
(client sends), or a queue receiver (client receives). Refusals follow docs/wire.md §4.3:
answer the attach with the broker-owned terminus null, then detach with the error.

A link that goes (the client detaches it, ends its session or closes the connection) first
finishes its store work in the order the client sent it (`LinkEndpoint.finish`); only then is
the detach, end or close answered. So a client that completes messages and detaches in one
burst has its completions stored before the session is released, and may accept the same
session again as soon as it hears the answer.

What the client's open and attach carry is read in busd.broker.links.frames; the connection's
CBS grants and token expiry are its `TokenGrants` half (busd.broker.links.token_grants).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import Condition, Endpoint, Link

from busd.amqp import engine
from busd.broker.limits import Buffers
from busd.broker.links.base import (
    LinkEndpoint,
    LinkRegistry,
    amqp_condition,
    refuse_link,
)
from busd.broker.links.frames import _read_attach, _read_open
from busd.broker.links.routing import make_endpoint
from busd.broker.links.token_grants import TokenGrants
from busd.broker.namespaces import namespace_of_host
from busd.broker.transactions import TransactionScope
from busd.errors import BusdError
from busd.errors import Condition as Cond
from busd.process.memory import trim_soon

if TYPE_CHECKING:
    from busd.amqp.protocol import AmqpProtocol
    from busd.auth.rights import Grant
    from busd.broker.broker import Broker
    from busd.broker.links.base import BrokerScope
    from busd.broker.namespaces import Namespaces

log = logging.getLogger("busd.broker")

# Bytes the engine may buffer per session for incoming transfers: keeps the session's
# incoming window open for clients that pipeline many transfers (docs/wire.md §1.4).
SESSION_INCOMING_CAPACITY = 64 * 1024 * 1024

# Every connection handler still in memory (open, or closed and not yet freed): the census
# behind the busd_connection_objects gauge, which shows a connection that is never freed.
LIVE_CONNECTIONS: weakref.WeakSet[ConnectionHandler] = weakref.WeakSet()


def kept_endpoints() -> tuple[int, int]:
    """(AMQP sessions, links) proton keeps for this process's open connections: the census
    behind busd_session_objects and busd_link_objects, which show ended sessions or detached
    links that are never freed (docs/design.md §3.12). Walks them all: read at a scrape only."""
    sessions = links = 0
    for handler in list(LIVE_CONNECTIONS):
        s, n = handler.kept_endpoints()
        sessions += s
        links += n
    return sessions, links


class ConnectionHandler(TokenGrants):
    """Connection scope: the proton connection, its CBS grants and its links."""

    def __init__(
        self, proto: AmqpProtocol, broker: Broker, namespaces: Namespaces | None = None
    ) -> None:
        self.proto = proto
        # the namespace's broker, whose entities the links reach: the default namespace's
        # until a put-token binds the connection to its own (docs/design.md §3.17)
        self.broker: BrokerScope = broker
        # the process's own figures (connections, links, limits): the default namespace's
        self.home = broker
        self.namespaces = namespaces
        self.host_namespace: str | None = None  # chosen by the open frame's hostname
        self._bound = False
        self.remote_container = "?"
        # audience (lower-cased) -> what its latest verified token grants
        self.grants: dict[str, Grant] = {}
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_at = 0.0
        self.first_credit: dict[str, int] = {}  # see ConnectionScope
        # this connection's live links; `raw` is read by the protocol on every delivery
        self.links = LinkRegistry()
        self.transactions = TransactionScope(broker)  # see ConnectionScope
        self.raw_links = self.links.raw
        # store work of links that went, still running (see the module docstring)
        self._finishing: set[asyncio.Task] = set()
        # raw link pointer -> the link, while its store work finishes (`_end`); and those of
        # them the client detached meanwhile, freed once that work is done
        self._ending: dict[Any, Link] = {}
        self._free_when_done: set[Any] = set()
        # links busd closed first (refused, or detached with an error) whose detach the client
        # has not answered: proton keeps them until it does (docs/design.md §3.12)
        self._unanswered: dict[Any, Link] = {}
        # bytes of unfinished transfers this connection's links hold (docs/design.md §3.12)
        self.buffers = Buffers(broker.limits.connection_buffer, broker.buffers)
        self._closed = False
        LIVE_CONNECTIONS.add(self)
        if broker.metrics is not None:
            broker.metrics.connection_opened()
        # counted in `home.authenticated_connections` since its first valid put-token
        self._authenticated = False
        # Closed unless a put-token succeeds in time (cancelled by `grant`).
        self._auth_timer: asyncio.TimerHandle | None = None
        if broker.limits.auth_timeout_s:
            self._auth_timer = asyncio.get_running_loop().call_later(
                broker.limits.auth_timeout_s, self._auth_timed_out
            )

    # --- event dispatch -------------------------------------------------------------------
    def dispatch(self, event) -> None:
        method = getattr(self, event.type.method, None)
        if method is None:
            return
        try:
            method(event)
        except Exception:  # contained to the link, else the connection; never the process
            log.exception("connection %s: handling %s failed", self.proto.peer, event.type)
            self._contain(event)

    def flow(self, endpoint: LinkEndpoint) -> None:
        """A flow on a link whose deliveries the protocol hands over raw (no event object)."""
        try:
            endpoint.on_flow()
        except Exception:  # contained to the link
            log.exception("connection %s: handling a flow failed", self.proto.peer)
            try:
                internal = BusdError(Cond.INTERNAL, "busd failed to handle this; it is logged.")
                self.detach(endpoint, amqp_condition(internal, triple=False))
            except Exception:
                log.exception("connection %s: closing after a failure failed", self.proto.peer)
                self.proto.abort()
            self.proto.kick()

    def _contain(self, event) -> None:
        internal = BusdError(Cond.INTERNAL, "busd failed to handle this; it is logged.")
        try:
            link = event.link
            endpoint = self.links.of(link) if link is not None else None
            if endpoint is not None:
                self.detach(endpoint, amqp_condition(internal, triple=False))
            elif link is not None:
                if not link.state & Endpoint.LOCAL_ACTIVE:
                    self._refuse_link(link, internal)  # the attach is answered, whatever failed
                else:
                    link.condition = amqp_condition(internal, triple=False)
                    self._close_first(link)
            else:
                self.close_connection(internal)
        except Exception:
            log.exception("connection %s: closing after a failure failed", self.proto.peer)
            self.proto.abort()
        self.proto.kick()

    def close_connection(self, error: BusdError) -> None:
        """Close the AMQP connection with `error` (opening it first if it is not yet: an open
        is always answered with an open [2.4.1])."""
        conn = self.proto.connection
        if conn.state & Endpoint.LOCAL_CLOSED:
            return
        if not conn.state & Endpoint.LOCAL_ACTIVE:
            conn.container = self.home.container_id
            conn.open()
        conn.condition = amqp_condition(error)
        conn.close()  # proton writes the close, then ends the output and we the socket
        self.proto.kick()

    def on_connection_remote_open(self, event) -> None:
        conn = event.connection
        try:
            container, hostname = _read_open(conn)
        except BusdError as error:
            log.info("connection %s refused: %s", self.proto.peer, error.description)
            self.close_connection(error)
            return
        self.remote_container = container or "?"
        if self._at_connection_cap():
            return
        conn.container = self.home.container_id
        self.host_namespace = namespace_of_host(hostname)
        conn.open()
        self.proto.opened()
        log.info("connection opened: peer=%s container=%s", self.proto.peer, self.remote_container)

    def _at_connection_cap(self) -> bool:
        """Close the connection when the process serves as many authenticated connections as
        it may (unauthenticated ones are capped apart, busd.net.listener)."""
        cap = self.home.limits.connections
        if not cap or self.home.authenticated_connections < cap:
            return False
        log.warning("connection %s refused: %d connections open, the limit", self.proto.peer, cap)
        self.close_connection(
            BusdError(Cond.RESOURCE_LIMIT, f"This busd process serves at most {cap} connections.")
        )
        return True

    def _auth_timed_out(self) -> None:
        self._auth_timer = None
        if not self.grants and not self._closed and not self.proto.closing:
            log.info(
                "connection %s closed: no valid put-token within %g s",
                self.proto.peer,
                self.home.limits.auth_timeout_s,
            )
            if self.home.metrics is not None:
                self.home.metrics.handshake_timed_out("token")
            self.close_connection(
                BusdError(
                    Cond.UNAUTHORIZED,
                    f"No valid token was put on $cbs within {self.home.limits.auth_timeout_s:g} s "
                    "of connecting.",
                )
            )
            # proton writes the close only after the client's headers: the socket goes now
            self.proto.close_socket()

    def on_connection_remote_close(self, event) -> None:
        conn = event.connection
        for endpoint in self.links:
            self._end(endpoint)
        self._after_finishing(conn.close)

    # --- a link's and a session's life, on proton's engine (busd.amqp.engine) ---------------
    def session_opened(self, session: Any) -> None:
        engine.session_set_incoming_capacity(session, SESSION_INCOMING_CAPACITY)
        engine.session_open(session)

    def session_gone(self, session: Any) -> None:
        # Ending a session ends its links too: their work goes first, as for a detach.
        try:
            for endpoint in self.links:
                if engine.link_session(endpoint.link._impl) == session:
                    self._end(endpoint)
            # its links busd closed first go with it (their pointers are proton's to reuse)
            for impl in [i for i in self._unanswered if engine.link_session(i) == session]:
                del self._unanswered[impl]
        except Exception:  # contained to the connection; its session is still answered
            log.exception("connection %s: ending a session failed", self.proto.peer)
        # held until answered: its links' store work may outlast the connection's objects
        engine.hold(session)
        self._after_finishing(lambda: self._end_session(session))

    def _end_session(self, session: Any) -> None:
        try:
            engine.end_session(session)
        finally:
            engine.release(session)

    def link_opened(self, impl: Any) -> None:
        link = Link.wrap(impl)  # the endpoint's one proton object for its link
        try:
            attach = _read_attach(impl)
            limit = self.home.limits.links_per_connection
            if len(self._unanswered) >= limit:
                # Refusing would keep one more: a client that answers no detach is closed.
                self.close_connection(
                    BusdError(
                        Cond.RESOURCE_LIMIT, f"The client left {limit} detaches of busd unanswered."
                    )
                )
                return
            if len(self.links) + len(self._unanswered) >= limit:
                raise BusdError(
                    Cond.RESOURCE_LIMIT, f"A connection may have at most {limit} links."
                )
            endpoint = make_endpoint(self, link, attach)
        except BusdError as error:
            log.debug("link refused: %s", error)
            self._refuse_link(link, error)
            return
        except Exception:
            log.exception("connection %s: handling an attach failed", self.proto.peer)
            self._contain_link(link, None)
            return
        self.links.add(endpoint)
        if self.home.metrics is not None:
            self.home.metrics.link_attached()
        try:
            endpoint.on_attach()
        except Exception:
            log.exception("connection %s: handling an attach failed", self.proto.peer)
            self._contain_link(link, endpoint)

    def link_flow(self, impl: Any) -> None:
        endpoint = self.links.of_raw(impl)
        if endpoint is not None:
            self.flow(endpoint)

    def link_gone(self, impl: Any) -> None:
        """The client detached the link (one detach per link: proton refuses a second). It is
        freed once busd has answered and nothing of busd's uses it any more."""
        try:
            self._link_gone(impl)
        except Exception:
            log.exception("connection %s: handling a detach failed", self.proto.peer)
            self.proto.abort()

    def _link_gone(self, impl: Any) -> None:
        self._unanswered.pop(impl, None)
        endpoint = self.links.of_raw(impl)
        if endpoint is not None:
            self._end(endpoint, then=lambda: engine.end_link(impl))
        elif impl in self._ending:  # busd detached it first and is still finishing its work
            self._free_when_done.add(impl)
        else:
            engine.end_link(impl)

    def _contain_link(self, link: Link, endpoint: LinkEndpoint | None) -> None:
        """A failure handling an attach: the link is detached (refused when its attach is not
        answered yet) with amqp:internal-error; the connection goes on."""
        internal = BusdError(Cond.INTERNAL, "busd failed to handle this; it is logged.")
        try:
            if endpoint is not None and self.links.of(link) is endpoint:
                if link.state & Endpoint.LOCAL_UNINIT:
                    self.refuse(endpoint, internal)
                else:
                    self.detach(endpoint, amqp_condition(internal, triple=False))
            elif not link.state & Endpoint.LOCAL_ACTIVE:
                self._refuse_link(link, internal)
            else:
                link.condition = amqp_condition(internal, triple=False)
                self._close_first(link)
        except Exception:
            log.exception("connection %s: closing after a failure failed", self.proto.peer)
            self.proto.abort()
        self.proto.kick()

    def on_delivery(self, event) -> None:
        delivery = event.delivery
        endpoint = self.links.of(delivery.link)
        if endpoint is not None:
            endpoint.on_delivery(delivery)
        elif delivery.link.is_receiver and delivery.readable:
            # A link that went (refused, detached) while the client still sends on it: drop
            # the transfer, or proton would keep its bytes for as long as the link lasts.
            # Read (proton counts unread bytes against the session's window) and settled,
            # even unfinished, it is freed, and proton reads the rest of its frames without
            # keeping them.
            delivery.link.recv(delivery.pending)
            delivery.settle()

    def on_transport_error(self, event) -> None:
        try:
            cond = event.transport.condition
        except UnicodeDecodeError:  # proton quotes the client's bytes in its description
            log.info("connection %s: transport error (description not UTF-8)", self.proto.peer)
            return
        # The SDK detaches a $management link after ending its session (docs/wire.md §1.5): proton
        # answers with "no such channel"; the client is leaving anyway.
        late_frame = cond is not None and "no such channel" in (cond.description or "")
        log.log(
            logging.DEBUG if late_frame else logging.INFO,
            "connection %s: transport error: %s",
            self.proto.peer,
            cond,
        )

    def on_transport_closed(self, event) -> None:
        self.proto.kick()

    def _close_first(self, link: Link) -> None:
        """Close a link on busd's side before the client detached it."""
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.close()
            if not link.state & Endpoint.REMOTE_CLOSED:
                self._unanswered[link._impl] = link

    def _refuse_link(self, link: Link, error: BusdError) -> None:
        refuse_link(link, error)
        if not link.state & Endpoint.REMOTE_CLOSED:
            self._unanswered[link._impl] = link

    def _end(self, endpoint: LinkEndpoint, then: Callable[[], None] | None = None) -> None:
        """The endpoint's link is gone: stop it at once, finish its store work in the
        background, then call `then` (answer the client) and write what that produced."""
        self._forget(endpoint)
        try:
            endpoint.on_detach()
        except Exception:  # its store work and the answer still go ahead
            log.exception("stopping link %s failed", endpoint.link.name)
        task = asyncio.get_running_loop().create_task(endpoint.finish())
        self._finishing.add(task)
        link = endpoint.link
        self._ending[link._impl] = link

        def done(task: asyncio.Task) -> None:
            self._finishing.discard(task)
            self._ending.pop(link._impl, None)
            if not task.cancelled() and task.exception() is not None:
                log.error("finishing link %s failed", endpoint.link.name, exc_info=task.exception())
            if then is not None:
                then()
            if link._impl in self._free_when_done:  # the client detached it meanwhile
                self._free_when_done.discard(link._impl)
                self._unanswered.pop(link._impl, None)  # (`then` may have closed it first)
                engine.end_link(link._impl)
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
            self._close_first(link)

        self._end(endpoint, then=close)

    def refuse(self, endpoint: LinkEndpoint, error: BusdError) -> None:
        """Refuse a link whose attach is still unanswered (docs/wire.md §4.3)."""
        self._forget(endpoint)
        endpoint.on_detach()
        self._refuse_link(endpoint.link, error)
        self.proto.kick()

    def _forget(self, endpoint: LinkEndpoint) -> None:
        if self.links.remove(endpoint) and self.home.metrics is not None:
            self.home.metrics.link_detached()

    def closed(self) -> None:
        """The socket is gone: release what this connection's links held, each after the work
        the client sent before it went."""
        if self._closed:
            return
        self._closed = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self._disarm_expiry()
        try:
            for endpoint in self.links:
                try:
                    self._end(endpoint)
                except Exception:  # the other links are released all the same
                    log.exception("releasing a link of %s failed", self.proto.peer)
        finally:
            if self._bound and self.namespaces is not None:
                self.namespaces.let_go(self.broker)
            if self._authenticated:
                self.home.authenticated_connections -= 1
            if self.home.metrics is not None:
                self.home.metrics.connection_closed()
            trim_soon()  # once the connection's objects are freed (docs/design.md §3.12)
        log.info("connection closed: peer=%s container=%s", self.proto.peer, self.remote_container)

    def kept_endpoints(self) -> tuple[int, int]:
        """(sessions, links) proton keeps for this connection; none once it is closed."""
        if self._closed:
            return 0, 0
        conn = self.proto.connection
        return _chain_length(conn.session_head(0)), _chain_length(conn.link_head(0))


def _chain_length(endpoint) -> int:
    """How many sessions or links proton's list holds from `endpoint`, its head (0: any
    state)."""
    count = 0
    while endpoint is not None:
        count += 1
        endpoint = endpoint.next(0)
    return count
