"""Clients naming an entity that does not exist: logged at INFO, once per entity and client
connection, and at most `LINES_PER_MINUTE` lines a minute per process, so that a mistyped
queue name shows in busd's log (the SDK keeps the entity's name only in its inner exception
and retries for a while first; docs/design.md §2.10) while a client looping over unknown
names cannot flood it.

A connection is known by its open frame's container id, not its socket: the SDKs retry on a
new socket with the same container id, and those retries are the same mistake."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger("busd.broker")

LINES_PER_MINUTE = 30
# (container id, name) pairs remembered as logged, the oldest forgotten first
REMEMBERED = 4096


class UnknownEntityLog:
    """The process-wide allowance of log lines (a token bucket refilled over a minute)."""

    def __init__(
        self, per_minute: int = LINES_PER_MINUTE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.tokens = float(per_minute)
        self.last = clock()
        self.unlogged = 0  # lines held back since the last one logged
        self.seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def note(self, path: str, peer: str, container: str, how: str) -> None:
        """Log that the connection of `container` named `path` (`how`: at a put-token or an
        attach), unless its line for that name was logged already."""
        key = (container, path.lower())
        if key in self.seen:
            self.seen.move_to_end(key)
            return
        self.seen[key] = None
        if len(self.seen) > REMEMBERED:
            self.seen.popitem(last=False)
        now = self.clock()
        self.tokens = min(
            float(self.per_minute), self.tokens + (now - self.last) * self.per_minute / 60
        )
        self.last = now
        if self.tokens < 1:
            self.unlogged += 1
            return
        self.tokens -= 1
        held, self.unlogged = self.unlogged, 0
        log.info(
            "no entity %r: peer=%s container=%s named it (%s); the client is answered not found%s",
            path,
            peer,
            container,
            how,
            f" ({held} more such lines held back)" if held else "",
        )


UNKNOWN_ENTITIES = UnknownEntityLog()
