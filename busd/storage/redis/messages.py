"""The messages of the Redis/Valkey store: send, schedule and publish, receive, settle, renew
and peek, deferred and scheduled messages, resubmitting dead letters, and a receiver's
waiting (docs/design.md §3.4, §3.5). Sessions are busd/storage/redis/sessions.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from busd.errors import Condition
from busd.storage.messages import (
    HandOver,
    NewMessage,
    Placement,
    ReceiveMode,
    Sent,
    Settlement,
    StoredMessage,
)
from busd.storage.redis.codec import (
    check_session_ids,
    check_status,
    effective_ttl,
    entity_kind,
    optional_arg,
    placement_args,
    refused_condition,
    session_arg,
    settlement_fields,
    stored_message,
    token_string,
)
from busd.storage.redis.connection import RedisConnection
from busd.storage.specs import QueueSpec, TopicSpec

# What a batch delete may look at beyond the messages it deletes (locked, scheduled or newer
# ones it passes over), so that one call stays short however the entity's messages stand.
DELETE_SCAN_SLACK = 4000


def _sent(reply: list[Any], count: int) -> Sent:
    """sendMessages' answer: the messages' sequence numbers, then each offer's handed rows."""
    return Sent(list(reply[:count]), [[stored_message(r) for r in rows] for rows in reply[count:]])


def _settle_args(entity: QueueSpec, items: list[tuple[Settlement, str | None]]) -> list[Any]:
    """settleMessages' own arguments (lua/settleMessages.lua)."""
    args: list[Any] = [entity_kind(entity)]
    for s, holder in items:
        args += settlement_fields(s, holder)
    return args


class MessageCalls(RedisConnection):
    async def send(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        return (await self._send(queue, messages, ())).seqs

    async def send_handing_over(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> Sent:
        return await self._send(queue, messages, offers)

    async def _send(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> Sent:
        if not messages:
            return Sent([], [[] for _ in offers])
        reply = await self._run_queue(
            "sendMessages", queue, *self._send_args(queue, messages, offers)
        )
        return _sent(reply, len(messages))

    async def send_handing_over_many(
        self, sends: list[tuple[QueueSpec, list[NewMessage], Sequence[HandOver]]]
    ) -> list[Sent | BaseException]:
        """`send_handing_over` of several queues at once (a partitioned entity's partitions),
        one store call per server: each send's Sent, or the exception that failed it."""
        calls = [
            ("sendMessages", queue, self._send_args(queue, messages, offers))
            for queue, messages, offers in sends
        ]
        replies = await self._run_queue_many(calls)
        return [
            reply if isinstance(reply, BaseException) else _sent(reply, len(messages))
            for reply, (_, messages, _) in zip(replies, sends)
        ]

    def _send_args(
        self, queue: QueueSpec, messages: list[NewMessage], offers: Sequence[HandOver]
    ) -> list[Any]:
        """sendMessages' own arguments (lua/sendMessages.lua)."""
        if queue.dlq:
            raise ValueError("messages are sent to a queue, not to its dead-letter sub-queue")
        check_session_ids(m.session_id for m in messages)
        args: list[Any] = [
            queue.duplicate_detection_window_ms or 0,
            1 if queue.requires_session else 0,
            len(offers),
        ]
        for offer in offers:
            args += [
                session_arg(offer.session_id),
                offer.holder,
                offer.count,
                token_string(offer.tokens, offer.count),
            ]
        for m in messages:
            args += [
                m.blob,
                session_arg(m.session_id),
                optional_arg(m.message_id),
                optional_arg(effective_ttl(queue, m)),
                optional_arg(m.scheduled_ms),
            ]
        return args

    async def schedule(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        return await self.send(queue, messages)

    async def publish(
        self,
        topic: TopicSpec,
        subscriptions: list[QueueSpec],
        messages: list[NewMessage],
        placements: list[list[Placement]] | None = None,
    ) -> list[int]:
        if not messages:
            return []
        check_session_ids(m.session_id for m in messages)
        args: list[Any] = [topic.duplicate_detection_window_ms or 0]
        for sub in subscriptions:
            args += [1 if sub.requires_session else 0, optional_arg(sub.default_ttl_ms)]
        for i, m in enumerate(messages):
            args += [
                m.blob,
                session_arg(m.session_id),
                optional_arg(m.message_id),
                optional_arg(effective_ttl(topic, m)),
                optional_arg(m.scheduled_ms),
            ]
            args += placement_args(None if placements is None else placements[i])
        return list(
            await self._run_topic("publishMessages", topic.key_scope[0], subscriptions, args)
        )

    async def cancel_topic_scheduled(
        self, topic: TopicSpec, subscriptions: list[QueueSpec], seqs: list[int]
    ) -> None:
        if seqs:
            check_status(
                await self._run_topic(
                    "cancelTopicScheduled", topic.key_scope[0], subscriptions, list(seqs)
                )
            )

    async def receive(
        self,
        entity: QueueSpec,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        waiter: str | None = None,
    ) -> list[StoredMessage]:
        if count <= 0:
            return []
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if peek_lock and len(tokens) < count:
            raise ValueError("peek-lock needs one token per message")
        rows = await self._run_queue(
            "receiveMessages",
            entity,
            entity_kind(entity),
            1 if peek_lock else 0,
            count,
            optional_arg(waiter),
            *((token_string(tokens, count),) if peek_lock else ()),
        )
        return [stored_message(r) for r in rows]

    async def settle(
        self, entity: QueueSpec, settlements: list[Settlement], holder: str | None = None
    ) -> list[Condition | None]:
        if not settlements:
            return []
        # with the settlements of other links of the entity that come while one call of them
        # is in flight (busd/storage/redis/coalesce.py); the lane is the spec's, so a call made
        # for several callers runs with the settings each of them named
        return await self._coalesced.call(
            ("settle", entity),
            [(s, holder) for s in settlements],
            lambda items: self._settle(entity, items),
        )

    async def _settle(
        self, entity: QueueSpec, items: list[tuple[Settlement, str | None]]
    ) -> list[Condition | None]:
        return [
            refused_condition(status)
            for status in await self._run_queue(
                "settleMessages", entity, *_settle_args(entity, items)
            )
        ]

    async def settle_parts(
        self,
        entity: QueueSpec,
        parts: tuple[QueueSpec, ...],
        settlements: list[Settlement],
        partitions: list[int],
        holder: str | None = None,
    ) -> list[Condition | None]:
        """`settle` on a partitioned entity, each settlement in its partition
        (`partitions`, of `parts`): coalesced over the entity's partitions, so that the
        settlements of many links, in many partitions, are one store call per server."""
        if not settlements:
            return []
        answers = await self._coalesced.call(
            ("settle", entity),
            [(s, holder, p) for s, p in zip(settlements, partitions)],
            lambda items: self._settle_parts(parts, items),
        )
        for answer in answers:
            if isinstance(answer, BaseException):  # its partition's call failed
                raise answer
        return answers

    async def _settle_parts(
        self, parts: tuple[QueueSpec, ...], items: list[tuple[Settlement, str | None, int]]
    ) -> list[Any]:
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item[2], []).append(i)
        replies = await self._run_queue_many(
            [
                ("settleMessages", parts[p], _settle_args(parts[p], [items[i][:2] for i in idx]))
                for p, idx in groups.items()
            ]
        )
        out: list[Any] = [None] * len(items)
        for idx, reply in zip(groups.values(), replies):
            if isinstance(reply, BaseException):
                for i in idx:
                    out[i] = reply
            else:
                for i, status in zip(idx, reply):
                    out[i] = refused_condition(status)
        return out

    async def renew_message_locks(
        self, entity: QueueSpec, tokens: list[bytes], until_ms: int | None = None
    ) -> list[int]:
        if not tokens:
            return []
        reply = await self._run_queue(
            "renewMessageLocks", entity, entity_kind(entity), optional_arg(until_ms), *tokens
        )
        check_status(reply[0])
        return list(reply[1:])

    async def peek(
        self, entity: QueueSpec, from_seq: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        rows = await self._run_queue(
            "peekMessages", entity, entity_kind(entity), from_seq, count, session_arg(session_id)
        )
        return [stored_message(r) for r in rows]

    async def delete_messages(
        self, entity: QueueSpec, count: int, before_ms: int | None, session_id: str | None = None
    ) -> int:
        return int(
            await self._run_queue(
                "deleteMessages",
                entity,
                entity_kind(entity),
                count,
                optional_arg(before_ms),
                session_arg(session_id),
                count + DELETE_SCAN_SLACK,
            )
        )

    async def receive_deferred(
        self,
        entity: QueueSpec,
        seqs: list[int],
        mode: ReceiveMode,
        tokens: Sequence[bytes],
        session_id: str | None = None,
        holder: str | None = None,
    ) -> list[StoredMessage]:
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if peek_lock and len(tokens) < len(seqs):
            raise ValueError("peek-lock needs one token per message")
        reply = await self._run_queue(
            "receiveDeferred",
            entity,
            entity_kind(entity),
            1 if peek_lock else 0,
            session_arg(session_id),
            optional_arg(holder),
            len(seqs),
            *seqs,
            *((token_string(tokens, len(seqs)),) if peek_lock else ()),
        )
        check_status(reply[0])
        return [stored_message(r) for r in reply[1:]]

    async def cancel_scheduled(self, queue: QueueSpec, seqs: list[int]) -> None:
        if seqs:
            check_status(await self._run_queue("cancelScheduled", queue, *seqs))

    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        return bool(await self._run_queue("stopWaiting", queue, waiters, waiter))

    async def resubmit_dead_letters(self, queue: QueueSpec, limit: int) -> int:
        if limit <= 0:
            return 0
        moved, _ = await self._run_queue(
            "resubmitDeadLetters",
            queue,
            1 if queue.requires_session else 0,
            optional_arg(queue.default_ttl_ms),
            limit,
        )
        return moved
