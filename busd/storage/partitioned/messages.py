"""The partitioned store's message calls: a send goes to its message's partition, a receive
tries the partitions in turn, a settlement, renewal, fetch or cancel finds its partition by
its token or sequence number, a peek or delete goes partition by partition
(docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from busd.errors import Condition
from busd.storage.messages import (
    HandOver,
    NewMessage,
    Outcome,
    Placement,
    ReceiveMode,
    Sent,
    Settlement,
    StoredMessage,
)
from busd.storage.partitioned.base import PartitionedBase
from busd.storage.partitioned.routing import (
    PARTITION_SHIFT,
    first_seq,
    partition_of_key,
    partition_of_seq,
    partition_of_token,
    stamped,
)
from busd.storage.specs import QueueSpec, TopicSpec


class PartitionedMessageCalls(PartitionedBase):
    # --- send --------------------------------------------------------------------------------
    async def send(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        if not queue.partitions:
            return await self.inner.send(queue, messages)
        # A batch spanning partitions is stored per partition, each part all or none, the
        # parts together: one store call per server (docs/design.md §3.18).
        groups: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            groups.setdefault(self.part_of_message(queue, m), []).append(i)
        parts = self.parts(queue)
        if len(groups) == 1:
            return await self.inner.send(parts[next(iter(groups))], messages)
        answers = await self.inner.send_handing_over_many(
            [(parts[p], [messages[i] for i in idx], ()) for p, idx in groups.items()]
        )
        seqs = [0] * len(messages)
        for idx, answer in zip(groups.values(), answers):
            if isinstance(answer, BaseException):  # its part failed; the others are stored
                raise answer
            for i, seq in zip(idx, answer.seqs):
                seqs[i] = seq
        return seqs

    async def send_handing_over(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> Sent:
        if not queue.partitions:
            return await self.inner.send_handing_over(queue, messages, offers)
        # A session's messages are all in its partition: each partition's send takes the
        # offers of the sessions it holds, their tokens stamped with it (settlements find it
        # there), and hands over as one server does (docs/design.md §3.5, §3.18).
        count = queue.partitions
        groups: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            groups.setdefault(self.part_of_message(queue, m), []).append(i)
        offered: dict[int, list[int]] = {}
        for j, o in enumerate(offers):
            p = partition_of_key(o.session_id, count)
            if p in groups:
                offered.setdefault(p, []).append(j)
        parts = self.parts(queue)
        # the partitions' sends together: one store call per server (docs/design.md §3.18)
        sends = [
            (
                parts[p],
                [messages[i] for i in idx],
                [
                    HandOver(
                        o.session_id, o.holder, o.count, stamped(o.tokens, p, 0, len(o.tokens))
                    )
                    for o in (offers[j] for j in offered.get(p, ()))
                ],
            )
            for p, idx in groups.items()
        ]
        try:
            answers: list[Sent | BaseException] = await self.inner.send_handing_over_many(sends)
        except Exception as exc:  # every partition's send failed
            answers = [exc] * len(sends)
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            await self._give_back_handed(queue, offers, offered, groups, answers)
            raise failed
        seqs = [0] * len(messages)
        handed: list[list[StoredMessage]] = [[] for _ in offers]
        for (p, idx), answer in zip(groups.items(), answers):
            assert isinstance(answer, Sent)
            for i, seq in zip(idx, answer.seqs):
                seqs[i] = seq
            for j, taken in zip(offered.get(p, ()), answer.handed):
                handed[j] = taken
        return Sent(seqs, handed)

    async def _give_back_handed(
        self,
        queue: QueueSpec,
        offers: Sequence[HandOver],
        offered: dict[int, list[int]],
        groups: dict[int, list[int]],
        answers: list[Sent | BaseException],
    ) -> None:
        """A send that failed in one partition fails as a whole (its caller hands nothing to
        the holders), so what the others handed over goes back: released (no count), its
        holder woken, ahead of its session's later messages as before. A release that fails
        too leaves them to the end of the session's lock."""
        parts = self.parts(queue)
        for p, answer in zip(groups, answers):
            if not isinstance(answer, Sent):
                continue
            for j, taken in zip(offered.get(p, ()), answer.handed):
                back = [
                    Settlement(
                        m.lock_token or b"", Outcome.RELEASE, session_id=offers[j].session_id
                    )
                    for m in taken
                ]
                if back:
                    try:
                        await self.inner.settle(parts[p], back)
                    except Exception:  # the end of the session's lock returns them
                        pass

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
        if waiter is not None:
            return await self._receive_waiting(entity, count, mode, tokens, waiter)
        out: list[StoredMessage] = []
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        for part in self._rotation(entity):
            want = count - len(out)
            if want <= 0:
                break
            given = stamped(tokens, part.partition or 0, len(out), want) if peek_lock else ()
            out += await self.inner.receive(part, want, mode, given)
        return out

    async def _receive_waiting(
        self,
        entity: QueueSpec,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        waiter: str,
    ) -> list[StoredMessage]:
        """A receiver's fetch: the partitions in turn, first the one it was woken for,
        skipping those where this process waits already, until `count`; this process's waiter
        is registered in each it found short of messages (busd/storage/partitioned/waits.py),
        and the receiver waits with it when the count was not met."""
        kind = "d" if entity.dlq else "q"
        waits = self._waits.of(entity.name, kind)
        self._waits_specs[kind + entity.name] = entity
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        first = self._waits.begin(waits, waiter)
        out: list[StoredMessage] = []
        filled: int | None = None  # a partition that had as many as asked: it may have more
        try:
            while True:
                for part, p in self._to_look(entity, waits, first):
                    want = count - len(out)
                    if want <= 0:
                        break
                    given = stamped(tokens, p, len(out), want) if peek_lock else ()
                    wakes = self._waits.wakes_of(waits, p)
                    got = await self.inner.receive(
                        part, want, mode, given, self._waits.waiter_id(waits, p)
                    )
                    out += got
                    if len(got) < want:
                        self._waits.registered(waits, p, wakes)
                    else:  # the call took the waiter off there (lua/receiveMessages.lua)
                        self._waits.unregistered(waits, p)
                        filled = p
                if len(out) >= count or (first := self._waits.next_pending(waits)) is None:
                    return out
        finally:
            self._waits.end(waits, waiter, found=len(out) >= count, woken_for=filled, wait=True)

    async def settle(
        self, entity: QueueSpec, settlements: list[Settlement], holder: str | None = None
    ) -> list[Condition | None]:
        if not entity.partitions:
            return await self.inner.settle(entity, settlements, holder)
        count = entity.partitions
        return list(
            await self.inner.settle_parts(
                entity,
                self.parts(entity),
                settlements,
                [partition_of_token(s.token, count) for s in settlements],
                holder,
            )
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

    # --- housekeeping ------------------------------------------------------------------------
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
