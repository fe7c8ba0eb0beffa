"""The partitioned store's session calls: a named session is in the partition of its id; the
next available one is looked for in the partitions in turn, and a process whose acceptors
wait is registered as one waiter in each partition it found empty
(busd/storage/partitioned/waits.py); listings and the inspector's pages merge the partitions'
(docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

from busd.storage.messages import ReceiveMode, StoredMessage
from busd.storage.partitioned.base import PartitionedBase
from busd.storage.partitioned.routes import partitioned
from busd.storage.partitioned.routing import partition_of_key, stamped
from busd.storage.sessions import SessionDetail, SessionLock, SessionPage
from busd.storage.specs import QueueSpec


class PartitionedSessionCalls(PartitionedBase):
    # --- sessions ----------------------------------------------------------------------------
    @partitioned
    async def accept_session(
        self,
        queue: QueueSpec,
        session_id: str | None,
        holder: str,
        *,
        wait: bool = False,
        count: int = 0,
        mode: ReceiveMode = ReceiveMode.PEEK_LOCK,
        tokens: Sequence[bytes] = (),
        client: str = "",
        waiting: bool = True,
        release: tuple[str, str] | None = None,
        waiter: str | None = None,
    ) -> SessionLock | None:
        """A named session is in the partition of its id; the next available one is looked
        for in the partitions in turn, first the one this acceptor was woken for, skipping
        those where this process waits already; with `wait`, this process's waiter is
        registered in each it found empty (busd/storage/partitioned/waits.py)."""
        if release is not None:  # its partition is not the accept's: a call of its own first
            await self.inner.release_session(self.part_of_session(queue, release[0]), *release)
        asked = dict(count=count, mode=mode, client=client)
        if session_id is not None:
            part = self.part_of_session(queue, session_id)
            given = stamped(tokens, part.partition or 0, 0, count)
            return await self.inner.accept_session(part, session_id, holder, **asked, tokens=given)
        waits = self._waits.of(queue.name)
        self._waits_specs["s" + queue.name] = queue
        first = self._waits.begin(waits, holder)
        lock: SessionLock | None = None
        woken_for: int | None = None
        try:
            while True:
                for part, p in self._to_look(queue, waits, first):
                    wakes = self._waits.wakes_of(waits, p)
                    lock = await self.inner.accept_session(
                        part,
                        None,
                        holder,
                        **asked,
                        wait=wait,
                        tokens=stamped(tokens, p, 0, count),
                        waiting=False,
                        waiter=self._waits.waiter_id(waits, p) if wait else None,
                    )
                    if lock is not None:
                        woken_for = p if p == first else None
                        return lock
                    if wait:
                        self._waits.registered(waits, p, wakes)
                if not wait or (first := self._waits.next_pending(waits)) is None:
                    return None
        finally:
            self._waits.end(waits, holder, found=lock is not None, woken_for=woken_for, wait=wait)

    @partitioned
    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
    ) -> list[StoredMessage]:
        parts = self.parts(queue)
        p = partition_of_key(session_id, len(parts))
        tokens = stamped(tokens, p, 0, count)
        return list(
            await self.inner.receive_session_part(
                queue, parts, p, session_id, holder, count, mode, tokens
            )
        )

    @partitioned
    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        # Each partition's first skip + top, merged in id order: a stable order for paging.
        pages = await asyncio.gather(
            *(
                self.inner.list_sessions(p, 0, skip + top, updated_after_ms)
                for p in self.parts(queue)
            )
        )
        return sorted(itertools.chain.from_iterable(pages))[skip : skip + top]

    @partitioned
    async def session_page(
        self,
        queue: QueueSpec,
        sort: str,
        after: str | None,
        top: int,
        preview: int = 32,
    ) -> SessionPage:
        """A partitioned entity's page merges its partitions' pages after the same cursor, in
        the sort's order (the cursor carries the last session's id, or its score and id)."""
        pages = await asyncio.gather(
            *(self.inner.session_page(p, sort, after, top, preview) for p in self.parts(queue))
        )
        merged = sorted((d for page in pages for d in page.sessions), key=_page_order(sort))
        more = len(merged) > top or any(page.next for page in pages)
        merged = merged[:top]
        return SessionPage(
            merged,
            merged[-1].cursor if more and merged else None,
            sum(page.total for page in pages),
        )

    # --- waiters -----------------------------------------------------------------------------
    @partitioned
    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        if waiters == "s":  # this process waits for its acceptors (partition_waits.py)
            return self._waits.leave(queue.name, waiter)
        if self._waits.knows(queue.name, waiter, waiters):  # and for its receivers
            return self._waits.leave(queue.name, waiter, waiters)
        answers = await asyncio.gather(
            *(self.inner.stop_waiting(p, waiters, waiter) for p in self.parts(queue))
        )
        return any(answers)


def _page_order(sort: str) -> Callable[[SessionDetail], tuple]:
    """The order of the inspector's `sort` index, from a page's sessions (their cursor holds
    the index's score)."""
    if sort == "id":
        return lambda d: (d.cursor.encode(),)
    return lambda d: (float(d.cursor.split(":", 1)[0]), d.cursor.split(":", 1)[1].encode())
