"""The store calls one process runs at once (docs/design.md §3.4): a bound on the calls in
flight, so that the connections under them are never exhausted, and a wait in order for the
others."""

from __future__ import annotations

import asyncio
from collections import deque

from busd.errors import BusdError, Condition

# How long a call waits for its turn before the client is told the server is busy.
CALL_WAIT_S = 30.0


class CallLimiter:
    """The store calls one process runs at once: at most `limit`; the others wait in order, each
    for `wait_s` at most, then are told the server is busy. One timer serves every waiter
    (a time-out each would cost more than the wait, and waits are common under load)."""

    def __init__(self, limit: int, wait_s: float = CALL_WAIT_S) -> None:
        self._free = limit
        self._wait_s = wait_s
        self._waiting: deque[tuple[asyncio.Future[None], float]] = deque()  # (turn, deadline)
        self._timer: asyncio.TimerHandle | None = None

    def locked(self) -> bool:
        return self._free == 0

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append((turn, loop.time() + self._wait_s))
        if self._timer is None:
            self._timer = loop.call_later(self._wait_s, self._expire)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given a turn, then cancelled
                self.release()
            raise

    def release(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()[0]
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._waiting:
            turn, deadline = self._waiting[0]
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            self._waiting.popleft()
            if not turn.done():
                turn.set_exception(
                    BusdError(Condition.SERVER_BUSY, "The store is busy; try again.")
                )
