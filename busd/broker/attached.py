"""What server-scope code (the broker, faults on demand) sees of a link a client attached.

The links (busd.broker.links) sit above the broker: the broker keeps the links attached to
each entity and detaches them when the entity is deleted, and faults on demand detach them or
close their connections, without importing the link classes.
busd.broker.links.base.LinkEndpoint implements this."""

from __future__ import annotations

from typing import Protocol

from busd.errors import BusdError


class AttachedLink(Protocol):
    # True once detached by either side: nothing more to do for it
    detached: bool

    @property
    def conn(self) -> object:
        """Its connection, told apart by identity (one close per connection)."""

    def detach_with(self, error: BusdError, *, triple: bool = True) -> None:
        """Detach the link on our side with `error` (after its store work); `triple`: keep
        the error's three fields on the wire (busd.broker.links.base.amqp_condition)."""

    def close_connection_with(self, error: BusdError) -> None:
        """Close the link's whole AMQP connection with `error`."""
