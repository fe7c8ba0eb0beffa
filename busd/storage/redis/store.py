"""The Store on Redis or Valkey: every method is one Lua script call (lua/*.lua).

The adapter only turns Store calls into KEYS/ARGV and script replies into api types; the
semantics live in the scripts. Nothing here holds queue state, so any number of broker
processes can share one server. `RedisStore` composes one module per concern, each built on
the connection layer (docs/design.md §3.4):

- redis_connection.py: opening the URL, the server checks, wake-ups, one script call
  (with call_limiter.py and the pipelined connection of pipeline.py);
- redis_codec.py: api types to script arguments and replies (and status codes) back;
- redis_catalog.py: entity records and whole-entity calls;
- redis_messages.py, redis_sessions.py, redis_transactions.py, redis_forwarding.py.

What remains here is the queue's sweep, which spans all of them, and the settings it and
the call limiter read when a store is made.
"""

from __future__ import annotations

from busd.storage.counts import SweepResult
from busd.storage.redis.call_limiter import CALL_WAIT_S
from busd.storage.redis.catalog import CatalogCalls
from busd.storage.redis.codec import optional_arg, session_from_reply
from busd.storage.redis.connection import (
    DEFAULT_MAX_CALLS,
    SWEEP_BUDGET,
    parse_cluster_url,
    parse_sentinel_url,
)
from busd.storage.redis.forwarding import ForwardingCalls
from busd.storage.redis.messages import MessageCalls
from busd.storage.redis.sessions import SessionCalls
from busd.storage.redis.transactions import TransactionCalls
from busd.storage.specs import QueueSpec

__all__ = ["CALL_WAIT_S", "RedisStore", "parse_cluster_url", "parse_sentinel_url"]

# A process that has not swept for this long counts as gone: its waiters are dropped.
LIVENESS_MS = 15_000
# Most waiters of one kind a sweep wakes where work and waiters meet (lost wake-ups).
REPAIR_WAKES = 16


class RedisStore(CatalogCalls, MessageCalls, SessionCalls, TransactionCalls, ForwardingCalls):
    def __init__(
        self,
        url: str,
        prefix: str = "busd",
        *,
        max_calls: int = DEFAULT_MAX_CALLS,
        durability: str = "local",
        process_id: str | None = None,
    ) -> None:
        super().__init__(
            url,
            prefix,
            max_calls=max_calls,
            durability=durability,
            call_wait_s=CALL_WAIT_S,
            process_id=process_id,
        )

    async def sweep(self, queue: QueueSpec) -> SweepResult:
        reply = await self._run_queue(
            "sweepQueue",
            queue,
            self.process_id,
            LIVENESS_MS,
            REPAIR_WAKES,
            optional_arg(queue.session_idle_ttl_ms),
            budget=SWEEP_BUDGET,
        )
        return SweepResult(
            expired_message_locks=reply[0],
            expired_messages=reply[1],
            activated_scheduled=reply[2],
            expired_idle_sessions=reply[3],
            expired_session_locks=[session_from_reply(sid) or "" for sid in reply[4:]],
        )
