"""Auto-forwarding in the Redis/Valkey store: a forwarder takes messages from their entity
and moves them to its destination, in one script on a single server, in steps that a repeat
cannot double on a Redis Cluster (docs/design.md §3.16)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from busd.storage import keys as keyspace
from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult
from busd.storage.messages import StoredMessage
from busd.storage.redis.codec import (
    check_session_ids,
    entity_kind,
    optional_arg,
    placement_args,
    session_arg,
    stored_message,
    token_string,
)
from busd.storage.redis.connection import RedisConnection
from busd.storage.specs import QueueSpec

# Why a message that cannot be forwarded stays at its source (lua/forwardMessages.lua keeps
# the same words for a single server's move).
FORWARD_HOPS_REASON = "MaxTransferHopCountExceeded"
FORWARD_HOPS_DESCRIPTION = (
    "The maximum number of allowed hops when forwarding between queues "
    "has been exceeded. This value is set to 4."
)
FORWARD_GONE_REASON = "MessagingEntityNotFound"


class ForwardingCalls(RedisConnection):
    async def take_forwarding(
        self, entity: QueueSpec, forwarder: str, count: int, tokens: Sequence[bytes]
    ) -> list[StoredMessage] | None:
        if count <= 0:
            return []
        if len(tokens) < count:
            raise ValueError("a forwarder takes one token per message")
        reply = await self._run_queue(
            "forwardTake",
            entity,
            entity_kind(entity),
            forwarder,
            count,
            token_string(tokens, count),
        )
        if reply[0] != 0:
            return None
        return [stored_message(r) for r in reply[1:]]

    async def forward(
        self,
        entity: QueueSpec,
        destination: ForwardDestination,
        messages: list[ForwardedMessage],
        *,
        hop_limit: int,
    ) -> list[ForwardResult]:
        if not messages:
            return []
        check_session_ids(m.session_id for m in messages)
        if not self.cross_slot_transactions:
            return await self._forward_in_steps(entity, destination, messages, hop_limit)
        keys = list(self._keys_for("forwardMessages", entity))
        keys.append(keyspace.catalog_key(self.prefix).encode())
        args: list[Any] = self._queue_args(entity) + [
            entity_kind(entity),
            destination.record,
            hop_limit,
        ]
        if destination.queue is not None:
            queue = destination.queue
            entity_name, subscription = queue.key_scope
            keys.append(keyspace.context_key(self.prefix, entity_name, subscription).encode())
            args += [
                "q",
                *self._queue_args(queue),
                queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0,
                optional_arg(queue.default_ttl_ms),
            ]
        elif destination.topic is not None:
            topic, subs = destination.topic, destination.subscriptions
            names = tuple(sub.subscription or "" for sub in subs)
            keys += self._topic_keys("publishMessages", topic.name, names)
            args += ["t", *self._topic_args(topic.name, subs, names)]
            args.append(topic.duplicate_detection_window_ms or 0)
            for sub in subs:
                args += [1 if sub.requires_session else 0, optional_arg(sub.default_ttl_ms)]
        else:
            args.append("")
        for m in messages:
            args += [m.token, session_arg(m.session_id), optional_arg(m.message_id)]
            args += placement_args(m.placements)
        reply = await self._call(self._connected(), "forwardMessages", keys, args)
        return [ForwardResult(r) for r in reply]

    async def _forward_in_steps(
        self,
        entity: QueueSpec,
        destination: ForwardDestination,
        messages: list[ForwardedMessage],
        hop_limit: int,
    ) -> list[ForwardResult]:
        """A move on a Redis Cluster: enqueue at the destination, recorded there so that a
        repeat is a no-op (lua/forwardEnqueue.lua, lua/forwardPublish.lua); delete at the
        source (lua/forwardSettle.lua); then forget the records of what the source deleted.
        A forwarder that dies in between leaves its messages locked at the source: they come
        back and move again, and the destination's records keep them from arriving twice."""
        gone = destination.queue is None and destination.topic is None
        settle: list[Any] = []
        moving: list[ForwardedMessage] = []
        at: list[int] = []  # the index of each moving message among `messages`
        for i, m in enumerate(messages):
            if gone:
                name = destination.record.partition(":")[2]
                settle += [
                    m.token,
                    FORWARD_GONE_REASON,
                    f"The forwarding destination '{name}' does not exist.",
                ]
            elif m.hops >= hop_limit:
                settle += [m.token, FORWARD_HOPS_REASON, FORWARD_HOPS_DESCRIPTION]
            else:
                moving.append(m)
                at.append(i)
                settle += [m.token, "", ""]
        records = [self._forward_record(entity, m) for m in moving]
        if moving:
            await self._forward_enqueue(entity, destination, moving, records, [])
        results = [
            ForwardResult(r)
            for r in await self._run_queue("forwardSettle", entity, entity_kind(entity), *settle)
        ]
        done = [record for record, i in zip(records, at) if results[i] == ForwardResult.MOVED]
        if done:
            await self._forward_enqueue(entity, destination, [], [], done)
        return results

    @staticmethod
    def _forward_record(entity: QueueSpec, m: ForwardedMessage) -> str:
        """What names a forwarded message at its destination: its source, number and
        enqueued time there (a source deleted and created again reuses numbers)."""
        taken = m.message
        assert taken is not None, "on a Redis Cluster a move carries the message it moves"
        return f"\0fwd:{entity.path}:{taken.seq}:{taken.enqueued_ms}"

    async def _forward_enqueue(
        self,
        entity: QueueSpec,
        destination: ForwardDestination,
        moving: list[ForwardedMessage],
        records: list[str],
        forget: list[str],
    ) -> None:
        per_message: list[Any] = []
        for m, record in zip(moving, records):
            taken = m.message
            assert taken is not None
            ttl = None if taken.expires_ms is None else taken.expires_ms - taken.enqueued_ms
            dead = entity.dlq
            per_message += [
                record,
                taken.blob,
                session_arg(m.session_id),
                optional_arg(m.message_id),
                taken.enqueue_seq or taken.seq,
                m.hops + 1,
                entity.name if dead else "",
                optional_arg(taken.dead_letter_reason if dead else None),
                optional_arg(taken.dead_letter_description if dead else None),
                optional_arg(taken.properties_patch),
                optional_arg(ttl),
            ]
            if destination.topic is not None:
                per_message += placement_args(m.placements)
        if destination.queue is not None:
            queue = destination.queue
            await self._run_queue(
                "forwardEnqueue",
                queue,
                queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0,
                optional_arg(queue.default_ttl_ms),
                len(forget),
                *forget,
                *per_message,
            )
            return
        assert destination.topic is not None
        topic, subs = destination.topic, destination.subscriptions
        args: list[Any] = [topic.duplicate_detection_window_ms or 0]
        for sub in subs:
            args += [1 if sub.requires_session else 0, optional_arg(sub.default_ttl_ms)]
        args += [len(forget), *forget, *per_message]
        await self._run_topic("forwardPublish", topic.name, subs, args)
