"""The partitioned store's message calls written by hand: a send goes to its message's
partition (handing over in each), a publish to the topic's partition with the same partition
of each subscription, a waiting receive tries the partitions in turn, a settlement finds its
partition by its token, a peek goes partition by partition in sequence-number order
(docs/design.md §3.18)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace

from busd.errors import Condition
from busd.storage.api import Store
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
from busd.storage.partitioned.routes import in_turn, partitioned
from busd.storage.partitioned.routing import (
    PARTITION_SHIFT,
    by_message,
    first_seq,
    in_order,
    partition_of_key,
    partition_of_token,
    stamped,
)
from busd.storage.specs import QueueSpec, TopicSpec

RELEASE = Outcome.RELEASE


class PartitionedMessageCalls(PartitionedBase):
    # --- send: to each message's partition ----------------------------------------------------
    @partitioned
    async def send(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        return (await self.send_handing_over(queue, messages, ())).seqs

    @partitioned
    async def send_handing_over(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> Sent:
        # A batch spanning partitions is stored per partition, each part all or none, the
        # parts together: one store call per server. A session's messages are all in its
        # partition: each partition's send takes the offers of the sessions it holds, their
        # tokens stamped with it (settlements find it there), and hands over as one server
        # does (docs/design.md §3.5, §3.18).
        parts, groups = self.parts(queue), by_message(messages, queue.partitions, self._turn)
        if len(groups) == 1 and not offers:
            return Sent(await self.inner.send(parts[next(iter(groups))], messages), [])
        offered: dict[int, list[int]] = {}
        for j, o in enumerate(offers):
            if (p := partition_of_key(o.session_id, len(parts))) in groups:
                offered.setdefault(p, []).append(j)

        def offers_in(p: int) -> list[HandOver]:  # their tokens stamped with the partition
            held = (offers[j] for j in offered.get(p, ()))
            return [replace(o, tokens=stamped(o.tokens, p, 0, len(o.tokens))) for o in held]

        sends = [(parts[p], [messages[i] for i in idx], offers_in(p)) for p, idx in groups.items()]
        try:
            answers: list[Sent | BaseException] = await self.inner.send_handing_over_many(sends)
        except Exception as exc:  # every partition's send failed
            answers = [exc] * len(sends)
        handed: list[list[StoredMessage]] = [[] for _ in offers]
        for p, answer in zip(groups, answers):
            for j, taken in zip(offered.get(p, ()), getattr(answer, "handed", ())):
                handed[j] = taken
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:  # its part failed; the others are stored
            await self._give_back(queue, offers, handed)
            raise failed
        seqs = (a.seqs for a in answers if isinstance(a, Sent))
        return Sent(in_order(groups, seqs, len(messages)), handed)

    async def _give_back(
        self, queue: QueueSpec, offers: Sequence[HandOver], handed: list[list[StoredMessage]]
    ) -> None:
        """A send that failed in one partition fails as a whole (its caller hands nothing to
        the holders), so what the others handed over goes back: released (no count), its
        holder woken, ahead of its session's later messages as before. A release that fails
        too leaves them to the end of the session's lock."""
        for offer, taken in zip(offers, handed):
            session = offer.session_id
            back = [Settlement(m.lock_token or b"", RELEASE, session_id=session) for m in taken]
            with suppress(Exception):  # the end of the session's lock returns them
                if back:
                    await self.inner.settle(self.part_of_session(queue, session), back)

    @partitioned
    async def publish(
        self,
        topic: TopicSpec,
        subscriptions: list[QueueSpec],
        messages: list[NewMessage],
        placements: list[list[Placement]] | None = None,
    ) -> list[int]:
        # A partitioned topic's partition p holds partition p of each of its subscriptions.
        groups, tparts = by_message(messages, topic.partitions, self._turn), self.parts(topic)
        sparts = [self.parts(s) for s in subscriptions]
        answers = await asyncio.gather(
            *(
                self.inner.publish(
                    tparts[p],
                    [s[p] for s in sparts],
                    [messages[i] for i in idx],
                    None if placements is None else [placements[i] for i in idx],
                )
                for p, idx in groups.items()
            )
        )
        return in_order(groups, answers, len(messages))

    # --- receive -----------------------------------------------------------------------------
    _receive_in_turn = in_turn(Store.receive, "count", rotate=True)

    @partitioned
    async def receive(
        self,
        entity: QueueSpec,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        waiter: str | None = None,
    ) -> list[StoredMessage]:
        """A receiver's fetch (with `waiter`): the partitions in turn until `count`
        (busd/storage/partitioned/waits.py `look_in_turn`)."""
        if waiter is None:
            return await self._receive_in_turn(entity, count, mode, tokens)
        out: list[StoredMessage] = []

        async def look(part: QueueSpec, p: int, waiter_id: str | None) -> bool:
            want = count - len(out)
            given = stamped(tokens, p, len(out), want) if mode == ReceiveMode.PEEK_LOCK else ()
            got = await self.inner.receive(part, want, mode, given, waiter_id)
            out.extend(got)
            return len(got) >= want

        if count > 0:
            kind = "d" if entity.dlq else "q"
            await self._waits.look_in_turn(
                entity, kind, waiter, self.rotation, look, receiving=True
            )
        return out

    @partitioned
    async def settle(
        self, entity: QueueSpec, settlements: list[Settlement], holder: str | None = None
    ) -> list[Condition | None]:
        # the partitions' settlements together: one store call per server
        parts = self.parts(entity)
        partitions = [partition_of_token(s.token, len(parts)) for s in settlements]
        return list(await self.inner.settle_parts(entity, parts, settlements, partitions, holder))

    # --- peek --------------------------------------------------------------------------------
    @partitioned
    async def peek(
        self, entity: QueueSpec, from_seq: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        # In sequence-number order, which is partition by partition: a peek continued from
        # the last number seen + 1 goes on where this one stopped. A session's: in its own.
        out: list[StoredMessage] = []
        if session_id is not None:
            parts: Sequence[QueueSpec] = [self.part_of_session(entity, session_id)]
        else:
            parts = self.parts(entity)[max(from_seq, 0) >> PARTITION_SHIFT :]
        for part in parts:
            if len(out) >= count:
                break
            start = max(from_seq, first_seq(part.partition or 0))
            out += await self.inner.peek(part, start, count - len(out), session_id)
        return out
