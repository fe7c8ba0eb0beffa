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
from typing import Any

from busd.storage.api import Store
from busd.storage.counts import SweepResult
from busd.storage.partitioned.catalog import PartitionedCatalogCalls
from busd.storage.partitioned.forwarding import PartitionedForwardingCalls
from busd.storage.partitioned.messages import PartitionedMessageCalls
from busd.storage.partitioned.sessions import PartitionedSessionCalls
from busd.storage.partitioned.transactions import PartitionedTransactionCalls
from busd.storage.specs import QueueSpec


class PartitionedStore(
    PartitionedCatalogCalls,
    PartitionedMessageCalls,
    PartitionedSessionCalls,
    PartitionedTransactionCalls,
    PartitionedForwardingCalls,
):
    """A Store whose partitioned entities are spread over partitions (module docstring)."""

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


def wrap(store: Any) -> Store:
    """The store the broker uses: `store` with partitioned entities routed. A Store itself:
    mypy checks that it implements the whole protocol."""
    return PartitionedStore(store)
