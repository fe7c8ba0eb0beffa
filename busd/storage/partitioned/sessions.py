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
from busd.storage.partitioned.routing import partition_of_key, stamped
from busd.storage.sessions import SessionDetail, SessionLock, SessionPage
from busd.storage.specs import QueueSpec


class PartitionedSessionCalls(PartitionedBase):
    # --- sessions ----------------------------------------------------------------------------
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
        if not queue.partitions:
            return await self.inner.accept_session(
                queue,
                session_id,
                holder,
                wait=wait,
                count=count,
                mode=mode,
                tokens=tokens,
                client=client,
                waiting=waiting,
                release=release,
                waiter=waiter,
            )
        if release is not None:  # its partition is not the accept's: a call of its own first
            await self.release_session(queue, *release)
        if session_id is not None:
            part = self.part_of_session(queue, session_id)
            return await self.inner.accept_session(
                part,
                session_id,
                holder,
                count=count,
                mode=mode,
                tokens=stamped(tokens, part.partition or 0, 0, count),
                client=client,
            )
        return await self._accept_next(
            queue, holder, wait=wait, count=count, mode=mode, tokens=tokens, client=client
        )

    async def _accept_next(
        self,
        queue: QueueSpec,
        holder: str,
        *,
        wait: bool,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        client: str,
    ) -> SessionLock | None:
        """The next available session of a partitioned queue: looked for in the partitions in
        turn, first the one this acceptor was woken for, skipping those where this process
        waits already; with `wait`, this process's waiter is registered in each it found empty
        (busd/storage/partitioned/waits.py)."""
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
                        wait=wait,
                        count=count,
                        mode=mode,
                        tokens=stamped(tokens, p, 0, count),
                        client=client,
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

    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
    ) -> list[StoredMessage]:
        if not queue.partitions:
            return await self.inner.receive_session(queue, session_id, holder, count, mode, tokens)
        p = partition_of_key(session_id, queue.partitions)
        tokens = stamped(tokens, p, 0, count)
        return list(
            await self.inner.receive_session_part(
                queue, self.parts(queue), p, session_id, holder, count, mode, tokens
            )
        )

    def _session_part(self, queue: QueueSpec, session_id: str) -> QueueSpec:
        return self.part_of_session(queue, session_id) if queue.partitions else queue

    async def renew_session_lock(self, queue: QueueSpec, session_id: str, holder: str) -> int:
        return int(
            await self.inner.renew_session_lock(
                self._session_part(queue, session_id), session_id, holder
            )
        )

    async def release_session(self, queue: QueueSpec, session_id: str, holder: str) -> None:
        await self.inner.release_session(self._session_part(queue, session_id), session_id, holder)

    async def release_process_locks(self, queue: QueueSpec, id_prefix: str) -> int:
        if not queue.partitions:
            return int(await self.inner.release_process_locks(queue, id_prefix))
        parts = self.parts(queue)
        counts = await asyncio.gather(
            *(self.inner.release_process_locks(p, id_prefix) for p in parts)
        )
        return sum(counts)

    async def release_process_message_locks(self, queue: QueueSpec, tag: bytes) -> int:
        if not queue.partitions:
            return int(await self.inner.release_process_message_locks(queue, tag))
        counts = await asyncio.gather(
            *(self.inner.release_process_message_locks(p, tag) for p in self.parts(queue))
        )
        return sum(counts)

    async def get_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> bytes | None:
        return await self.inner.get_session_state(
            self._session_part(queue, session_id), session_id, holder
        )

    async def read_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> tuple[bytes | None, str | None]:
        state, etag = await self.inner.read_session_state(
            self._session_part(queue, session_id), session_id, holder
        )
        return state, etag

    async def set_session_state(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        state: bytes | None,
        *,
        if_match: str | None = None,
        if_absent: bool = False,
    ) -> str | None:
        return await self.inner.set_session_state(
            self._session_part(queue, session_id),
            session_id,
            holder,
            state,
            if_match=if_match,
            if_absent=if_absent,
        )

    async def dead_letter_session(
        self, queue: QueueSpec, session_id: str, reason: str, description: str | None
    ) -> int:
        return int(
            await self.inner.dead_letter_session(
                self._session_part(queue, session_id), session_id, reason, description
            )
        )

    async def resubmit_session(self, queue: QueueSpec, session_id: str) -> tuple[int, int]:
        moved, left = await self.inner.resubmit_session(
            self._session_part(queue, session_id), session_id
        )
        return moved, left

    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        if not queue.partitions:
            return list(await self.inner.list_sessions(queue, skip, top, updated_after_ms))
        # Each partition's first skip + top, merged in id order: a stable order for paging.
        pages = await asyncio.gather(
            *(
                self.inner.list_sessions(p, 0, skip + top, updated_after_ms)
                for p in self.parts(queue)
            )
        )
        return sorted(itertools.chain.from_iterable(pages))[skip : skip + top]

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
        if not queue.partitions:
            return await self.inner.session_page(queue, sort, after, top, preview)
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

    async def drop_session_lock(self, queue: QueueSpec, session_id: str) -> bool:
        return bool(
            await self.inner.drop_session_lock(self._session_part(queue, session_id), session_id)
        )

    async def lose_session_lock(self, queue: QueueSpec, session_id: str) -> bool:
        return bool(
            await self.inner.lose_session_lock(self._session_part(queue, session_id), session_id)
        )

    # --- waiters -----------------------------------------------------------------------------
    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        if not queue.partitions:
            return bool(await self.inner.stop_waiting(queue, waiters, waiter))
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
