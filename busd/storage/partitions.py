"""Partitioned entities: one entity to the broker, several queues to the scripts
(docs/design.md §3.18).

`PartitionedStore` wraps a Store and is one itself: it implements every method of the protocol
(busd.storage.api.Store; `wrap` is typed so that mypy checks it), forwarding nothing unseen. A
call on an entity without partitions goes straight to the inner store.
A partitioned entity is P ordinary queues, each under a hash tag of its own (busd.storage.keys
`partition_scope`), so a Redis Cluster spreads them over its shards; this module routes each
call to the partitions it concerns:

- a message goes to the partition of its session id, else of its partition key
  (`x-opt-partition-key`), else of its message id, else to the next partition in turn: a
  session lives in one partition, which keeps its order and its lock;
- a sequence number carries its partition in its top 16 bits (each partition's counter
  starts at `partition << 48`, `start_sequence`), so a fetch by number, a cancel and a peek
  from a number find their partition without a lookup;
- a lock token carries its partition in its last byte (stamped when it is handed out), so a
  settlement or a renewal by token finds its partition too;
- receiving and accepting the next available session try the partitions in turn, from a
  rotating first one, each O(log n) as on an unpartitioned queue; counts, peeks and session
  lists are the partitions' together.

An acceptor that found no session is registered as a waiter in every partition it tried (in
the same step as each try: lua/acceptSession.lua), so a session that becomes free in any of
them wakes it; once it holds a session it leaves the other partitions' waiters, passing on a
wake-up it may have been sent meanwhile (lua/stopWaiting.lua), so none is lost.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from busd.errors import Condition
from busd.storage.api import CatalogCallback, Store, WakeCallback
from busd.storage.counts import EntityCounts, SweepResult
from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult
from busd.storage.keys import FIRST_LAYOUT
from busd.storage.messages import (
    HandOver,
    LockTokens,
    NewMessage,
    Placement,
    ReceiveMode,
    Sent,
    Settlement,
    StoredMessage,
)
from busd.storage.sessions import SessionDetail, SessionLock, SessionPage
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import (
    StagedCancel,
    StagedOperation,
    StagedPublish,
    StagedSend,
    StagedSessionState,
    StagedSettlement,
)

PARTITION_SHIFT = 48  # a sequence number's partition: its top 16 bits (of 64)
T = TypeVar("T")


def partition_of_key(key: str, partitions: int) -> int:
    """The partition of a session id or partition key: the same in every process."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def partition_of_seq(seq: int, partitions: int) -> int:
    return (seq >> PARTITION_SHIFT) % partitions


def partition_of_token(token: bytes, partitions: int) -> int:
    return token[15] % partitions if len(token) == 16 else 0


def first_seq(partition: int) -> int:
    """What a partition's counter starts at: its numbers are `partition << 48` + 1, + 2, ..."""
    return partition << PARTITION_SHIFT


def message_key(message: NewMessage) -> str | None:
    """What places a message: its session id, else partition key, else message id."""
    if message.session_id is not None:
        return message.session_id
    return message.partition_key if message.partition_key is not None else message.message_id


def operation_partition(op: StagedOperation, partitions: int, current: int | None) -> int:
    """The partition a transaction's operation on a partitioned queue works in. A send
    without session id or partition key goes to the transaction's partition (`current`, once
    it has one), as in Service Bus: a transaction stays in one partition."""
    if isinstance(op, StagedSettlement):
        return partition_of_token(op.settlement.token, partitions)
    if isinstance(op, StagedSessionState):
        return partition_of_key(op.session_id, partitions)
    if isinstance(op, (StagedCancel, StagedSend)) and op.seq is not None:
        return partition_of_seq(op.seq, partitions)
    if isinstance(op, StagedPublish) and op.seq is not None:
        return partition_of_seq(op.seq, partitions)
    if isinstance(op, (StagedSend, StagedPublish)):
        m = op.message
        key = m.session_id if m.session_id is not None else m.partition_key
        if key is not None:
            return partition_of_key(key, partitions)
        if current is not None:
            return current
        return partition_of_key(m.message_id, partitions) if m.message_id is not None else 0
    return current or 0


def stamped(tokens: Sequence[bytes], partition: int, start: int, count: int) -> LockTokens:
    """`count` of the tokens from `start`, each with the partition in its last byte."""
    if type(tokens) is LockTokens:
        raw = bytearray(tokens.packed[16 * start : 16 * (start + count)])
    else:
        raw = bytearray(b"".join(tokens[start : start + count]))
    raw[15::16] = bytes((partition,)) * (len(raw) // 16)
    out = LockTokens(0)
    out.packed = bytes(raw)
    return out


class PartitionedStore:
    """A Store whose partitioned entities are spread over partitions (module docstring)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        # fixed when the inner store is made (its URL and its process's id)
        self.process_id: str = inner.process_id
        self.cross_slot_transactions: bool = inner.cross_slot_transactions
        self._parts: dict[QueueSpec, tuple[QueueSpec, ...]] = {}
        self._topic_parts: dict[TopicSpec, tuple[TopicSpec, ...]] = {}
        self._turn = itertools.count()
        # next-available acceptors (holder ids) -> partitions where they may be registered
        self._session_waits: dict[str, set[int]] = {}

    # --- lifecycle: the inner store's --------------------------------------------------------
    async def connect(self) -> None:
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> bool:
        return bool(await self.inner.ping())

    async def shards(self, entities: Sequence[QueueSpec | TopicSpec]) -> list[list[str]]:
        # the inner store places each partition of a partitioned handle itself
        return [list(where) for where in await self.inner.shards(entities)]

    # --- partitions ---------------------------------------------------------------------------
    def parts(self, spec: QueueSpec) -> tuple[QueueSpec, ...]:
        parts = self._parts.get(spec)
        if parts is None:
            if len(self._parts) > 10_000:  # entities changed a lot: start over
                self._parts.clear()
            parts = self._parts[spec] = spec.partition_specs
        return parts

    def topic_parts(self, topic: TopicSpec) -> tuple[TopicSpec, ...]:
        parts = self._topic_parts.get(topic)
        if parts is None:
            if len(self._topic_parts) > 10_000:
                self._topic_parts.clear()
            parts = self._topic_parts[topic] = topic.partition_specs
        return parts

    def part_of_session(self, spec: QueueSpec, session_id: str) -> QueueSpec:
        parts = self.parts(spec)
        return parts[partition_of_key(session_id, len(parts))]

    def part_of_message(self, spec: QueueSpec | TopicSpec, message: NewMessage) -> int:
        assert spec.partitions
        key = message_key(message)
        if key is None:
            return next(self._turn) % spec.partitions
        return partition_of_key(key, spec.partitions)

    def _rotation(self, spec: QueueSpec) -> list[QueueSpec]:
        parts = self.parts(spec)
        first = next(self._turn) % len(parts)
        return list(parts[first:] + parts[:first])

    async def _by_partition(
        self,
        spec: QueueSpec,
        items: Sequence[T],
        partition_of: Callable[[T], int],
        call: Callable[[QueueSpec, list[T]], Awaitable[list[Any]]],
    ) -> list[Any]:
        """call(partition, its items) for each partition the items fall in, at once; the
        answers, one per item, in the items' order."""
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(partition_of(item), []).append(i)
        parts = self.parts(spec)
        if len(groups) == 1:
            ((p, _),) = groups.items()
            return await call(parts[p], list(items))
        answers = await asyncio.gather(
            *(call(parts[p], [items[i] for i in idx]) for p, idx in groups.items())
        )
        out: list[Any] = [None] * len(items)
        for idx, answer in zip(groups.values(), answers):
            for i, value in zip(idx, answer):
                out[i] = value
        return out

    # --- the catalog -------------------------------------------------------------------------
    async def catalog_put(
        self, kind: str, path: str, record: dict, *, only_new: bool = False
    ) -> bool:
        partitions = record.get("partitions")
        if partitions and kind in ("queue", "topic"):
            # before the record: no message may be numbered from a counter not yet started
            layout = record.get("partition_layout", FIRST_LAYOUT)  # busd.entities.from_record
            spec = (
                QueueSpec(name=path, partitions=partitions, partition_layout=layout)
                if kind == "queue"
                else TopicSpec(name=path, partitions=partitions, partition_layout=layout)
            )
            await asyncio.gather(
                *(
                    self.inner.start_sequence(part, first_seq(part.partition or 0))
                    for part in spec.partition_specs[1:]
                )
            )
        return bool(await self.inner.catalog_put(kind, path, record, only_new=only_new))

    async def catalog_all(self) -> dict[str, dict]:
        return dict(await self.inner.catalog_all())

    async def catalog_get(self, kind: str, path: str) -> dict | None:
        return await self.inner.catalog_get(kind, path)

    async def catalog_delete(self, items: list[tuple[str, str]]) -> int:
        return int(await self.inner.catalog_delete(items))

    async def catalog_subscribe(self, on_change: CatalogCallback) -> None:
        await self.inner.catalog_subscribe(on_change)

    async def fault_hit(self, fault_id: str) -> int:
        return int(await self.inner.fault_hit(fault_id))

    async def fault_forget(self, fault_id: str) -> None:
        await self.inner.fault_forget(fault_id)

    async def namespace_add(self, name: str) -> None:
        await self.inner.namespace_add(name)

    async def namespace_known(self, name: str) -> bool:
        return bool(await self.inner.namespace_known(name))

    async def subscribe(self, on_wake: WakeCallback) -> None:
        await self.inner.subscribe(on_wake)

    async def open_subscriptions(self, topic: TopicSpec | str, subscriptions: list[str]) -> None:
        if isinstance(topic, str) or not topic.partitions:
            return await self.inner.open_subscriptions(topic, subscriptions)
        # live in every partition: a partition p of the topic fans out to partition p of each
        await asyncio.gather(
            *(self.inner.open_subscriptions(t, subscriptions) for t in self.topic_parts(topic))
        )

    async def drop_subscriptions(
        self, topic: TopicSpec | str, subscriptions: list[QueueSpec], *, with_topic: bool = False
    ) -> int:
        if isinstance(topic, str) or not topic.partitions:
            return int(
                await self.inner.drop_subscriptions(topic, subscriptions, with_topic=with_topic)
            )
        sparts = [self.parts(s) for s in subscriptions]
        dropped = await asyncio.gather(
            *(
                self.inner.drop_subscriptions(t, [s[p] for s in sparts], with_topic=with_topic)
                for p, t in enumerate(self.topic_parts(topic))
            )
        )
        return sum(dropped)

    async def drop_queue(self, queue: QueueSpec) -> int:
        if not queue.partitions:
            return int(await self.inner.drop_queue(queue))
        return sum(await asyncio.gather(*(self.inner.drop_queue(p) for p in self.parts(queue))))

    # --- send --------------------------------------------------------------------------------
    async def send(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        if not queue.partitions:
            return await self.inner.send(queue, messages)
        # A batch spanning partitions is stored per partition, each part all or none.
        return await self._by_partition(
            queue, messages, lambda m: self.part_of_message(queue, m), self.inner.send
        )

    async def send_handing_over(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> Sent:
        if not queue.partitions:
            return await self.inner.send_handing_over(queue, messages, offers)
        # A partitioned queue takes no offers: its sessions' holders are woken as usual.
        return Sent(await self.send(queue, messages), [[] for _ in offers])

    async def schedule(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        return await self.send(queue, messages)

    async def publish(
        self,
        topic: TopicSpec,
        subscriptions: list[QueueSpec],
        messages: list[NewMessage],
        placements: list[list[Placement]] | None = None,
    ) -> list[int]:
        if not topic.partitions:
            return await self.inner.publish(topic, subscriptions, messages, placements)
        # A partitioned topic's partition p holds partition p of each of its subscriptions.
        groups: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            groups.setdefault(self.part_of_message(topic, m), []).append(i)
        tparts = self.topic_parts(topic)
        sparts = [self.parts(s) for s in subscriptions]

        async def publish(p: int, idx: list[int]) -> list[int]:
            return list(
                await self.inner.publish(
                    tparts[p],
                    [s[p] for s in sparts],
                    [messages[i] for i in idx],
                    None if placements is None else [placements[i] for i in idx],
                )
            )

        answers = await asyncio.gather(*(publish(p, idx) for p, idx in groups.items()))
        out = [0] * len(messages)
        for idx, answer in zip(groups.values(), answers):
            for i, seq in zip(idx, answer):
                out[i] = seq
        return out

    async def cancel_topic_scheduled(
        self, topic: TopicSpec, subscriptions: list[QueueSpec], seqs: list[int]
    ) -> None:
        if not topic.partitions:
            return await self.inner.cancel_topic_scheduled(topic, subscriptions, seqs)
        groups: dict[int, list[int]] = {}
        for seq in seqs:
            groups.setdefault(partition_of_seq(seq, topic.partitions), []).append(seq)
        tparts = self.topic_parts(topic)
        for p, group in groups.items():
            await self.inner.cancel_topic_scheduled(
                tparts[p], [self.parts(s)[p] for s in subscriptions], group
            )

    async def topic_totals(self, topic: TopicSpec) -> dict[str, int]:
        if not topic.partitions:
            return dict(await self.inner.topic_totals(topic))
        total: dict[str, int] = {}
        for totals in await asyncio.gather(
            *(self.inner.topic_totals(t) for t in self.topic_parts(topic))
        ):
            for name, n in totals.items():
                total[name] = total.get(name, 0) + n
        return total

    # --- receive -----------------------------------------------------------------------------
    async def receive(
        self,
        entity: QueueSpec,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        waiter: str | None = None,
    ) -> list[StoredMessage]:
        if not entity.partitions:
            return await self.inner.receive(entity, count, mode, tokens, waiter)
        out: list[StoredMessage] = []
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        for part in self._rotation(entity):
            want = count - len(out)
            if want <= 0:
                break
            given = stamped(tokens, part.partition or 0, len(out), want) if peek_lock else ()
            out += await self.inner.receive(part, want, mode, given, waiter)
        return out

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
        waits = self._session_waits.setdefault(holder, set()) if wait else set()
        for part in self._rotation(queue):
            p = part.partition or 0
            lock = await self.inner.accept_session(
                part,
                None,
                holder,
                wait=wait,
                count=count,
                mode=mode,
                tokens=stamped(tokens, p, 0, count),
                client=client,
                waiting=waiting and p in waits,
            )
            if lock is not None:
                waits.discard(p)  # the script took us off this partition's waiters
                await self.stop_waiting(queue, "s", holder)
                return lock
            if wait:
                waits.add(p)
        return None

    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
    ) -> list[StoredMessage]:
        if queue.partitions:
            queue = self.part_of_session(queue, session_id)
            tokens = stamped(tokens, queue.partition or 0, 0, count)
        return await self.inner.receive_session(queue, session_id, holder, count, mode, tokens)

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

    async def settle(
        self, entity: QueueSpec, settlements: list[Settlement], holder: str | None = None
    ) -> list[Condition | None]:
        if not entity.partitions:
            return await self.inner.settle(entity, settlements, holder)
        count = entity.partitions
        return await self._by_partition(
            entity,
            settlements,
            lambda s: partition_of_token(s.token, count),
            lambda part, items: self.inner.settle(part, items, holder),
        )

    async def renew_message_locks(
        self, entity: QueueSpec, tokens: list[bytes], until_ms: int | None = None
    ) -> list[int]:
        if not entity.partitions:
            return await self.inner.renew_message_locks(entity, tokens, until_ms)
        count = entity.partitions
        return await self._by_partition(
            entity,
            tokens,
            lambda t: partition_of_token(t, count),
            lambda part, items: self.inner.renew_message_locks(part, items, until_ms),
        )

    # --- peek, deferral, scheduling ----------------------------------------------------------
    async def peek(
        self, entity: QueueSpec, from_seq: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        if not entity.partitions:
            return list(await self.inner.peek(entity, from_seq, count, session_id))
        if session_id is not None:
            part = self.part_of_session(entity, session_id)
            return list(
                await self.inner.peek(
                    part, max(from_seq, first_seq(part.partition or 0)), count, session_id
                )
            )
        # In sequence-number order, which is partition by partition: a peek continued from
        # the last number seen + 1 goes on where this one stopped.
        out: list[StoredMessage] = []
        for part in self.parts(entity)[max(from_seq, 0) >> PARTITION_SHIFT :]:
            if len(out) >= count:
                break
            start = max(from_seq, first_seq(part.partition or 0))
            out += await self.inner.peek(part, start, count - len(out))
        return out

    async def receive_deferred(
        self,
        entity: QueueSpec,
        seqs: list[int],
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        session_id: str | None = None,
        holder: str | None = None,
    ) -> list[StoredMessage]:
        if not entity.partitions:
            return list(
                await self.inner.receive_deferred(entity, seqs, mode, tokens, session_id, holder)
            )
        count = entity.partitions
        out: list[StoredMessage] = []
        groups: dict[int, list[int]] = {}
        for seq in seqs:
            groups.setdefault(partition_of_seq(seq, count), []).append(seq)
        parts = self.parts(entity)
        for p, group in groups.items():
            given = (
                stamped(tokens, p, len(out), len(group)) if mode == ReceiveMode.PEEK_LOCK else ()
            )
            out += await self.inner.receive_deferred(
                parts[p], group, mode, given, session_id, holder
            )
        return out

    async def cancel_scheduled(self, queue: QueueSpec, seqs: list[int]) -> None:
        if not queue.partitions:
            return await self.inner.cancel_scheduled(queue, seqs)
        count = queue.partitions

        async def cancel(part: QueueSpec, group: list[int]) -> list[None]:
            await self.inner.cancel_scheduled(part, group)
            return [None] * len(group)

        await self._by_partition(queue, seqs, lambda s: partition_of_seq(s, count), cancel)

    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        if not queue.partitions:
            return bool(await self.inner.stop_waiting(queue, waiters, waiter))
        parts = self.parts(queue)
        if waiters == "s":  # only where this acceptor registered
            chosen = [parts[p] for p in sorted(self._session_waits.pop(waiter, ()))]
        else:
            chosen = list(parts)
        answers = await asyncio.gather(
            *(self.inner.stop_waiting(p, waiters, waiter) for p in chosen)
        )
        return any(answers)

    # --- housekeeping ------------------------------------------------------------------------
    async def sweep(self, queue: QueueSpec) -> SweepResult:
        if not queue.partitions:
            return await self.inner.sweep(queue)
        results = await asyncio.gather(*(self.inner.sweep(p) for p in self.parts(queue)))
        total = SweepResult()
        for r in results:
            total.expired_message_locks += r.expired_message_locks
            total.expired_messages += r.expired_messages
            total.activated_scheduled += r.activated_scheduled
            total.expired_idle_sessions += r.expired_idle_sessions
            total.expired_session_locks += r.expired_session_locks
        return total

    async def purge(self, entity: QueueSpec) -> int:
        if not entity.partitions:
            return int(await self.inner.purge(entity))
        return sum(await asyncio.gather(*(self.inner.purge(p) for p in self.parts(entity))))

    async def resubmit_dead_letters(self, queue: QueueSpec, limit: int) -> int:
        if not queue.partitions:
            return int(await self.inner.resubmit_dead_letters(queue, limit))
        moved = 0
        for part in self.parts(queue):
            if moved >= limit:
                break
            moved += await self.inner.resubmit_dead_letters(part, limit - moved)
        return moved

    async def delete_messages(
        self, entity: QueueSpec, count: int, before_ms: int | None, session_id: str | None = None
    ) -> int:
        # Oldest first within each partition, partition after partition: the broker refuses a
        # batch delete on a partitioned entity, as Service Bus does (docs/wire.md §8.4.13).
        if not entity.partitions:
            return int(await self.inner.delete_messages(entity, count, before_ms, session_id))
        if session_id is not None:
            part = self.part_of_session(entity, session_id)
            return int(await self.inner.delete_messages(part, count, before_ms, session_id))
        deleted = 0
        for part in self.parts(entity):
            if deleted >= count:
                break
            deleted += await self.inner.delete_messages(part, count - deleted, before_ms)
        return deleted

    async def size_in_bytes(self, entity: QueueSpec) -> int:
        if not entity.partitions:
            return await self.inner.size_in_bytes(entity)
        sizes = await asyncio.gather(*(self.inner.size_in_bytes(p) for p in self.parts(entity)))
        return sum(sizes)

    async def counts(self, entity: QueueSpec) -> EntityCounts:
        if not entity.partitions:
            return await self.inner.counts(entity)
        total = EntityCounts()
        for c in await asyncio.gather(*(self.inner.counts(p) for p in self.parts(entity))):
            total.active += c.active
            total.locked += c.locked
            total.scheduled += c.scheduled
            total.deferred += c.deferred
            total.dead_letter += c.dead_letter
            total.sessions += c.sessions
            total.locked_sessions += c.locked_sessions
            total.free_sessions += c.free_sessions
            if c.oldest_enqueued_ms is not None:
                total.oldest_enqueued_ms = min(
                    total.oldest_enqueued_ms or c.oldest_enqueued_ms, c.oldest_enqueued_ms
                )
            for name, n in c.totals.items():
                total.totals[name] = total.totals.get(name, 0) + n
        return total

    # --- auto-forwarding: from a partitioned entity partition by partition, each under its
    # own lease; not to one (busd.broker.catalog refuses) ----------------------------------
    async def take_forwarding(
        self, entity: QueueSpec, forwarder: str, count: int, tokens: Sequence[bytes]
    ) -> list[StoredMessage] | None:
        if not entity.partitions:
            return await self.inner.take_forwarding(entity, forwarder, count, tokens)
        # A partition with nothing to take (or whose lease another forwarder holds) has the
        # forwarder registered among its waiters by the same call, as a receiver. Each look
        # starts at the next partition, so a busy one does not keep the others waiting.
        parts = self.parts(entity)
        start = next(self._turn) % len(parts)
        out: list[StoredMessage] = []
        for part in parts[start:] + parts[:start]:
            want = count - len(out)
            given = stamped(tokens, part.partition or 0, len(out), want)
            out.extend(await self.inner.take_forwarding(part, forwarder, want, given) or ())
            if len(out) >= count:
                break
        return out

    async def forward(
        self,
        entity: QueueSpec,
        destination: ForwardDestination,
        messages: list[ForwardedMessage],
        *,
        hop_limit: int,
    ) -> list[ForwardResult]:
        if not entity.partitions:
            return list(
                await self.inner.forward(entity, destination, messages, hop_limit=hop_limit)
            )
        parts = self.parts(entity)
        groups: dict[int, list[int]] = {}  # partition -> indexes of its messages
        for i, m in enumerate(messages):
            groups.setdefault(partition_of_token(m.token, len(parts)), []).append(i)
        results: list[ForwardResult] = [ForwardResult.LOCK_LOST] * len(messages)
        for p, indexes in groups.items():
            moved = await self.inner.forward(
                parts[p], destination, [messages[i] for i in indexes], hop_limit=hop_limit
            )
            for i, result in zip(indexes, moved, strict=True):
                results[i] = result
        return results

    # --- transactions: staged in one partition (busd.broker.staging picks it) ----------------
    async def sweep_transactions(self, queue: QueueSpec | TopicSpec) -> int:
        if not queue.partitions:
            return int(await self.inner.sweep_transactions(queue))
        parts = self.topic_parts(queue) if isinstance(queue, TopicSpec) else self.parts(queue)
        return sum(await asyncio.gather(*(self.inner.sweep_transactions(p) for p in parts)))

    async def reserve_sequence_numbers(self, queue: QueueSpec | TopicSpec, count: int) -> list[int]:
        # a partitioned entity's: its partition's (busd.broker.staging picks it)
        assert not queue.partitions
        return list(await self.inner.reserve_sequence_numbers(queue, count))

    async def stage_transaction(
        self,
        via: QueueSpec | TopicSpec,
        txn_id: bytes,
        operations: list[StagedOperation],
        *,
        first: bool,
        timeout_ms: int,
        limit: int,
    ) -> tuple[int, int]:
        return await self.inner.stage_transaction(
            via, txn_id, operations, first=first, timeout_ms=timeout_ms, limit=limit
        )

    async def commit_transaction(
        self,
        via: QueueSpec | TopicSpec,
        others: list[QueueSpec],
        txn_id: bytes,
        topics: Sequence[tuple[TopicSpec, list[QueueSpec]]] = (),
    ) -> None:
        # the broker hands partitions' handles here (busd.broker.transactions)
        await self.inner.commit_transaction(via, others, txn_id, topics)

    async def discard_transaction(self, via: QueueSpec | TopicSpec, txn_id: bytes) -> None:
        await self.inner.discard_transaction(via, txn_id)


def _page_order(sort: str) -> Callable[[SessionDetail], tuple]:
    """The order of the inspector's `sort` index, from a page's sessions (their cursor holds
    the index's score)."""
    if sort == "id":
        return lambda d: (d.cursor.encode(),)
    return lambda d: (float(d.cursor.split(":", 1)[0]), d.cursor.split(":", 1)[1].encode())


def wrap(store: Any) -> Store:
    """The store the broker uses: `store` with partitioned entities routed. A Store itself:
    mypy checks that it implements the whole protocol."""
    return PartitionedStore(store)
