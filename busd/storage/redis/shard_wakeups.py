"""Wake-ups on a Redis/Valkey Cluster by sharded pub/sub (docs/design.md §3.9, §3.19).

A script publishes a wake-up with SPUBLISH on a channel of its own hash slot,
`{<tag>}:wake:<process id>` (lua/includes/queueContext.lua), so it stays on the shard that ran
the script: a PUBLISH would cross the cluster bus to every node, which on a busy host added
tens of milliseconds to the tail of a wake-up. A process subscribes (SSUBSCRIBE) to its channel
of each hash tag it calls, on the primary owning the tag's slot, before its first call there:
a waiter it registers or a session it locks there can then not miss its wake-up.

A subscription lost - the primary's connection broke (a failover), or the primary dropped the
channels of a slot it gave away (`sunsubscribe`) - is made again on the slot's owner as the
cluster's map then names it, and everyone waiting in this process looks again (WAKE_ALL):
wake-ups may have been missed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import RedisError

from busd.storage import keys as keyspace
from busd.storage.api import WAKE_ALL, StoreUnavailable, WakeCallback
from busd.storage.messages import StoredMessage
from busd.storage.redis.codec import wake_payload

log = logging.getLogger("busd.storage")

# How long a subscription may take to be confirmed before it is tried again elsewhere (the
# slot's owner may have changed), and how often.
CONFIRM_S = 2.0
TRIES = 3
# A lost subscription is made again after this pause (a failover takes the cluster a moment).
RESUBSCRIBE_PAUSE_S = 0.2


class _NodeSubscription:
    """One primary's subscriber connection and its listener."""

    def __init__(self, client: redis.Redis, owner: ShardWakeups, address: tuple[str, int]) -> None:
        self.client = client
        self.pubsub = client.pubsub()
        self.address = address
        self.channels: set[bytes] = set()  # asked for on this connection
        self._owner = owner
        self._task: asyncio.Task[None] | None = None
        # one SSUBSCRIBE at a time: the first opens the connection, which the others share
        self._sending = asyncio.Lock()

    async def subscribe(self, channel: bytes) -> None:
        self.channels.add(channel)
        async with self._sending:
            await self.pubsub.ssubscribe(channel)
        if self._task is None:
            self._task = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        try:
            while True:
                try:
                    message = await self.pubsub.get_message(timeout=None)
                except (RedisError, OSError) as exc:
                    log.warning("wake-up subscription on %s:%d lost: %s", *self.address, exc)
                    self._owner.lost(self, set(self.channels), broken=True)
                    return
                if message is None:
                    continue
                kind, channel = message.get("type"), message.get("channel")
                if kind == "smessage":
                    self._owner.woken(*wake_payload(message["data"]))
                elif kind == "ssubscribe":
                    self._owner.confirmed(channel)
                elif kind == "sunsubscribe":  # the slot moved: make it again where it went
                    self._owner.lost(self, {channel}, broken=False)
        finally:
            await self.close()

    async def close(self) -> None:
        try:
            await self.pubsub.aclose()
            await self.client.aclose()
        except Exception:  # closing a broken connection
            pass

    async def stop(self) -> None:
        """The listener ended, then the connection closed (the store closes)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.close()


class ShardWakeups:
    """This process's wake-up subscriptions on a Cluster, one connection per primary."""

    def __init__(
        self,
        cluster: RedisCluster,
        process_id: str,
        refresh: Callable[[], Awaitable[None]],
    ) -> None:
        self._cluster = cluster
        self._pid = process_id
        self._refresh = refresh  # reads the cluster's slot map again
        self.ready: set[bytes] = set()  # channels subscribed, confirmed
        self._under_way: dict[bytes, asyncio.Future[None]] = {}
        self._confirming: dict[bytes, asyncio.Future[None]] = {}
        self._nodes: dict[tuple[str, int], _NodeSubscription] = {}
        self._callbacks: list[WakeCallback] = []
        self._channels: dict[bytes, bytes] = {}  # a call's first key -> its channel
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def listen(self, on_wake: WakeCallback) -> None:
        self._callbacks.append(on_wake)

    def channel_of(self, key: bytes) -> bytes | None:
        """This process's channel in the hash slot of `key`, an entity's key (`{<tag>}...`);
        None for a key outside every entity's tag (no wake-up comes from there)."""
        channel = self._channels.get(key)
        if channel is None:
            end = key.find(b"}")
            if not key.startswith(b"{") or end < 0:
                return None
            tag = key[: end + 1].decode()
            channel = self._channels[key] = keyspace.wake_channel(tag, self._pid).encode()
        return channel

    async def ensure(self, channel: bytes) -> None:
        """Subscribed to `channel`, confirmed by its primary (raises StoreUnavailable when no
        primary confirms it)."""
        if channel in self.ready:
            return
        under_way = self._under_way.get(channel)
        if under_way is None:
            under_way = self._under_way[channel] = asyncio.ensure_future(self._subscribe(channel))
            under_way.add_done_callback(lambda _: self._under_way.pop(channel, None))
        await asyncio.shield(under_way)

    async def _subscribe(self, channel: bytes) -> None:
        loop = asyncio.get_running_loop()
        for attempt in range(TRIES):
            if attempt:
                await self._refresh()
            try:
                node = self._node_for(channel)
                confirmed = self._confirming[channel] = loop.create_future()
                await node.subscribe(channel)
                await asyncio.wait_for(asyncio.shield(confirmed), CONFIRM_S)
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("subscribing to %r failed: %s", channel, exc)
                continue
            finally:
                self._confirming.pop(channel, None)
            self.ready.add(channel)
            return
        raise StoreUnavailable(f"the store is unavailable: cannot subscribe to {channel!r}")

    def _node_for(self, channel: bytes) -> _NodeSubscription:
        nodes = self._cluster.nodes_manager.slots_cache.get(key_slot(channel))
        if not nodes:
            raise OSError(f"no primary serves the slot of {channel!r}")
        primary = nodes[0]
        address = (primary.host, int(primary.port))
        node = self._nodes.get(address)
        if node is None:
            # never retried inside redis-py: a reconnection there would subscribe again
            # silently, and the wake-ups published meanwhile would be lost unnoticed
            options = {
                **primary.connection_kwargs,
                "host": address[0],
                "port": address[1],
                "retry": Retry(NoBackoff(), 0),
            }
            pool = redis.ConnectionPool(connection_class=primary.connection_class, **options)
            node = self._nodes[address] = _NodeSubscription(
                redis.Redis(connection_pool=pool), self, address
            )
        return node

    # --- what the listeners report -----------------------------------------------------------
    def confirmed(self, channel: bytes) -> None:
        waiting = self._confirming.get(channel)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def woken(self, waiter: str, booked: Sequence[StoredMessage] = ()) -> None:
        for on_wake in self._callbacks:
            try:
                if booked:
                    on_wake(waiter, booked)
                else:
                    on_wake(waiter)
            except Exception:
                log.exception("wake-up callback failed")

    def lost(self, node: _NodeSubscription, channels: set[bytes], *, broken: bool) -> None:
        """`channels` of `node` are no longer subscribed (all of them when its connection
        `broken`): subscribe to them again, wherever their slots are now, then wake everyone
        (what was published meanwhile is lost)."""
        if self._closed:
            return
        if broken and self._nodes.get(node.address) is node:
            del self._nodes[node.address]
        node.channels -= channels
        self.ready -= channels
        task = asyncio.ensure_future(self._again(channels))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _again(self, channels: set[bytes]) -> None:
        await asyncio.sleep(RESUBSCRIBE_PAUSE_S)
        await self._refresh()
        results = await asyncio.gather(*(self.ensure(c) for c in channels), return_exceptions=True)
        for channel, result in zip(channels, results):
            if isinstance(result, BaseException):  # the next call there tries again
                log.warning("wake-up channel %r not subscribed again: %s", channel, result)
        self.woken(WAKE_ALL)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        nodes = list(self._nodes.values())
        self._nodes.clear()
        self.ready.clear()
        for node in nodes:
            await node.stop()
