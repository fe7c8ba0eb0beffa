"""What one client may make a busd process hold, and how much of it is held now.

Every limit is a setting (`busd serve --help`, docs/configuration.md's table); each is
answered with the AMQP condition clients expect (docs/design.md §3.12):

- bytes of unfinished transfers per link: the transfer is refused with
  `amqp:link:message-size-exceeded`; per connection and per process: the link is detached with
  `amqp:resource-limit-exceeded`;
- a `$cbs` request: the link is detached with `amqp:link:message-size-exceeded`;
- links per connection: the attach is refused with `amqp:resource-limit-exceeded`;
- authenticated connections per process: the connection is closed with
  `amqp:resource-limit-exceeded`;
- time without a valid put-token: the connection is closed with `amqp:unauthorized-access`;
- time from the accept to the AMQP open (first byte, TLS, WebSocket upgrade, headers): the
  socket is closed (busd.net.listener: nothing AMQP can be said yet);
- unauthenticated connections per process and per peer address: the oldest one's socket is
  closed to make room for the new one (busd.net.listener).

A link's own ceiling is its entity's max message size plus room for a batch envelope, lowered
by `link_buffer` when that is set; a `$management` request's is the same, its entity's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from busd.units import KIB, MIB

# Room for a batch's envelope and a request's properties around the largest message.
ENVELOPE = 64 * KIB

# Names a client gives (container-id, link name, address): longer ones are refused.
MAX_NAME_LENGTH = 1024


@dataclass
class Limits:
    link_buffer: int = 0  # bytes; 0: the entity's max message size + ENVELOPE
    connection_buffer: int = 16 * MIB  # raised to the largest link ceiling when below it
    process_buffer: int = 32 * MIB  # raised to connection_buffer when below it
    cbs_request: int = 64 * KIB  # a put-token is a few KB
    links_per_connection: int = 5000
    connections: int = 10_000  # authenticated, per process; 0: no cap
    auth_timeout_s: float = 30.0  # 0: never close an unauthenticated connection
    handshake_timeout_s: float = 10.0  # accept to AMQP open; 0: no deadline
    unauthenticated: int = 1000  # per process; 0: no cap
    unauthenticated_per_address: int = 100  # 0: no cap

    def problem(self) -> str | None:
        """What is wrong with these values, in one line; None when they are fine."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                return f"{f.name.replace('_', ' ')} must be a number >= 0, got {value!r}"
        if self.cbs_request < 4 * KIB:
            return f"cbs request limit must be at least 4096 bytes, got {self.cbs_request}"
        if self.links_per_connection < 1:
            return "links per connection must be at least 1"
        return None

    def link_ceiling(self, max_message_size: int) -> int:
        """Bytes one link may buffer of an unfinished transfer to an entity."""
        ceiling = max_message_size + ENVELOPE
        return min(ceiling, self.link_buffer) if self.link_buffer else ceiling

    def effective(self, largest_message_size: int) -> Limits:
        """These limits with the buffers raised so that the largest message an entity
        accepts always fits in one link, one connection and the process."""
        link = self.link_ceiling(largest_message_size)
        connection = max(self.connection_buffer, link)
        return replace(
            self, connection_buffer=connection, process_buffer=max(self.process_buffer, connection)
        )


class Buffers:
    """Bytes of unfinished transfers held, in one scope (a connection, the process)."""

    def __init__(self, limit: int, parent: Buffers | None = None) -> None:
        self.limit = limit
        self.held = 0
        self.parent = parent

    def take(self, size: int) -> bool:
        """Hold `size` more bytes here and in every enclosing scope; False (holding nothing)
        when that would pass a limit."""
        scope: Buffers | None = self
        while scope is not None:
            if scope.held + size > scope.limit:
                return False
            scope = scope.parent
        scope = self
        while scope is not None:
            scope.held += size
            scope = scope.parent
        return True

    def give(self, size: int) -> None:
        scope: Buffers | None = self
        while scope is not None:
            scope.held -= size
            scope = scope.parent
