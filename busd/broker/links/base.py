"""What every link endpoint shares, and the interfaces between endpoints and their connection.

This module is the leaf of busd.broker: endpoints (nodes, senders, receivers) import it, the
connection (busd.broker.links.connection) and routing (busd.broker.links.routing) import them, and
nothing here imports back. An endpoint reaches its connection only through `ConnectionScope`,
and the broker only through `BrokerScope`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from proton import Condition, Delivery, Link, Terminus, symbol

from busd.amqp import engine
from busd.errors import BusdError
from busd.process.memory import trim_soon

if TYPE_CHECKING:
    from busd.amqp.addresses import Address
    from busd.amqp.protocol import AmqpProtocol
    from busd.auth.rights import Grant
    from busd.broker.catalog import Catalog
    from busd.broker.fanout import Fanout
    from busd.broker.lease import SessionLease
    from busd.broker.limits import Buffers, Limits
    from busd.broker.receivers import Receivers
    from busd.broker.settings import BrokerSettings
    from busd.broker.transactions import TransactionScope
    from busd.storage.api import Store
    from busd.storage.messages import NewMessage
    from busd.storage.specs import QueueSpec, TopicSpec

log = logging.getLogger("busd.broker")

# Credit we keep open on links where the client sends (requests, messages). The Python SDK
# ignores credit anyway (docs/wire.md §5.1); other clients get a generous window.
CREDIT_WINDOW = 1000


def amqp_condition(error: BusdError, *, triple: bool = True) -> Condition:
    """An AMQP error. `triple`: keep all three fields on the wire (a non-empty info map), which
    pyamqp needs in close frames and in rejected outcomes on its sender links (docs/wire.md
    §9.4)."""
    info: Any = {symbol("tracking-id"): "busd"} if triple else None
    return Condition(error.condition.value, error.description, info)


def refuse_link(link: Link, error: BusdError) -> None:
    """docs/wire.md §4.3: null terminus on our side, echo the other, then detach with the error.

    OASIS AMQP 1.0 Part 2 §2.6.3: "Note that if the application chooses not to create a
    terminus, the session endpoint will still create a link endpoint and issue an attach
    indicating that the link endpoint has no associated local terminus. In this case, the
    session endpoint MUST immediately detach the newly created link endpoint."
    """
    if link.is_sender:  # we send, the client receives: our terminus is the source
        link.source.type = Terminus.UNSPECIFIED
        link.target.copy(link.remote_target)
    else:
        link.target.type = Terminus.UNSPECIFIED
        link.source.copy(link.remote_source)
    link.open()
    link.condition = amqp_condition(error)
    link.close()


def echo_termini(link: Link) -> None:
    """Answer the attach with the client's termini and settle modes (on proton's engine:
    busd.amqp.engine)."""
    engine.echo_termini(link._impl)


def is_open(link: Link) -> bool:
    return not (engine.link_state(link._impl) & engine.LOCAL_CLOSED)


# --- interfaces ---------------------------------------------------------------------------------
class NamespaceAuthority(Protocol):
    """What `$cbs` uses of the process's namespaces (busd.broker.namespaces.Namespaces, which
    imports the broker above this module: described here, not imported)."""

    async def authenticate(
        self, token: str, host_namespace: str | None
    ) -> tuple[BrokerScope, Grant]: ...


class FaultScope(Protocol):
    """What endpoints use of faults on demand (busd.broker.faults.Faults, which detaches
    endpoints and so imports this module: described here, not imported)."""

    active: bool  # any fault set: the hot path's one check

    async def refusal(
        self, operation: str | tuple[str, ...], entity: str, session: str | None = None
    ) -> BusdError | None: ...

    async def check(
        self, operation: str | tuple[str, ...], entity: str, session: str | None = None
    ) -> None: ...


class BrokerScope(Protocol):
    """What endpoints and connections use of the broker (busd.broker.broker.Broker, which
    imports them: described here, not imported, so imports flow one way)."""

    store: Store
    catalog: Catalog
    fanout: Fanout
    metrics: Any  # busd.observability.metrics.Metrics, or None
    limits: Limits
    settings: BrokerSettings
    sas_keys: dict[str, str]
    authenticated_connections: int
    container_id: str
    # where the store's wake-ups go, and the sessions this process's receivers hold
    # (busd.broker.receivers)
    receivers: Receivers

    @property
    def faults(self) -> FaultScope:
        """Faults on demand (busd.broker.faults): the hot path reads `faults.active` only."""

    def queue(self, name: str) -> QueueSpec | None: ...

    def spec(self, path: str) -> QueueSpec | None: ...

    def receivable(self, name: str) -> QueueSpec | None: ...

    def topic(self, name: str) -> TopicSpec | None: ...

    @property
    def entities(self) -> dict[str, QueueSpec]: ...

    def has_entity(self, address: Address) -> bool: ...

    async def send(
        self, target: QueueSpec | TopicSpec, messages: list[NewMessage]
    ) -> list[int]: ...

    async def cancel_scheduled(self, target: QueueSpec | TopicSpec, seqs: list[int]) -> None: ...

    def new_waiter_id(self) -> str: ...

    def track(self, path: str, endpoint: LinkEndpoint) -> None: ...


class ConnectionScope(Protocol):
    """What an endpoint may use of its connection (links.connection.ConnectionHandler)."""

    proto: AmqpProtocol
    remote_container: str
    # queue name -> the credit this connection's last session receiver on it first granted
    # (busd.broker.links.sessions: what a new one will likely grant right after its attach)
    first_credit: dict[str, int]
    links: LinkRegistry
    buffers: Buffers  # bytes of unfinished transfers its links hold
    # its transactions, unknown to every other connection (busd.broker.transactions)
    transactions: TransactionScope

    # the namespace the open frame's hostname chose, and the process's namespaces (None: the
    # default one only; busd.broker.namespaces)
    host_namespace: str | None

    @property
    def namespaces(self) -> NamespaceAuthority | None: ...

    @property
    def broker(self) -> BrokerScope: ...

    def bind(self, broker: BrokerScope) -> bool:
        """Serve `broker`'s namespace; False when bound to another one already."""

    def grant(self, grant: Grant) -> None: ...

    def authorize(self, entity_path: str, right: str | None) -> None:
        """Raise unless a live CBS grant of this connection covers `entity_path` with `right`
        (busd.auth.rights; None: any)."""

    def detach(self, endpoint: LinkEndpoint, condition: Condition) -> None:
        """Detach a link on our side with an error, after its store work."""

    def refuse(self, endpoint: LinkEndpoint, error: BusdError) -> None:
        """Refuse a link whose attach is still unanswered (docs/wire.md §4.3)."""

    def close_connection(self, error: BusdError) -> None:
        """Close the AMQP connection with `error`."""


@runtime_checkable
class Receiver(Protocol):
    """A link the client receives on: `$management` requests may name it."""

    session_id: str | None
    holder: str  # its id in the store: lock holder, waiter


@runtime_checkable
class SessionHolder(Receiver, Protocol):
    """A receiver that may hold a session's lock: `$management` acts on a session only through
    the link holding it (docs/wire.md §8.4), and its lease (None until it holds one)."""

    lease: SessionLease | None


class LinkEndpoint:
    """Link scope: one attached link and what it is for.

    `raw_deliveries`: deliveries on this link go to `on_raw_delivery` as raw proton pointers
    (busd.amqp.engine, the per-message path) instead of wrapped to `on_delivery`.
    """

    raw_deliveries = False
    # (entity path, right) the link was authorized for: it is detached when no live token of
    # its connection covers them any more. None: the link needs no token ($cbs).
    needs: tuple[str, str | None] | None = None

    def __init__(self, conn: ConnectionScope, link: Link) -> None:
        self.conn = conn
        self.link = link
        self.detached = False

    @property
    def broker(self) -> BrokerScope:
        return self.conn.broker

    def on_attach(self) -> None:
        echo_termini(self.link)
        self.link.open()

    def on_flow(self) -> None:
        pass

    def on_delivery(self, delivery: Delivery) -> None:
        pass

    def on_raw_delivery(self, delivery: Any) -> None:
        pass

    def on_detach(self) -> None:
        """The link is gone (detached by either side, or its session or connection ended):
        stop starting work for it."""
        self.detached = True

    def drop_unfinished(self, partial: dict[Any, Any]) -> None:
        """Drop the unfinished transfers of a detached link (delivery -> (chunks, bytes held)):
        settled, proton frees each delivery with the bytes it buffered and reads the rest of
        its frames without keeping them (docs/design.md §3.12), even while the client has not
        answered the detach yet; their bytes go back to the connection's buffers."""
        if not partial:
            return
        for delivery, chunks in partial.items():
            self.conn.buffers.give(chunks[1])
            engine.settle(delivery)
        partial.clear()
        trim_soon()

    async def finish(self) -> None:
        """The store work of this link that must be done before its detach is answered: what
        the client sent before detaching reaches the store first (docs/design.md, under load).
        Nothing by default."""

    def kick(self) -> None:
        self.conn.proto.kick()

    def detach_with(self, error: BusdError, *, triple: bool = True) -> None:
        """busd.broker.attached.AttachedLink: detach on our side with `error`, now."""
        self.conn.detach(self, amqp_condition(error, triple=triple))
        self.kick()

    def close_connection_with(self, error: BusdError) -> None:
        """busd.broker.attached.AttachedLink: close this link's connection with `error`."""
        self.conn.close_connection(error)
        self.kick()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(_log_task_failure)
        return task


def _log_task_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("link task failed", exc_info=task.exception())


class LinkRegistry:
    """The one map from a connection's links to their endpoints: by proton link, by link name
    (`associated-link-name` in `$management` requests), and the subset taking raw deliveries,
    which the connection's protocol reads on every delivery event (`raw`)."""

    def __init__(self) -> None:
        self._by_link: dict[Any, LinkEndpoint] = {}  # raw pn_link_t pointer -> endpoint
        self._by_name: dict[str, LinkEndpoint] = {}
        self._names: dict[Any, str] = {}  # raw pointer -> its link's name
        self.raw: dict[Any, LinkEndpoint] = {}
        # (raw pn_session_t pointer, address) -> our reply link of a request/response node
        # in that AMQP session (busd.broker.links.nodes)
        self._replies: dict[tuple[Any, str], LinkEndpoint] = {}

    def add(self, endpoint: LinkEndpoint) -> None:
        impl = endpoint.link._impl
        name = endpoint.link.name
        self._by_link[impl] = endpoint
        self._by_name[name] = endpoint
        self._names[impl] = name  # (proton decodes the name on every read)
        if endpoint.raw_deliveries:
            self.raw[impl] = endpoint

    def remove(self, endpoint: LinkEndpoint) -> bool:
        """Forget the endpoint's link (its pointer may be reused once proton frees it); False
        when it was not registered."""
        impl = endpoint.link._impl
        if self._by_link.get(impl) is not endpoint:
            return False
        del self._by_link[impl]
        name = self._names.pop(impl)
        if self.raw.get(impl) is endpoint:
            del self.raw[impl]
        if self._by_name.get(name) is endpoint:
            del self._by_name[name]
        return True

    def add_reply(self, session: Any, address: str, endpoint: LinkEndpoint) -> None:
        self._replies[(session._impl, address.lower())] = endpoint

    def remove_reply(self, session: Any, address: str, endpoint: LinkEndpoint) -> None:
        key = (session._impl, address.lower())
        if self._replies.get(key) is endpoint:
            del self._replies[key]

    def reply(self, session: Any, address: str) -> Any:
        """The reply link `address` names in `session`, if it is still attached."""
        return self._replies.get((session._impl, address.lower()))

    def of(self, link: Link) -> LinkEndpoint | None:
        return self._by_link.get(link._impl)

    def of_raw(self, link: Any) -> LinkEndpoint | None:
        """The endpoint of a raw `pn_link_t` pointer (busd.amqp.engine)."""
        return self._by_link.get(link)

    def named(self, name: str) -> LinkEndpoint | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[LinkEndpoint]:
        return iter(list(self._by_link.values()))

    def __len__(self) -> int:
        return len(self._by_link)
