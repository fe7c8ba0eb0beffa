"""A connection's CBS grants: which live tokens it holds, what they authorize, and the timer
that detaches a link once no live token covers it any more (docs/wire.md §3.5).

`ConnectionHandler` (busd.broker.links.connection) inherits it; the attributes declared here are set
by its constructor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from proton import Condition, Endpoint

from busd.auth.rights import Grant, allows, missing_claim
from busd.broker.links.base import LinkEndpoint, LinkRegistry, amqp_condition
from busd.broker.transactions import TransactionScope
from busd.errors import BusdError
from busd.errors import Condition as Cond

if TYPE_CHECKING:
    from busd.amqp.protocol import AmqpProtocol
    from busd.broker.broker import Broker
    from busd.broker.links.base import BrokerScope
    from busd.broker.namespaces import Namespaces

log = logging.getLogger("busd.broker")

# A token's expiry is in whole seconds: links are detached this long after it.
EXPIRY_SLACK_S = 0.05


class TokenGrants:
    """The authorisation half of a connection: its grants, its binding to a namespace and its
    token expiry timer."""

    proto: AmqpProtocol
    broker: BrokerScope
    home: Broker
    namespaces: Namespaces | None
    transactions: TransactionScope
    links: LinkRegistry
    # audience (lower-cased) -> what its latest verified token grants
    grants: dict[str, Grant]
    _bound: bool
    _closed: bool
    _authenticated: bool
    _auth_timer: asyncio.TimerHandle | None
    _expiry_timer: asyncio.TimerHandle | None
    _expiry_at: float

    if TYPE_CHECKING:  # the connection's, busd.broker.links.connection

        def _at_connection_cap(self) -> bool: ...

        def detach(self, endpoint: LinkEndpoint, condition: Condition) -> None: ...

        def refuse(self, endpoint: LinkEndpoint, error: BusdError) -> None: ...

    def bind(self, broker: BrokerScope) -> bool:
        """Serve `broker`'s namespace from now on; False when a token already bound the
        connection to another one (a connection serves one namespace for its life)."""
        if self._bound:
            return broker is self.broker
        self._bound = True
        self.broker = broker
        self.transactions.broker = broker  # none declared yet: that needs a grant
        if self.namespaces is not None:
            self.namespaces.hold(broker)
        return True

    def grant(self, grant: Grant) -> None:
        """A verified token: it replaces the one put before for the same audience (a refresh).
        The first one counts the connection among the authenticated ones, if the cap allows."""
        if not self._authenticated:
            if self._closed or self._at_connection_cap():
                return
            self._authenticated = True
            self.home.authenticated_connections += 1
            self.proto.authenticated()
        self.grants[grant.audience.lower()] = grant
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self._arm_expiry()

    def authorize(self, entity_path: str, right: str | None) -> None:
        """Raise unless a live CBS token of this connection covers `entity_path` with `right`
        (None: any right)."""
        now = time.time()
        covering = [g for g in self.grants.values() if g.expiry > now and g.covers(entity_path)]
        if any(allows(g.claims, right) for g in covering):
            return
        if covering:
            reason = f"Unauthorized access to '{entity_path}': {missing_claim(right)}."
        else:
            reason = (
                f"Unauthorized access to '{entity_path}': put a valid token for it on $cbs first."
            )
        raise BusdError(Cond.UNAUTHORIZED, reason)

    def _arm_expiry(self) -> None:
        """One timer per connection, at its earliest token expiry: a refresh that moves the
        expiry later costs one wake-up that finds nothing to do."""
        if not self.grants:
            return
        earliest = min(g.expiry for g in self.grants.values())
        if self._expiry_timer is not None:
            if self._expiry_at <= earliest:
                return
            self._expiry_timer.cancel()
        self._expiry_at = earliest
        self._expiry_timer = asyncio.get_running_loop().call_later(
            max(0.0, earliest - time.time()) + EXPIRY_SLACK_S, self._expire
        )

    def _expire(self) -> None:
        """Tokens lapsed: forget them, and detach the links no live token covers any more with
        `amqp:unauthorized-access`, as Service Bus does."""
        self._expiry_timer = None
        now = time.time()
        self.grants = {a: g for a, g in self.grants.items() if g.expiry > now}
        for endpoint in self.links:
            if endpoint.needs is None or endpoint.detached:
                continue
            entity_path, right = endpoint.needs
            try:
                self.authorize(entity_path, right)
            except BusdError:
                log.info(
                    "connection %s: token for '%s' expired: detaching link %s",
                    self.proto.peer,
                    entity_path,
                    endpoint.link.name,
                )
                error = BusdError(
                    Cond.UNAUTHORIZED,
                    f"The token for '{entity_path}' expired: put a new one on $cbs "
                    "before it expires to keep links open.",
                )
                if endpoint.link.state & Endpoint.LOCAL_UNINIT:  # attach not answered yet
                    self.refuse(endpoint, error)
                else:
                    self.detach(endpoint, amqp_condition(error, triple=False))
        self._arm_expiry()
        self.proto.kick()

    def _disarm_expiry(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
