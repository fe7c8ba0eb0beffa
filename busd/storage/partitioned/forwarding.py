"""The partitioned store's auto-forwarding (docs/design.md §3.16, §3.18)."""

from __future__ import annotations

from collections.abc import Sequence

from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult
from busd.storage.messages import StoredMessage
from busd.storage.partitioned.base import PartitionedBase
from busd.storage.partitioned.routing import partition_of_token, stamped
from busd.storage.specs import QueueSpec


class PartitionedForwardingCalls(PartitionedBase):
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
