"""The Store on Redis or Valkey: every method is one Lua script call (lua/*.lua).

This module only turns Store calls into KEYS/ARGV and script replies into api types; the
semantics live in the scripts. Nothing here holds queue state, so any number of broker
processes can share one server.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import redis.asyncio as redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from busd.errors import BusdError, Condition, refusal
from busd.storage import keys as keyspace
from busd.storage.api import (
    WAKE_ALL,
    CatalogCallback,
    EntityCounts,
    ForwardDestination,
    ForwardedMessage,
    ForwardResult,
    LockTokens,
    MessageState,
    NewMessage,
    Placement,
    QueueSpec,
    ReceiveMode,
    SessionInfo,
    SessionLock,
    Settlement,
    StagedCancel,
    StagedOperation,
    StagedPublish,
    StagedSend,
    StagedSessionState,
    StagedSettlement,
    StoredMessage,
    StoreUnavailable,
    SweepResult,
    TopicSpec,
    WakeCallback,
)
from busd.storage.scripts import DURABILITY, Scripts

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
# How long a call waits for its turn before the client is told the server is busy.
CALL_WAIT_S = 30.0
# A process that has not swept for this long counts as gone: its waiters are dropped.
LIVENESS_MS = 15_000
# Most waiters of one kind a sweep wakes where work and waiters meet (lost wake-ups).
REPAIR_WAKES = 16
# Key lists of topic scripts kept encoded (by script, topic and subscription set).
TOPIC_KEY_CACHE = 1024


def catalog_field(kind: str, path: str) -> str:
    """A record's field in the catalog hash: `<kind>:<path>` (kinds hold no ':')."""
    return f"{kind}:{path}"


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


# Why a message that cannot be forwarded stays at its source (lua/forwardMessages.lua keeps
# the same words for a single server's move).
FORWARD_HOPS_REASON = "MaxTransferHopCountExceeded"
FORWARD_HOPS_DESCRIPTION = ("The maximum number of allowed hops when forwarding between queues "
                            "has been exceeded. This value is set to 4.")
FORWARD_GONE_REASON = "MessagingEntityNotFound"


# Service Bus takes "" for a session id, but the scripts read '' as "no session": the store
# keeps the empty id as NUL, which no other id contains (_check_session_ids).
_EMPTY_SESSION = "\0"


def _sid(session_id: str | None) -> str:
    """A session id as the scripts take it: '' for none, NUL for the empty id."""
    if session_id is None:
        return ""
    return session_id or _EMPTY_SESSION


def _sid_text(value: bytes | str | None) -> str | None:
    """A session id the scripts returned, the empty id given back as ""."""
    text = _text(value)
    return "" if text == _EMPTY_SESSION else text


_STATES = tuple(MessageState)  # by value: indexing is cheaper than an enum lookup per message


def _message(row: list[Any]) -> StoredMessage:
    if len(row) != 12:
        return _forwarded_message(row)
    seq, blob, dc, enq, sid, token, locked_until, expires, state, reason, desc, patch = row
    return StoredMessage(
        seq=seq,
        blob=blob,
        delivery_count=dc,
        enqueued_ms=enq,
        session_id=_sid_text(sid),
        lock_token=token,
        locked_until_ms=locked_until,
        expires_ms=expires,
        state=_STATES[state],
        dead_letter_reason=_text(reason),
        dead_letter_description=_text(desc),
        properties_patch=patch,
    )


def _forwarded_message(row: list[Any]) -> StoredMessage:
    """A row with what forwarding recorded (lua/includes/deliveryRow.lua), and from a
    forwarder's take (lua/forwardTake.lua) the hop count."""
    message = _message(row[:12])
    message.enqueue_seq = row[12] or None
    message.dead_letter_source = _text(row[13]) or None
    if len(row) > 14:
        message.hops = row[14]
    return message


def _effective_ttl(queue: QueueSpec | TopicSpec, message: NewMessage) -> int | None:
    limits = [t for t in (message.ttl_ms, queue.default_ttl_ms) if t is not None]
    return min(limits) if limits else None


def _entity(entity: QueueSpec) -> str:
    return "d" if entity.dlq else "q"


def _opt(value: Any) -> Any:
    """Scripts take '' for an absent optional argument."""
    return "" if value is None else value


def _cluster_url(url: str) -> str | None:
    """The plain URL of a Redis/Valkey Cluster named `redis+cluster://...` (or
    `rediss+cluster://...`, or with `?cluster=true`), None for a single server."""
    for scheme, plain in (("redis", "redis"), ("rediss", "rediss"),
                          ("valkey", "redis"), ("valkeys", "rediss")):
        if url.startswith(f"{scheme}+cluster://"):
            return plain + url[len(scheme) + len("+cluster"):]
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


def _sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]] | None:
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
        options.update({k: unquote(v) for k, v in (("username", user), ("password", password))
                        if v})
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        if not host or not service or (port and not port.isdigit()):
            raise ValueError(f"a Sentinel URL is redis+sentinel://host:port[,host:port...]/"
                             f"service, got {url!r}")
        sentinels.append((host.strip("[]"), int(port) if port else SENTINEL_PORT))
    return sentinels, service, options


class _Turns:
    """The store calls one process runs at once: at most `limit`; the others wait in order, each
    for CALL_WAIT_S at most, then are told the server is busy. One timer serves every waiter
    (a time-out each would cost more than the wait, and waits are common under load)."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiting: deque[tuple[asyncio.Future[None], float]] = deque()  # (turn, deadline)
        self._timer: asyncio.TimerHandle | None = None

    def locked(self) -> bool:
        return self._free == 0

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append((turn, loop.time() + CALL_WAIT_S))
        if self._timer is None:
            self._timer = loop.call_later(CALL_WAIT_S, self._expire)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given a turn, then cancelled
                self.release()
            raise

    def release(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()[0]
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._waiting:
            turn, deadline = self._waiting[0]
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            self._waiting.popleft()
            if not turn.done():
                turn.set_exception(BusdError(Condition.SERVER_BUSY,
                                             "The store is busy; try again."))


def _token_string(tokens: Sequence[bytes], count: int) -> bytes:
    """The first `count` lock tokens as the scripts take them: one argument, 16 bytes per token
    (lua/includes/tokenAt.lua), instead of one argument per message."""
    if type(tokens) is LockTokens:
        return tokens.packed[: 16 * count]
    tokens = tokens[:count]
    if not all(map((16).__eq__, map(len, tokens))):
        raise ValueError("lock tokens are 16 bytes")
    return b"".join(tokens)


def _check_session_ids(ids: Any) -> None:
    """Refuse a NUL in a session id: the keys separate ids from sequence numbers with NUL, so
    such an id would reach another session's messages (docs/design.md §2.2). The broker
    refuses them first; this keeps the store safe from any caller."""
    for sid in ids:
        if sid is not None and "\0" in sid:
            raise BusdError(Condition.ARGUMENT_OUT_OF_RANGE,
                            "A session id must not contain a NUL character.")


class ScriptStatus(enum.IntEnum):
    """Status codes the Lua scripts return (negative: refused; see each script's header). They
    end here: callers get a Condition or a BusdError."""

    OK = 0
    MESSAGE_LOCK_LOST = -1
    SESSION_LOCK_LOST = -2
    SESSION_CANNOT_BE_LOCKED = -3
    MESSAGE_NOT_FOUND = -4
    NO_SESSION_AVAILABLE = -5
    UNKNOWN_ENTITY = -10
    TRANSACTION_TIMEOUT = -11
    RESOURCE_LIMIT = -12


_CONDITIONS = {
    ScriptStatus.MESSAGE_LOCK_LOST: Condition.MESSAGE_LOCK_LOST,
    ScriptStatus.SESSION_LOCK_LOST: Condition.SESSION_LOCK_LOST,
    ScriptStatus.SESSION_CANNOT_BE_LOCKED: Condition.SESSION_CANNOT_BE_LOCKED,
    ScriptStatus.MESSAGE_NOT_FOUND: Condition.MESSAGE_NOT_FOUND,
    ScriptStatus.TRANSACTION_TIMEOUT: Condition.TRANSACTION_TIMEOUT,
    ScriptStatus.RESOURCE_LIMIT: Condition.RESOURCE_LIMIT,
}


def _refused(status: int) -> Condition | None:
    return None if status >= 0 else _CONDITIONS[ScriptStatus(status)]


# What a script call raises when the store cannot be had (down, failing over, the connection
# lost or silent, a primary turned replica): the call may or may not have run.
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)


def _unavailable(exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"the store is unavailable: {type(exc).__name__}: {exc}")


def _check(status: int) -> None:
    if status < 0:
        raise refusal(_CONDITIONS[ScriptStatus(status)])


class RedisStore:
    def __init__(
        self, url: str, prefix: str = "busd", *, max_calls: int = DEFAULT_MAX_CALLS,
        durability: str = "local",
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix may not contain '{' or '}' (hash tags)")
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        self.url = url
        self.prefix = prefix
        # Names this process in waiter ids (`<process id>:<link id>`) and its wake-up channel.
        self.process_id = uuid.uuid4().hex[:12]
        self.max_calls = max_calls
        if durability not in DURABILITY:
            raise ValueError(f"durability is one of {', '.join(DURABILITY)}")
        if durability != "local" and _cluster_url(url) is not None:
            raise ValueError("--durability fsync or replicated needs a single server or "
                             "Sentinel; a Cluster has no one connection to wait on")
        self.durability = durability
        # Bounds the calls in flight, so that the connection pool (sized above it) is never
        # exhausted: redis-py's asyncio pool fails at its limit instead of waiting.
        self._slots = _Turns(max_calls)
        self._client: redis.Redis | redis.RedisCluster | None = None
        self._sentinel: Sentinel | None = None  # with a redis+sentinel:// URL
        # One node's plain connection: server checks and wake-up subscriptions (a PUBLISH
        # reaches every node of a cluster). The same object as _client without a cluster.
        self._node: redis.Redis | None = None
        self._scripts: Scripts | None = None
        self._channel = keyspace.wake_channel(prefix)  # every process's channel starts so
        # (script, key scope) -> KEYS
        self._keys: dict[tuple[str, tuple[str, str | None]], list[bytes]] = {}
        self._topic_key_cache: dict[tuple[str, str, tuple[str, ...]], list[bytes]] = {}
        self._listeners: list[asyncio.Task[None]] = []  # one per subscribe() call
        self.cross_slot_transactions = _cluster_url(url) is None

    # --- lifecycle -----------------------------------------------------------------------
    async def connect(self) -> None:
        # named so that operators (and tests) can tell busd's connections apart
        options: dict[str, Any] = {
            "decode_responses": False,
            "client_name": f"busd:{self.prefix}",
            # the calls in flight, plus the wake-up subscription and server checks
            "max_connections": self.max_calls + 8,
        }
        cluster_url = _cluster_url(self.url)
        sentinel_url = _sentinel_url(self.url)
        if sentinel_url is not None:
            # The primary is whichever node the Sentinels name: each new connection asks
            # them, so after a failover the next connection reaches the promoted replica.
            sentinels, service, primary = sentinel_url
            self._sentinel = Sentinel(
                sentinels, sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_S,
                                            "socket_connect_timeout": SENTINEL_TIMEOUT_S})
            self._client = self._node = self._sentinel.master_for(
                service, redis_class=redis.Redis, **primary, **options)
        elif cluster_url is None:
            self._client = self._node = redis.Redis.from_url(self.url, **options)
        else:
            # Every script's KEYS share one queue's hash tag, so the cluster client routes each
            # call to the node owning that queue's slot.
            cluster = redis.RedisCluster.from_url(cluster_url, **options)
            await cluster.initialize()
            self._client = cluster
            node = cluster.get_nodes()[0]
            options.pop("max_connections")
            self._node = redis.Redis(host=node.host, port=int(node.port), **options)
        await self._check_server()
        self._scripts = Scripts(self._client, durability=self.durability)  # type: ignore[arg-type]
        await self._scripts.preload()

    async def _check_server(self) -> None:
        assert self._node is not None
        info = await self._node.info("server")
        version = str(info.get("redis_version", "0"))
        parsed = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if parsed < MIN_SERVER_VERSION:
            raise RuntimeError(f"busd needs Redis or Valkey >= 7.0, the server is {version}")
        if self.durability != "local":
            if parsed < WAITAOF_SERVER_VERSION:
                raise RuntimeError(f"--durability {self.durability} needs Redis or Valkey >= "
                                   f"7.2 (WAITAOF), the server is {version}")
            persistence = await self._node.info("persistence")
            if not int(persistence.get("aof_enabled", 0)):
                raise RuntimeError(f"--durability {self.durability} needs the server's "
                                   "append-only file: appendonly yes")
        try:
            reply = await self._node.config_get("maxmemory-policy")
            policy = next(iter(reply.values()), b"")
        except ResponseError:  # CONFIG disabled (managed services): cannot tell
            log.warning("cannot read maxmemory-policy; it must be noeviction")
            return
        if _text(policy) != "noeviction":
            log.warning(
                "maxmemory-policy is %s, not noeviction: the server may evict keys, "
                "which silently corrupts queues",
                _text(policy),
            )

    async def close(self) -> None:
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
        await pubsub.subscribe(keyspace.wake_channel(self.prefix, self.process_id))
        self._listeners.append(
            asyncio.create_task(self._listen(pubsub, on_wake), name="busd-wake")
        )

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
                self._wake_safely(on_wake, message["data"].decode())
        finally:
            await pubsub.aclose()

    @staticmethod
    def _wake_safely(on_wake: WakeCallback, waiter: str) -> None:
        try:
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
            # Encoded once: every call sends the queue's whole key set.
            cached = self._keys[(script, scope)] = [
                k.encode() for k in keyspace.keys(self.prefix, scope[0], names, scope[1])
            ]
        return cached

    def _queue_args(self, queue: QueueSpec, budget: int = HOUSEKEEPING_BUDGET) -> list[Any]:
        return [
            queue.name,
            self._channel,
            queue.lock_duration_ms,
            queue.max_delivery_count,
            1 if queue.dead_letter_on_expiration else 0,
            budget,
        ]

    async def _run(self, script: str, queue: QueueSpec | TopicSpec, args: list[Any]) -> Any:
        if self._scripts is None:
            raise RuntimeError("RedisStore.connect() was not called")
        keys = self._keys_for(script, queue)
        await self._acquire()
        try:
            return await self._scripts.run(script, keys, args)
        except UNAVAILABLE as exc:
            raise _unavailable(exc) from exc
        finally:
            self._slots.release()

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
        self, script: str, topic: str, subscriptions: list[QueueSpec], args: list[Any],
        *, budget: int = HOUSEKEEPING_BUDGET,
    ) -> Any:  # fmt: skip
        """A `Context: topic` script: ARGV is the topic's name, the number of subscriptions,
        the six queue-context parameters of each subscription, then `args`."""
        if self._scripts is None:
            raise RuntimeError("RedisStore.connect() was not called")
        names = tuple(s.subscription or "" for s in subscriptions)
        keys = self._topic_keys(script, topic, names)
        argv: list[Any] = [topic, len(subscriptions)]
        for spec, name in zip(subscriptions, names):
            argv += self._queue_args(spec, budget)
            argv[-6] = name  # the subscription's own name: what `subs` holds
        argv += args
        await self._acquire()
        try:
            return await self._scripts.run(script, keys, argv)
        except UNAVAILABLE as exc:
            raise _unavailable(exc) from exc
        finally:
            self._slots.release()

    # --- the entity catalog ---------------------------------------------------------------
    # Entity records change rarely and are not messages: each change is one MULTI/EXEC (the
    # record and its announcement together), not a script.
    async def catalog_all(self) -> dict[str, dict[str, Any]]:
        assert self._client is not None
        raw = await self._client.hgetall(keyspace.catalog_key(self.prefix))
        return {_text(field) or "": json.loads(value) for field, value in raw.items()}

    async def catalog_get(self, kind: str, path: str) -> dict[str, Any] | None:
        assert self._client is not None
        raw = await self._client.hget(keyspace.catalog_key(self.prefix), catalog_field(kind, path))
        return None if raw is None else json.loads(raw)

    async def catalog_put(
        self, kind: str, path: str, record: dict[str, Any], *, only_new: bool = False
    ) -> bool:
        assert self._client is not None
        name = catalog_field(kind, path)
        value = json.dumps(record, separators=(",", ":"), sort_keys=True)
        key, channel = keyspace.catalog_key(self.prefix), keyspace.catalog_channel(self.prefix)
        if not self.cross_slot_transactions:
            # A cluster client refuses PUBLISH in a pipeline: the record first, then its
            # announcement (a process that misses one reloads all when it subscribes again).
            if only_new:
                written = await self._client.hsetnx(key, name, value)
            else:
                written = await self._client.hset(key, name, value)
            await self._client.publish(channel, name)
            return bool(written) or not only_new
        async with self._client.pipeline(transaction=True) as pipe:
            if only_new:
                pipe.hsetnx(key, name, value)
            else:
                pipe.hset(key, name, value)
            pipe.publish(channel, name)
            written, _ = await pipe.execute()
        return bool(written) or not only_new

    async def catalog_delete(self, items: list[tuple[str, str]]) -> int:
        assert self._client is not None
        if not items:
            return 0
        names = [catalog_field(kind, path) for kind, path in items]
        if not self.cross_slot_transactions:  # as in catalog_put
            deleted = await self._client.hdel(keyspace.catalog_key(self.prefix), *names)
            for name in names:
                await self._client.publish(keyspace.catalog_channel(self.prefix), name)
            return int(deleted)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hdel(keyspace.catalog_key(self.prefix), *names)
            for name in names:
                pipe.publish(keyspace.catalog_channel(self.prefix), name)
            deleted, *_ = await pipe.execute()
        return int(deleted)

    async def catalog_subscribe(self, on_change: CatalogCallback) -> None:
        assert self._node is not None
        pubsub = self._node.pubsub(ignore_subscribe_messages=False)
        await pubsub.subscribe(keyspace.catalog_channel(self.prefix))
        self._listeners.append(
            asyncio.create_task(self._listen_catalog(pubsub, on_change), name="busd-catalog")
        )

    async def _listen_catalog(self, pubsub: Any, on_change: CatalogCallback) -> None:
        try:
            while True:
                try:
                    message = await pubsub.get_message(timeout=None)
                except (RedisConnectionError, OSError) as exc:
                    # redis-py subscribes again on the next read; its confirmation below
                    # makes everyone reload what changed meanwhile.
                    log.warning("catalog subscription interrupted: %s", exc)
                    await asyncio.sleep(0.5)
                    continue
                if message is None:
                    continue
                kind = message.get("type")
                if kind == "subscribe":  # (re)subscribed: changes may have been missed
                    changed = None
                elif kind == "message":
                    changed = message["data"].decode()
                else:
                    continue
                try:
                    on_change(changed)
                except Exception:
                    log.exception("catalog change callback failed")
        finally:
            await pubsub.aclose()

    async def open_subscriptions(self, topic: str, subscriptions: list[str]) -> None:
        if subscriptions:
            await self._run_topic("openSubscriptions", topic, [], list(subscriptions))

    async def drop_queue(self, queue: QueueSpec) -> int:
        return await self._run_queue("dropQueue", queue)

    async def drop_subscriptions(
        self, topic: str, subscriptions: list[QueueSpec], *, with_topic: bool = False
    ) -> int:
        return await self._run_topic(
            "dropSubscriptions", topic, subscriptions, [1 if with_topic else 0]
        )

    # --- send ------------------------------------------------------------------------------
    async def send(self, queue: QueueSpec, messages: list[NewMessage]) -> list[int]:
        if not messages:
            return []
        if queue.dlq:
            raise ValueError("messages are sent to a queue, not to its dead-letter sub-queue")
        _check_session_ids(m.session_id for m in messages)
        args: list[Any] = [
            queue.duplicate_detection_window_ms or 0,
            1 if queue.requires_session else 0,
        ]
        for m in messages:
            args += [
                m.blob,
                _sid(m.session_id),
                _opt(m.message_id),
                _opt(_effective_ttl(queue, m)),
                _opt(m.scheduled_ms),
            ]
        return list(await self._run_queue("sendMessages", queue, *args))

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
        _check_session_ids(m.session_id for m in messages)
        args: list[Any] = [topic.duplicate_detection_window_ms or 0]
        for sub in subscriptions:
            args += [1 if sub.requires_session else 0, _opt(sub.default_ttl_ms)]
        for i, m in enumerate(messages):
            args += [m.blob, _sid(m.session_id), _opt(m.message_id),
                     _opt(_effective_ttl(topic, m)), _opt(m.scheduled_ms)]
            if placements is None:
                args.append(-1)
                continue
            copies = placements[i]
            args.append(len(copies))
            for c in copies:
                if c.own_session_id:
                    _check_session_ids([c.session_id])
                args += [c.subscription + 1, *_placement_fields(c)]
        return list(await self._run_topic("publishMessages", topic.name, subscriptions, args))

    async def cancel_topic_scheduled(
        self, topic: TopicSpec, subscriptions: list[QueueSpec], seqs: list[int]
    ) -> None:
        if seqs:
            _check(await self._run_topic("cancelTopicScheduled", topic.name, subscriptions,
                                         list(seqs)))

    async def topic_totals(self, topic: TopicSpec) -> dict[str, int]:
        assert self._client is not None
        raw = await self._client.hgetall(keyspace.key(self.prefix, topic.name, "tstats"))
        return {_text(k) or "": int(v) for k, v in raw.items()}

    # --- receive ---------------------------------------------------------------------------
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
            _entity(entity),
            1 if peek_lock else 0,
            count,
            _opt(waiter),
            *((_token_string(tokens, count),) if peek_lock else ()),
        )
        return [_message(r) for r in rows]

    # --- sessions --------------------------------------------------------------------------
    async def accept_session(
        self, queue: QueueSpec, session_id: str | None, holder: str, *, wait: bool = False,
        count: int = 0, mode: ReceiveMode = ReceiveMode.PEEK_LOCK, tokens: Sequence[bytes] = (),
    ) -> SessionLock | None:
        _check_session_ids([session_id])
        count = max(count, 0)
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if count and peek_lock and len(tokens) < count:
            raise ValueError("peek-lock needs one token per message")
        reply = await self._run_queue(
            "acceptSession", queue, holder, _sid(session_id), 1 if wait else 0,
            1 if peek_lock else 0, count,
            _token_string(tokens, count) if count and peek_lock else "",
        )
        if reply[0] == ScriptStatus.NO_SESSION_AVAILABLE:
            return None
        _check(reply[0])
        return SessionLock(session_id=_sid_text(reply[1]) or "", locked_until_ms=reply[2],
                           messages=[_message(r) for r in reply[3:]])

    async def receive_session(
        self,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        count: int,
        mode: ReceiveMode,
        tokens: Sequence[bytes],
    ) -> list[StoredMessage]:
        peek_lock = mode == ReceiveMode.PEEK_LOCK
        if peek_lock and len(tokens) < count:
            raise ValueError("peek-lock needs one token per message")
        reply = await self._run_queue(
            "receiveSessionMessages",
            queue,
            holder,
            _sid(session_id),
            1 if peek_lock else 0,
            max(count, 0),
            *((_token_string(tokens, count),) if peek_lock else ()),
        )
        _check(reply[0])
        return [_message(r) for r in reply[1:]]

    async def renew_session_lock(self, queue: QueueSpec, session_id: str, holder: str) -> int:
        assert self._scripts is not None
        reply = await self._run(
            "renewSessionLock", queue, [holder, _sid(session_id), queue.lock_duration_ms]
        )
        _check(reply)
        return reply

    async def release_session(self, queue: QueueSpec, session_id: str, holder: str) -> None:
        await self._run_queue("releaseSession", queue, holder, _sid(session_id))

    async def get_session_state(
        self, queue: QueueSpec, session_id: str, holder: str
    ) -> bytes | None:
        reply = await self._run("getSessionState", queue, [holder, _sid(session_id)])
        _check(reply[0])
        return reply[1] if len(reply) > 1 else None

    async def set_session_state(
        self, queue: QueueSpec, session_id: str, holder: str, state: bytes | None
    ) -> None:
        args = [holder, _sid(session_id), 0 if state is None else 1,
                b"" if state is None else state]
        _check(await self._run("setSessionState", queue, args))

    async def list_sessions(
        self, queue: QueueSpec, skip: int, top: int, updated_after_ms: int | None
    ) -> list[str]:
        reply = await self._run_queue(
            "listSessions", queue, max(skip, 0), top, _opt(updated_after_ms)
        )
        return [_sid_text(sid) or "" for sid in reply]

    async def session_infos(self, queue: QueueSpec) -> list[SessionInfo]:
        return [
            SessionInfo(
                session_id=_sid_text(sid) or "",
                message_count=count,
                locked_until_ms=locked_until,
                state_size=state_size,
                updated_ms=updated,
            )
            for sid, count, locked_until, state_size, updated in await self._run(
                "sessionInfos", queue, []
            )
        ]

    # --- settlement and locks ------------------------------------------------------------
    async def settle(
        self, entity: QueueSpec, settlements: list[Settlement], holder: str | None = None
    ) -> list[Condition | None]:
        if not settlements:
            return []
        args: list[Any] = [_entity(entity), _opt(holder)]
        for s in settlements:
            args += [
                s.token,
                s.outcome.value,
                _sid(s.session_id),
                _opt(s.dead_letter_reason),
                _opt(s.dead_letter_description),
                _opt(s.properties_patch),
            ]
        return [_refused(status)
                for status in await self._run_queue("settleMessages", entity, *args)]

    async def renew_message_locks(
        self, entity: QueueSpec, tokens: list[bytes], until_ms: int | None = None
    ) -> list[int]:
        if not tokens:
            return []
        reply = await self._run_queue("renewMessageLocks", entity, _entity(entity),
                                      _opt(until_ms), *tokens)
        _check(reply[0])
        return list(reply[1:])

    # --- lifecycle operations --------------------------------------------------------------
    async def peek(
        self, entity: QueueSpec, from_seq: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        rows = await self._run_queue(
            "peekMessages", entity, _entity(entity), from_seq, count, _sid(session_id)
        )
        return [_message(r) for r in rows]

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
            _entity(entity),
            1 if peek_lock else 0,
            _sid(session_id),
            _opt(holder),
            len(seqs),
            *seqs,
            *((_token_string(tokens, len(seqs)),) if peek_lock else ()),
        )
        _check(reply[0])
        return [_message(r) for r in reply[1:]]

    async def cancel_scheduled(self, queue: QueueSpec, seqs: list[int]) -> None:
        if seqs:
            _check(await self._run_queue("cancelScheduled", queue, *seqs))

    # --- auto-forwarding (docs/design.md §3.16) ---------------------------------------------
    async def take_forwarding(
        self, entity: QueueSpec, forwarder: str, count: int, tokens: Sequence[bytes]
    ) -> list[StoredMessage] | None:
        if count <= 0:
            return []
        if len(tokens) < count:
            raise ValueError("a forwarder takes one token per message")
        reply = await self._run_queue("forwardTake", entity, _entity(entity), forwarder, count,
                                      _token_string(tokens, count))
        if reply[0] != 0:
            return None
        return [_message(r) for r in reply[1:]]

    async def forward(
        self, entity: QueueSpec, destination: ForwardDestination,
        messages: list[ForwardedMessage], *, hop_limit: int,
    ) -> list[ForwardResult]:
        if not messages:
            return []
        _check_session_ids(m.session_id for m in messages)
        if not self.cross_slot_transactions:
            return await self._forward_in_steps(entity, destination, messages, hop_limit)
        assert self._scripts is not None
        keys = list(self._keys_for("forwardMessages", entity))
        keys.append(keyspace.catalog_key(self.prefix).encode())
        args: list[Any] = self._queue_args(entity) + [
            _entity(entity), destination.record, hop_limit]
        if destination.queue is not None:
            queue = destination.queue
            entity_name, subscription = queue.key_scope
            keys += [k.encode() for k in keyspace.keys(self.prefix, entity_name,
                                                        keyspace.QUEUE_KEYS, subscription)]
            args += ["q", *self._queue_args(queue), queue.duplicate_detection_window_ms or 0,
                     1 if queue.requires_session else 0, _opt(queue.default_ttl_ms)]
        elif destination.topic is not None:
            topic, subs = destination.topic, destination.subscriptions
            names = tuple(sub.subscription or "" for sub in subs)
            keys += self._topic_keys("publishMessages", topic.name, names)
            args += ["t", topic.name, len(subs)]
            for sub, name in zip(subs, names):
                args += self._queue_args(sub)
                args[-6] = name  # the subscription's own name: what `subs` holds
            args.append(topic.duplicate_detection_window_ms or 0)
            for sub in subs:
                args += [1 if sub.requires_session else 0, _opt(sub.default_ttl_ms)]
        else:
            args.append("")
        for m in messages:
            args += [m.token, _sid(m.session_id), _opt(m.message_id)]
            args += _placement_args(m.placements)
        await self._acquire()
        try:
            reply = await self._scripts.run("forwardMessages", keys, args)
        finally:
            self._slots.release()
        return [ForwardResult(r) for r in reply]

    async def _forward_in_steps(
        self, entity: QueueSpec, destination: ForwardDestination,
        messages: list[ForwardedMessage], hop_limit: int,
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
                settle += [m.token, FORWARD_GONE_REASON,
                           f"The forwarding destination '{name}' does not exist."]
            elif m.hops >= hop_limit:
                settle += [m.token, FORWARD_HOPS_REASON, FORWARD_HOPS_DESCRIPTION]
            else:
                moving.append(m)
                at.append(i)
                settle += [m.token, "", ""]
        records = [self._forward_record(entity, m) for m in moving]
        if moving:
            await self._forward_enqueue(entity, destination, moving, records, [])
        results = [ForwardResult(r) for r in await self._run_queue(
            "forwardSettle", entity, _entity(entity), *settle)]
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
        self, entity: QueueSpec, destination: ForwardDestination,
        moving: list[ForwardedMessage], records: list[str], forget: list[str],
    ) -> None:
        per_message: list[Any] = []
        for m, record in zip(moving, records):
            taken = m.message
            assert taken is not None
            ttl = None if taken.expires_ms is None else taken.expires_ms - taken.enqueued_ms
            dead = entity.dlq
            per_message += [
                record, taken.blob, _sid(m.session_id), _opt(m.message_id),
                taken.enqueue_seq or taken.seq, m.hops + 1, entity.name if dead else "",
                _opt(taken.dead_letter_reason if dead else None),
                _opt(taken.dead_letter_description if dead else None),
                _opt(taken.properties_patch), _opt(ttl),
            ]
            if destination.topic is not None:
                per_message += _placement_args(m.placements)
        if destination.queue is not None:
            queue = destination.queue
            await self._run_queue(
                "forwardEnqueue", queue, queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0, _opt(queue.default_ttl_ms),
                len(forget), *forget, *per_message)
            return
        assert destination.topic is not None
        topic, subs = destination.topic, destination.subscriptions
        args: list[Any] = [topic.duplicate_detection_window_ms or 0]
        for sub in subs:
            args += [1 if sub.requires_session else 0, _opt(sub.default_ttl_ms)]
        args += [len(forget), *forget, *per_message]
        await self._run_topic("forwardPublish", topic.name, subs, args)

    # --- housekeeping ---------------------------------------------------------------------
    async def stop_waiting(self, queue: QueueSpec, waiters: str, waiter: str) -> bool:
        return bool(await self._run_queue("stopWaiting", queue, waiters, waiter))

    async def sweep(self, queue: QueueSpec) -> SweepResult:
        reply = await self._run_queue(
            "sweepQueue", queue, self.process_id, LIVENESS_MS, REPAIR_WAKES, budget=SWEEP_BUDGET
        )
        return SweepResult(
            expired_message_locks=reply[0],
            expired_messages=reply[1],
            activated_scheduled=reply[2],
            expired_session_locks=[_sid_text(sid) or "" for sid in reply[3:]],
        )

    async def purge(self, entity: QueueSpec) -> int:
        return await self._run_queue("purgeEntity", entity, _entity(entity))

    async def resubmit_dead_letters(self, queue: QueueSpec, limit: int) -> int:
        if limit <= 0:
            return 0
        moved, _ = await self._run_queue(
            "resubmitDeadLetters",
            queue,
            1 if queue.requires_session else 0,
            _opt(queue.default_ttl_ms),
            limit,
        )
        return moved

    async def counts(self, entity: QueueSpec) -> EntityCounts:
        reply = await self._run_queue("countEntity", entity, _entity(entity))
        active, locked, scheduled, deferred, dead_letter, sessions, locked_sessions = reply[:7]
        totals = reply[7:]
        return EntityCounts(
            active=active,
            locked=locked,
            scheduled=scheduled,
            deferred=deferred,
            dead_letter=dead_letter,
            sessions=sessions,
            locked_sessions=locked_sessions,
            totals={
                name.decode(): count for name, count in zip(totals[0::2], totals[1::2])
            },
        )

    # --- transactions (docs/design.md §3.15) ----------------------------------------------
    async def stage_transaction(
        self, via: QueueSpec | TopicSpec, txn_id: bytes, operations: list[StagedOperation], *,
        first: bool, timeout_ms: int, limit: int,
    ) -> tuple[int, int]:
        _check_session_ids(_staged_session_ids(operations))
        args: list[Any] = [txn_id, timeout_ms, limit, 1 if first else 0, len(operations)]
        for op in operations:
            fields = _staged_fields(op)
            args.append(len(fields))
            args += fields
        reply = await self._run("stageTransaction", via, args)
        if reply[0] == ScriptStatus.TRANSACTION_TIMEOUT:
            raise BusdError(Condition.TRANSACTION_TIMEOUT, "The transaction timed out.")
        if reply[0] == ScriptStatus.RESOURCE_LIMIT:
            raise BusdError(
                Condition.RESOURCE_LIMIT,
                f"A transaction cannot hold more than {limit} operations.",
            )
        return reply[0], reply[1]

    async def commit_transaction(
        self, via: QueueSpec | TopicSpec, others: list[QueueSpec], txn_id: bytes,
        topics: Sequence[tuple[TopicSpec, list[QueueSpec]]] = (),
    ) -> None:
        queues = ([via] if isinstance(via, QueueSpec) else []) + list(others)
        keys = list(self._keys_for("commitTransaction", via))
        args: list[Any] = [txn_id, len(keyspace.QUEUE_KEYS), len(queues)]
        for queue in queues:
            keys += self._keys_for("sendMessages", queue)
            args += self._queue_args(queue) + [
                queue.duplicate_detection_window_ms or 0,
                1 if queue.requires_session else 0,
            ]
        args.append(len(topics))
        for topic, subscriptions in topics:
            names = tuple(s.subscription or "" for s in subscriptions)
            keys += self._topic_keys("publishMessages", topic.name, names)
            args += [topic.name, len(subscriptions)]
            for spec, name in zip(subscriptions, names):
                args += [name] + self._queue_args(spec)[1:]
            args.append(topic.duplicate_detection_window_ms or 0)
            for spec in subscriptions:
                args += [1 if spec.requires_session else 0, _opt(spec.default_ttl_ms)]
        assert self._scripts is not None
        await self._acquire()
        try:
            reply = await self._scripts.run("commitTransaction", keys, args)
        finally:
            self._slots.release()
        status = reply[0]
        if status == ScriptStatus.OK:
            return
        if status == ScriptStatus.TRANSACTION_TIMEOUT:
            raise BusdError(Condition.TRANSACTION_TIMEOUT, "The transaction timed out.")
        if status == ScriptStatus.UNKNOWN_ENTITY:
            raise BusdError(Condition.TRANSACTION_ROLLBACK,
                            "The transaction names an entity it was not committed with.")
        _check(status)

    async def reserve_sequence_numbers(
        self, queue: QueueSpec | TopicSpec, count: int
    ) -> list[int]:
        if count <= 0:
            return []
        last = await self._run("reserveSequenceNumbers", queue, [count])
        return list(range(last - count + 1, last + 1))

    async def discard_transaction(self, via: QueueSpec | TopicSpec, txn_id: bytes) -> None:
        await self._run("discardTransaction", via, [txn_id])

    async def sweep_transactions(self, queue: QueueSpec | TopicSpec) -> int:
        return await self._run("sweepTransactions", queue, [SWEEP_BUDGET])


def _placement_fields(c: Placement) -> list[Any]:
    """A copy's fields after its subscription, as lua/includes/fanOutMessage.lua reads them."""
    flags = ((1 if c.blob is not None else 0) | (2 if c.own_session_id else 0)
             | (4 if c.own_ttl else 0) | (8 if c.dead_letter is not None else 0))
    reason, description = c.dead_letter or ("", "")
    return [flags, _opt(c.blob), _sid(c.session_id), _opt(c.ttl_ms), reason, description]


def _placement_args(copies: list[Placement] | None) -> list[Any]:
    """A message's placements as lua/includes/fanOutMessage.lua takes them: their number (-1:
    every subscription, unchanged), then the subscription and fields of each."""
    if copies is None:
        return [-1]
    args: list[Any] = [len(copies)]
    for c in copies:
        if c.own_session_id:
            _check_session_ids([c.session_id])
        args += [c.subscription + 1, *_placement_fields(c)]
    return args


def _staged_session_ids(operations: list[StagedOperation]) -> list[str | None]:
    ids: list[str | None] = []
    for op in operations:
        if isinstance(op, (StagedSend, StagedPublish)):
            ids.append(op.message.session_id)
            if isinstance(op, StagedPublish):
                ids += [c.session_id for c in op.placements if c.own_session_id]
        elif isinstance(op, StagedSettlement):
            ids.append(op.settlement.session_id)
        elif isinstance(op, StagedSessionState):
            ids.append(op.session_id)
    return ids


def _staged_fields(op: StagedOperation) -> list[Any]:
    """The record lua/stageTransaction-2.lua keeps per operation (the kinds and fields of
    lua/commitTransaction.lua)."""
    if isinstance(op, StagedSend):
        m = op.message
        return ["s", op.queue.name, m.blob, _sid(m.session_id), _opt(m.message_id),
                _opt(_effective_ttl(op.queue, m)), _opt(m.scheduled_ms), _opt(op.seq)]
    if isinstance(op, StagedPublish):
        m = op.message
        fields = ["p", op.topic.name, m.blob, _sid(m.session_id), _opt(m.message_id),
                  _opt(_effective_ttl(op.topic, m)), _opt(m.scheduled_ms), _opt(op.seq),
                  len(op.placements)]
        for c in op.placements:
            fields += [op.subscriptions[c.subscription], *_placement_fields(c)]
        return fields
    if isinstance(op, StagedSettlement):
        s = op.settlement
        return ["x", op.entity.name, _entity(op.entity), s.token, s.outcome.value,
                _sid(s.session_id), _opt(s.dead_letter_reason), _opt(s.dead_letter_description),
                _opt(s.properties_patch), _opt(op.holder)]
    if isinstance(op, StagedSessionState):
        return ["t", op.queue.name, _sid(op.session_id), op.holder, 0 if op.state is None else 1,
                op.state or b""]
    if isinstance(op, StagedCancel):
        return ["c", op.queue.name, op.seq]
    raise TypeError(f"not a staged operation: {op!r}")
