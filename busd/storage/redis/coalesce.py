"""Store calls of one kind on one entity, coalesced: what arrives while such a call is in flight
goes out together as the next one (docs/design.md §3.19).

A receiver link settles one batch at a time, and many links settle on one entity: one link
per held session, each settling one message as it finishes it. A call costs the server far
more than the work of one settlement in it (the function call, its clock, its counters, the
socket reads and writes: about 40 µs against 6), so under load the settlements of many links
are worth one call. Nothing waits to be coalesced: a call goes out at once when none of its
lane is in flight, and what arrives meanwhile waits only for that one to return, as it would
behind a busy server anyway. Order holds: a lane's items go out in the order they came, each
caller's together, and a caller gets its own results, or the call's exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

# The most items one coalesced call carries (whole callers: one caller's may exceed it), so
# that a burst does not make one script call long enough to hold up everything else.
MAX_ITEMS = 512

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Lane(Generic[Item, Result]):
    __slots__ = ("pending", "task")

    def __init__(self) -> None:
        # what arrived while the call in flight runs: each caller's items and its future
        self.pending: list[tuple[list[Item], asyncio.Future[list[Result]]]] = []
        # the task draining the lane: held here, as the event loop holds its tasks weakly
        self.task: asyncio.Task[None] | None = None


class Coalescer(Generic[Item, Result]):
    """Lanes of calls, one in flight per lane (a key: the entity and the call's kind)."""

    def __init__(self) -> None:
        self._lanes: dict[Hashable, _Lane[Item, Result]] = {}

    async def call(
        self,
        lane_key: Hashable,
        items: list[Item],
        run: Callable[[list[Item]], Awaitable[list[Result]]],
    ) -> list[Result]:
        """`run(items)`, one result per item, made with whatever else this lane is given while
        a call of it is in flight. `run` is the caller's own when the lane is idle; else the
        one that drains the lane makes the call (the same for every caller of a lane)."""
        lane = self._lanes.get(lane_key)
        if lane is None:
            lane = self._lanes[lane_key] = _Lane()
            try:
                return await run(items)
            finally:
                if lane.pending:
                    lane.task = asyncio.ensure_future(self._drain(lane_key, lane, run))
                else:
                    del self._lanes[lane_key]
        future: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        lane.pending.append((items, future))
        return await future

    async def _drain(
        self,
        lane_key: Hashable,
        lane: _Lane[Item, Result],
        run: Callable[[list[Item]], Awaitable[list[Result]]],
    ) -> None:
        try:
            while lane.pending:
                # whole callers, in order, up to MAX_ITEMS (at least one caller)
                taken, size = 0, 0
                for items, _ in lane.pending:
                    if taken and size + len(items) > MAX_ITEMS:
                        break
                    taken, size = taken + 1, size + len(items)
                batch, lane.pending = lane.pending[:taken], lane.pending[taken:]
                merged = [item for items, _ in batch for item in items]
                try:
                    results = await run(merged)
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                at = 0
                for items, future in batch:
                    if not future.done():  # its caller may have been cancelled
                        future.set_result(results[at : at + len(items)])
                    at += len(items)
        finally:
            for _, future in lane.pending:  # only when cancelled: nothing is left waiting
                if not future.done():
                    future.cancel()
            del self._lanes[lane_key]
