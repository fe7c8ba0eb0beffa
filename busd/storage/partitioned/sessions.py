"""The partitioned store's session calls: a named session is in the partition of its id; the
next available one is looked for in the partitions in turn by this process's waiters
(busd/storage/partitioned/waits.py); listings and the inspector's pages merge the partitions'
(docs/design.md §3.18)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from busd.storage.messages import Received, ReceiveMode
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
        for in the partitions in turn (busd/storage/partitioned/waits.py `look_in_turn`)."""
        if release is not None:  # its partition is not the accept's: a call of its own first
            await self.inner.release_session(self.part_of_session(queue, release[0]), *release)
        asked = dict(count=count, mode=mode, client=client)
        if session_id is not None:
            part = self.part_of_session(queue, session_id)
            given = stamped(tokens, part.partition or 0, 0, count)
            return await self.inner.accept_session(part, session_id, holder, **asked, tokens=given)
        asked.update(wait=wait, waiting=False)
        lock: SessionLock | None = None

        async def look(part: QueueSpec, p: int, waiter_id: str | None) -> bool:
            nonlocal lock
            lock = await self.inner.accept_session(
                part, None, holder, **asked, tokens=stamped(tokens, p, 0, count), waiter=waiter_id
            )
            return lock is not None

        await self._waits.look_in_turn(queue, "s", holder, self.rotation, look, wait=wait)
        return lock

    @partitioned
    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        *,
        stand: bool = False,
        replace: bool = False,
        recover: bool = False,
    ) -> Received:
        parts = self.parts(queue)
        p = partition_of_key(session_id, len(parts))
        asked = (session_id, holder, count, mode, stamped(tokens, p, 0, count))
        flags = {"stand": stand, "replace": replace, "recover": recover}
        return await self.inner.receive_session_part(queue, parts, p, *asked, **flags)

    @partitioned
    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        # Each partition's first skip + top, merged in id order: a stable order for paging.
        pages = await self.each(
            queue, lambda part: self.inner.list_sessions(part, 0, skip + top, updated_after_ms)
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
        pages = await self.each(
            queue, lambda part: self.inner.session_page(part, sort, after, top, preview)
        )
        merged = sorted((d for page in pages for d in page.sessions), key=_page_order(sort))
        more = len(merged) > top or any(page.next for page in pages)
        merged = merged[:top]
        cursor = merged[-1].cursor if more and merged else None
        return SessionPage(merged, cursor, sum(page.total for page in pages))

    # --- waiters -----------------------------------------------------------------------------
    @partitioned
    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        left = self._waits.stop(queue.name, waiter, waiters)  # this process's waiters' own
        if left is not None:
            return left
        return any(await self.each(queue, lambda p: self.inner.stop_waiting(p, waiters, waiter)))


def _page_order(sort: str) -> Callable[[SessionDetail], tuple]:
    """The order of the inspector's `sort` index, from a page's sessions (their cursor holds
    the index's score)."""
    if sort == "id":
        return lambda d: (d.cursor.encode(),)
    return lambda d: (float(d.cursor.split(":", 1)[0]), d.cursor.split(":", 1)[1].encode())
