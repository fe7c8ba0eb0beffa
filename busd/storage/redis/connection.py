"""The connection layer of the Redis/Valkey store: opening the server a URL names (one server,
a Redis Cluster `redis+cluster://`, Sentinels `redis+sentinel://`), checking it, the wake-up
subscription, and one script call as KEYS and ARGV under the call limiter
(call_limiter.py), pipelined by pipeline.py. The Store's methods
are built on `RedisConnection` in the modules of their concern (docs/design.md §3.4)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import redis.asyncio as redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from busd.storage import keys as keyspace
from busd.storage.api import WAKE_ALL, StoreUnavailable, WakeCallback
from busd.storage.messages import StoredMessage
from busd.storage.redis.call_limiter import CALL_WAIT_S, CallLimiter
from busd.storage.redis.coalesce import Coalescer
from busd.storage.redis.codec import as_text, wake_payload
from busd.storage.redis.pipeline import DURABILITY
from busd.storage.redis.scripts import QUEUE_ARGC, ScriptError, Scripts
from busd.storage.redis.shard_wakeups import ShardWakeups
from busd.storage.specs import BACKOFF_LONGEST_MS, QueueSpec, TopicSpec

log = logging.getLogger("busd.storage")

MIN_SERVER_VERSION = (7, 0)
WAITAOF_SERVER_VERSION = (7, 2)  # --durability fsync and replicated wait with WAITAOF
# Items of each kind of lazy housekeeping (expired locks, due scheduled messages, expired
# messages) a hot-path script may process before doing its own work: bounds its latency.
HOUSEKEEPING_BUDGET = 100
# The same for one sweep call.
SWEEP_BUDGET = 1000
# Store calls one process has in flight at once (pipelined on one connection); more wait.
DEFAULT_MAX_CALLS = 64
# Key lists of topic scripts kept encoded (by script, topic and subscription set).
TOPIC_KEY_CACHE = 1024


def queue_context_args(
    queue: QueueSpec, channel: str, budget: int, name: str | None = None
) -> list[Any]:
    """The QUEUE_ARGC parameters of lua/includes/queueContext.lua, in its order."""
    return [
        queue.name if name is None else name,
        channel,
        queue.lock_duration_ms,
        queue.max_delivery_count,
        # policy flags (lua/includes/queueContext.lua)
        (1 if queue.dead_letter_on_expiration else 0)
        + (2 if queue.dead_letter_session_on_max_delivery else 0),
        budget,
        backoff_arg(queue),
    ]


def backoff_arg(queue: QueueSpec) -> str:
    """The queue context's redelivery backoff (lua/includes/queueContext.lua): '' when off."""
    if queue.backoff_min_ms is None:
        return ""
    longest = queue.backoff_max_ms if queue.backoff_max_ms is not None else BACKOFF_LONGEST_MS
    return f"{queue.backoff_min_ms},{longest},{queue.backoff_factor!r}"


if len(queue_context_args(QueueSpec(""), "", 0)) != QUEUE_ARGC:
    raise ScriptError(
        "queue_context_args does not build the QUEUE_ARGC parameters of "
        "lua/includes/queueContext.lua"
    )


def parse_cluster_url(url: str) -> str | None:
    """The plain URL of a Redis/Valkey Cluster named `redis+cluster://...` (or
    `rediss+cluster://...`, or with `?cluster=true`), None for a single server."""
    for scheme, plain in (
        ("redis", "redis"),
        ("rediss", "rediss"),
        ("valkey", "redis"),
        ("valkeys", "rediss"),
    ):
        if url.startswith(f"{scheme}+cluster://"):
            return plain + url[len(scheme) + len("+cluster") :]
    base, sep, query = url.partition("?")
    params = [p for p in query.split("&") if p]
    if "cluster=true" in params:
        rest = "&".join(p for p in params if p != "cluster=true")
        return base + (f"?{rest}" if rest else "")
    return None


# How long busd waits for a Sentinel's answer (it then asks the next one).
SENTINEL_TIMEOUT_S = 2.0
# A Sentinel's port when the URL names none.
SENTINEL_PORT = 26379


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]] | None:
    """The Sentinels, the service name and the primary's connection options of
    `redis+sentinel://[[user]:password@]host:port[,host:port...]/service` (or `rediss+`,
    `valkey+`, `valkeys+`); None for another URL. The user and password are the primary's."""
    scheme = url.split("+sentinel://", 1)[0] if "+sentinel://" in url else None
    if scheme not in ("redis", "rediss", "valkey", "valkeys"):
        return None
    tls = scheme in ("rediss", "valkeys")
    rest = url.split("://", 1)[1].split("?", 1)[0]
    userinfo, _, rest = rest.rpartition("@")
    hosts, _, service = rest.partition("/")
    service = service.strip("/")
    options: dict[str, Any] = {"ssl": True} if tls else {}
    if userinfo:
        user, _, password = userinfo.partition(":")
        options.update(
            {k: unquote(v) for k, v in (("username", user), ("password", password)) if v}
        )
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        if not host or not service or (port and not port.isdigit()):
            raise ValueError(
                f"a Sentinel URL is redis+sentinel://host:port[,host:port...]/service, got {url!r}"
            )
        sentinels.append((host.strip("[]"), int(port) if port else SENTINEL_PORT))
    return sentinels, service, options


# What a script call raises when the store cannot be had (down, failing over, the connection
# lost or silent, a primary turned replica): the call may or may not have run.
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)


def _unavailable(exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"the store is unavailable: {type(exc).__name__}: {exc}")


class RedisConnection:
    def __init__(
        self,
        url: str,
        prefix: str = "busd",
        *,
        max_calls: int = DEFAULT_MAX_CALLS,
        durability: str = "local",
        call_wait_s: float = CALL_WAIT_S,
        process_id: str | None = None,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix may not contain '{' or '}' (hash tags)")
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        self.url = url
        self.prefix = prefix
        # Names this process in waiter ids (`<process id>:<link id>`) and its wake-up channel;
        # a worker's is chosen by its parent, which ends its locks when it dies (server/workers.py).
        self.process_id = process_id or uuid.uuid4().hex[:12]
        self.max_calls = max_calls
        if durability not in DURABILITY:
            raise ValueError(f"durability is one of {', '.join(DURABILITY)}")
        self.durability = durability
        # Bounds the calls in flight, so that the connection pool (sized above it) is never
        # exhausted: redis-py's asyncio pool fails at its limit instead of waiting.
        self._slots = CallLimiter(max_calls, call_wait_s)
        self._client: redis.Redis | redis.RedisCluster | None = None
        self._sentinel: Sentinel | None = None  # with a redis+sentinel:// URL
        # One node's plain connection: server checks and wake-up subscriptions (a PUBLISH
        # reaches every node of a cluster). The same object as _client without a cluster.
        self._node: redis.Redis | None = None
        self._scripts: Scripts | None = None
        self._channel = keyspace.wake_channel(prefix)  # every process's channel starts so
        # On a Cluster: this process's wake-up subscriptions by sharded pub/sub, and each
        # context's channel prefix by entity (busd/storage/redis/shard_wakeups.py)
        self._wakeups: ShardWakeups | None = None
        self._wake_prefixes: dict[str, str] = {}
        # (script, key scope) -> KEYS
        self._keys: dict[tuple[str, tuple[str, str | None]], list[bytes]] = {}
        self._topic_key_cache: dict[tuple[str, str, tuple[str, ...]], list[bytes]] = {}
        self._listeners: list[asyncio.Task[None]] = []  # one per subscribe() call
        # calls of one kind on one entity made together while one is in flight (settle)
        self._coalesced: Coalescer[Any, Any] = Coalescer()
        self.cross_slot_transactions = parse_cluster_url(url) is None

    # --- lifecycle -----------------------------------------------------------------------
    async def connect(self) -> None:
        # named so that operators (and tests) can tell busd's connections apart
        options: dict[str, Any] = {
            "decode_responses": False,
            "client_name": f"busd:{self.prefix}",
            # the calls in flight, plus the wake-up subscription and server checks
            "max_connections": self.max_calls + 8,
        }
        cluster_url = parse_cluster_url(self.url)
        sentinel_url = parse_sentinel_url(self.url)
        if sentinel_url is not None:
            # The primary is whichever node the Sentinels name: each new connection asks
            # them, so after a failover the next connection reaches the promoted replica.
            sentinels, service, primary = sentinel_url
            self._sentinel = Sentinel(
                sentinels,
                sentinel_kwargs={
                    "socket_timeout": SENTINEL_TIMEOUT_S,
                    "socket_connect_timeout": SENTINEL_TIMEOUT_S,
                },
            )
            self._client = self._node = self._sentinel.master_for(
                service, redis_class=redis.Redis, **primary, **options
            )
        elif cluster_url is None:
            self._client = self._node = redis.Redis.from_url(self.url, **options)
        else:
            # The cluster client reads the slot map and serves the commands that are not script
            # calls; each script call goes on busd's own pipelined connection to the primary
            # owning its queue's slot (busd/storage/redis/cluster.py).
            cluster = redis.RedisCluster.from_url(cluster_url, **options)
            await cluster.initialize()
            self._client = cluster
            node = cluster.get_nodes()[0]
            options.pop("max_connections")
            self._node = redis.Redis(host=node.host, port=int(node.port), **options)
        await self._check_server()
        self._scripts = Scripts(self._client, durability=self.durability)  # type: ignore[arg-type]
        await self._scripts.preload()
        if isinstance(self._client, redis.RedisCluster):
            self._wakeups = ShardWakeups(self._client, self.process_id, self._scripts.refresh_map)

    async def _check_server(self) -> None:
        assert self._node is not None
        info = await self._node.info("server")
        version = str(info.get("redis_version", "0"))
        parsed = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if parsed < MIN_SERVER_VERSION:
            raise RuntimeError(f"busd needs Redis or Valkey >= 7.0, the server is {version}")
        if self.durability != "local":
            if parsed < WAITAOF_SERVER_VERSION:
                raise RuntimeError(
                    f"--durability {self.durability} needs Redis or Valkey >= "
                    f"7.2 (WAITAOF), the server is {version}"
                )
            # On a Cluster, every primary's (each waits on its own, docs/design.md §3.9).
            if isinstance(self._client, redis.RedisCluster):
                by_node = await self._client.info(
                    "persistence", target_nodes=redis.RedisCluster.PRIMARIES
                )
            else:
                by_node = {"": await self._node.info("persistence")}
            for node, persistence in by_node.items():
                if not int(persistence.get("aof_enabled", 0)):
                    raise RuntimeError(
                        f"--durability {self.durability} needs the server's "
                        f"append-only file: appendonly yes{f' (on {node})' if node else ''}"
                    )
        try:
            reply = await self._node.config_get("maxmemory-policy")
            policy = next(iter(reply.values()), b"")
        except ResponseError:  # CONFIG disabled (managed services): cannot tell
            log.warning("cannot read maxmemory-policy; it must be noeviction")
            return
        if as_text(policy) != "noeviction":
            log.warning(
                "maxmemory-policy is %s, not noeviction: the server may evict keys, "
                "which silently corrupts queues",
                as_text(policy),
            )

    async def close(self) -> None:
        if self._wakeups is not None:
            await self._wakeups.close()
        for task in self._listeners:
            task.cancel()
        for task in self._listeners:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._listeners.clear()
        if self._scripts is not None:
            await self._scripts.close()
        if self._node is not None and self._node is not self._client:
            await self._node.aclose()
        if self._client is not None:
            await self._client.aclose()
        if self._sentinel is not None:
            await self._sentinel.aclose()
        self._client = self._node = self._sentinel = None

    async def ping(self) -> bool:
        try:
            return bool(self._client is not None and await self._client.ping())
        except (RedisConnectionError, OSError):
            return False

    async def subscribe(self, on_wake: WakeCallback) -> None:
        assert self._node is not None
        pubsub = self._node.pubsub(ignore_subscribe_messages=True)
        # (on a Cluster too: a process of a version before sharded wake-ups publishes here)
        await pubsub.subscribe(keyspace.wake_channel(self.prefix, self.process_id))
        self._listeners.append(asyncio.create_task(self._listen(pubsub, on_wake), name="busd-wake"))
        if self._wakeups is not None:
            self._wakeups.listen(on_wake)

    async def _listen(self, pubsub: Any, on_wake: WakeCallback) -> None:
        try:
            while True:
                try:
                    message = await pubsub.get_message(timeout=None)
                except (RedisConnectionError, OSError) as exc:
                    # redis-py reconnects and subscribes again on the next read; wake-ups
                    # published meanwhile are lost, so everyone waiting looks again.
                    log.warning("wake-up subscription interrupted: %s", exc)
                    await asyncio.sleep(0.5)
                    self._wake_safely(on_wake, WAKE_ALL)
                    continue
                if message is None or message.get("type") != "message":
                    continue
                self._wake_safely(on_wake, *wake_payload(message["data"]))
        finally:
            await pubsub.aclose()

    @staticmethod
    def _wake_safely(
        on_wake: WakeCallback, waiter: str, booked: Sequence[StoredMessage] = ()
    ) -> None:
        try:
            if booked:
                on_wake(waiter, booked)
            else:  # (a plain wake-up: callbacks may take the id alone)
                on_wake(waiter)
        except Exception:
            log.exception("wake-up callback failed")

    # --- plumbing ----------------------------------------------------------------------------
    def _keys_for(self, script: str, queue: QueueSpec | TopicSpec) -> list[bytes]:
        scope = queue.key_scope
        cached = self._keys.get((script, scope))
        if cached is None:
            assert self._scripts is not None
            names = self._scripts.sources[script].key_names
            # Encoded once per script and queue.
            cached = self._keys[(script, scope)] = [
                k.encode() for k in keyspace.keys(self.prefix, scope[0], names, scope[1])
            ]
        return cached

    def _queue_args(
        self, queue: QueueSpec, budget: int = HOUSEKEEPING_BUDGET, name: str | None = None
    ) -> list[Any]:
        """A queue context's parameters; `name` for a subscription in a topic context."""
        return queue_context_args(queue, self._wake_prefix(queue.key_scope[0]), budget, name)

    def _topic_args(
        self,
        topic: str,
        subscriptions: list[QueueSpec],
        names: tuple[str, ...],
        budget: int = HOUSEKEEPING_BUDGET,
    ) -> list[Any]:
        """A topic context's parameters (lua/includes/topicContext.lua): its name, the number
        of subscriptions, then each subscription's queue context under its own name (what the
        topic's `subs` holds)."""
        args: list[Any] = [topic, len(subscriptions)]
        channel = self._wake_prefix(topic)
        for spec, name in zip(subscriptions, names):
            args += queue_context_args(spec, channel, budget, name)
        return args

    def _wake_prefix(self, entity: str) -> str:
        """The wake-up channel prefix of `entity`'s contexts: on a Cluster its hash tag's
        (sharded pub/sub, lua/includes/queueContext.lua), else every process's."""
        if self._wakeups is None:
            return self._channel
        prefix = self._wake_prefixes.get(entity)
        if prefix is None:
            prefix = keyspace.wake_channel(keyspace.hash_tag(self.prefix, entity))
            self._wake_prefixes[entity] = prefix
        return prefix

    async def _run(self, script: str, queue: QueueSpec | TopicSpec, args: list[Any]) -> Any:
        scripts = self._connected()
        return await self._call(scripts, script, self._keys_for(script, queue), args)

    def _connected(self) -> Scripts:
        if self._scripts is None:
            raise RuntimeError("RedisStore.connect() was not called")
        return self._scripts

    async def _call(self, scripts: Scripts, script: str, keys: list[bytes], args: list[Any]) -> Any:
        """One script call in its turn (the call limiter), the store's unavailability
        raised as StoreUnavailable."""
        if not self.cross_slot_transactions:
            keys = await self._cluster_keys(keys)
        await self._acquire()
        try:
            return await scripts.run(script, keys, args)
        except UNAVAILABLE as exc:
            raise _unavailable(exc) from exc
        finally:
            self._slots.release()

    async def _cluster_keys(self, keys: list[bytes]) -> list[bytes]:
        """A call's keys on a Cluster: with its contexts' guards (see keyspace.context_guard),
        once this process is subscribed to the wake-ups of its slot (before the call can
        register a waiter there)."""
        if (wakeups := self._wakeups) is not None and keys:
            channel = wakeups.channel_of(keys[0])
            if channel is not None and channel not in wakeups.ready:
                await wakeups.ensure(channel)
        return keys + [keyspace.context_guard(c) for c in keys if c.endswith(b":")]

    async def _run_queue_many(self, calls: list[tuple[str, QueueSpec, list[Any]]]) -> list[Any]:
        """`Context: queue` calls (script, queue, the script's own arguments) of several queues
        at once, such as a partitioned entity's partitions: one store call per server
        (Scripts.run_many). Each call's answer in order; a call that failed answers its
        exception (StoreUnavailable where the store could not run it), for its caller to
        raise: the others ran."""
        scripts = self._connected()
        prepared = []
        for script, queue, args in calls:
            keys = self._keys_for(script, queue)
            if not self.cross_slot_transactions:
                keys = await self._cluster_keys(keys)
            prepared.append((script, keys, self._queue_args(queue) + args))
        await self._acquire()
        try:
            answers = await scripts.run_many(prepared, not self.cross_slot_transactions)
        except UNAVAILABLE as exc:
            raise _unavailable(exc) from exc
        finally:
            self._slots.release()
        return [_unavailable(a) if isinstance(a, UNAVAILABLE) else a for a in answers]

    async def _acquire(self) -> None:
        """Take one of the store calls this process runs at once (DEFAULT_MAX_CALLS); the
        caller releases `_slots`."""
        await self._slots.acquire()

    async def _run_queue(
        self, script: str, queue: QueueSpec, *args: Any, budget: int = HOUSEKEEPING_BUDGET
    ) -> Any:
        return await self._run(script, queue, self._queue_args(queue, budget) + list(args))

    def _topic_keys(self, script: str, topic: str, subscriptions: tuple[str, ...]) -> list[bytes]:
        cached = self._topic_key_cache.get((script, topic, subscriptions))
        if cached is None:
            assert self._scripts is not None
            source = self._scripts.sources[script]
            names = keyspace.keys(self.prefix, topic, source.key_names)
            for sub in subscriptions:
                names += keyspace.keys(self.prefix, topic, source.per_subscription, sub)
            cached = [k.encode() for k in names]
            if len(self._topic_key_cache) >= TOPIC_KEY_CACHE:
                self._topic_key_cache.clear()  # subscription sets changed a lot: start over
            self._topic_key_cache[(script, topic, subscriptions)] = cached
        return cached

    async def _run_topic(
        self,
        script: str,
        topic: str,
        subscriptions: list[QueueSpec],
        args: list[Any],
        *,
        budget: int = HOUSEKEEPING_BUDGET,
    ) -> Any:
        """A `Context: topic` script: ARGV is the topic's name, the number of subscriptions,
        the queue-context parameters of each subscription, then `args`."""
        scripts = self._connected()
        names = tuple(s.subscription or "" for s in subscriptions)
        keys = self._topic_keys(script, topic, names)
        argv = self._topic_args(topic, subscriptions, names, budget) + args
        return await self._call(scripts, script, keys, argv)
