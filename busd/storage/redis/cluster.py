"""busd's own pipelined connection to each primary of a Redis/Valkey Cluster (docs/design.md
§3.4, §3.19): a script call goes to the primary owning the hash slot of its first key (every
script's KEYS share one hash tag) on that primary's `PipelinedConnection`, so a call costs
what it costs on a single server. The slot map is the cluster client's (CLUSTER SLOTS),
read again when a primary answers MOVED, ASK, CLUSTERDOWN or TRYAGAIN, or its connection
fails: a failover is followed once the cluster names the new primary (docs/design.md §3.9)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
from redis.exceptions import ConnectionError as StoreConnectionError

from busd.storage.api import StoreUnavailable
from busd.storage.redis.pipeline import NotConnected, PipelinedConnection

log = logging.getLogger("busd.storage")

# The slot map is read again at most this often: while a primary is down and not yet
# replaced, every call to its slots fails, and each would otherwise ask the cluster again.
REFRESH_INTERVAL_S = 0.1


class NodeConnections:
    """What `PipelinedConnection` opens its connection with (redis-py's pool interface): one
    node's address and the cluster client's connection options (TLS, AUTH, client name)."""

    def __init__(self, connection_class: Any, options: dict[str, Any]) -> None:
        self._class = connection_class
        self._options = options

    def make_connection(self) -> Any:
        return self._class(**self._options)


class ShardPipelines:
    """One `PipelinedConnection` per primary, each with the batch's `durability` waits
    (busd/storage/redis/pipeline.py), and the slot map that routes a call to one of them.

    A call is sent once, and again only when the first send certainly did not run it: a
    MOVED answer (the slot has a new owner, which it names: sent to it), an ASK
    answer (the slot is being migrated and the key is already on the target: sent there
    after ASKING), or a connection that could not be opened (a dead primary: the map is read
    again, since the cluster may have promoted its replica). A connection lost with calls
    in flight fails them, as on a single server (they may have run); the map is read again
    for the calls after them."""

    def __init__(self, cluster: RedisCluster, durability: tuple[tuple[bytes, ...], ...]) -> None:
        self._cluster = cluster
        self._durability = durability
        self._pipes: dict[tuple[str, int], PipelinedConnection] = {}
        self._by_slot: list[PipelinedConnection | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self._refreshing: asyncio.Future[None] | None = None
        self._refreshed_at = float("-inf")
        self._map_read = True  # the last reading succeeded
        self._tasks: set[asyncio.Task[None]] = set()  # refreshes no call waits for
        self._read_map()

    # --- the slot map ----------------------------------------------------------------------
    def _read_map(self) -> None:
        """Route each slot to its primary as the cluster client's map has it now."""
        by_slot: list[PipelinedConnection | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for slot, nodes in self._cluster.nodes_manager.slots_cache.items():
            if nodes:
                by_slot[slot] = self._pipe(nodes[0].host, int(nodes[0].port))
        self._by_slot = by_slot

    def _pipe(self, host: str, port: int) -> PipelinedConnection:
        pipe = self._pipes.get((host, port))
        if pipe is None:
            node = next(iter(self._cluster.nodes_manager.nodes_cache.values()))
            # Never retried inside the connection: a refused connection is the slot map's
            # to answer (above), at once.
            options = {
                **node.connection_kwargs,
                "host": host,
                "port": port,
                "retry": Retry(NoBackoff(), 0),
            }
            pipe = self._pipes[(host, port)] = PipelinedConnection(
                NodeConnections(node.connection_class, options), self._durability
            )
        return pipe

    async def refresh(self) -> None:
        """Read the slot map again (CLUSTER SLOTS from a node that answers); calls failing at
        once share one reading, and the map is read at most every REFRESH_INTERVAL_S."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._refreshed_at < REFRESH_INTERVAL_S:
            return
        refreshing = self._refreshing = loop.create_future()
        try:
            await self._cluster.nodes_manager.initialize()
            self._read_map()
            if not self._map_read:
                self._map_read = True
                log.warning("the cluster's slot map is read again")
        except Exception as exc:  # the calls fail on their own
            if self._map_read:  # once per outage, not once per failed reading
                self._map_read = False
                log.warning("cannot read the cluster's slot map: %s", exc)
        finally:
            refreshing.set_result(None)  # cancelled too: nobody waits on it for ever
            self._refreshing = None
            self._refreshed_at = loop.time()

    # --- calls -----------------------------------------------------------------------------
    def owner(self, key: bytes) -> PipelinedConnection | None:
        """The connection `call` would send a call whose first key is `key` to first (None:
        the map does not say yet)."""
        return self._by_slot[key_slot(key)]

    async def call(self, command: bytes, name: str, key: bytes) -> Any:
        """`command` (a script call whose first key is `key`) on the primary of key's slot."""
        slot = key_slot(key)
        pipe = self._by_slot[slot]
        if pipe is None:
            await self.refresh()
            pipe = self._owner(slot)
        try:
            return await pipe.call(command, name)
        except MovedError as exc:  # the slot's new owner, named: the rest of the map follows
            moved = self._by_slot[slot] = self._pipe(*exc.node_addr)
            self._refresh_later()
            return await self._again(moved, command, name)
        except AskError as exc:  # migrating: this key is on the target already
            return await self._again(self._pipe(*exc.node_addr), command, name, asking=True)
        except NotConnected:  # never sent: its primary may have been replaced
            await self.refresh()
            return await self._again(self._owner(slot), command, name)
        except (ClusterDownError, TryAgainError) as exc:  # refused, not run
            self._refresh_later()
            raise StoreUnavailable(f"the store is unavailable: {exc}") from exc
        except StoreConnectionError:  # lost with the call in flight: it may have run
            self._refresh_later()
            raise

    def _refresh_later(self) -> None:
        task = asyncio.get_running_loop().create_task(self.refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _owner(self, slot: int) -> PipelinedConnection:
        pipe = self._by_slot[slot]
        if pipe is None:
            raise StoreUnavailable(f"the store is unavailable: no primary serves slot {slot}")
        return pipe

    @staticmethod
    async def _again(
        pipe: PipelinedConnection, command: bytes, name: str, *, asking: bool = False
    ) -> Any:
        """The one second send of a call the first send did not run."""
        try:
            return await pipe.call(command, name, asking=asking)
        except (AskError, ClusterDownError, TryAgainError) as exc:  # MOVED is an AskError
            raise StoreUnavailable(f"the store is unavailable: {exc}") from exc

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        pipes = list(self._pipes.values())
        self._pipes.clear()
        self._by_slot = [None] * REDIS_CLUSTER_HASH_SLOTS
        for pipe in pipes:
            await pipe.close()
