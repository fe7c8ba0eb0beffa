"""Loads the Lua scripts: one file per atomic state transition.

A script that works on a queue says so once in its header, `Context: queue`: it takes the
queue's whole key set (`busd.storage.keys.QUEUE_KEYS`, in that order) and the QUEUE_ARGC
parameters of `lua/includes/queueContext.lua` first (`QUEUE_ARGC` below is read from there;
a header writes it `c`, the script's own arguments starting at `ARGV[c+1]`), and its file is
`lua/<verbNoun>.lua`. A script that works on a topic says `Context: topic`: it takes the
topic's keys (`TOPIC_KEYS`, `lua/includes/topicContext.lua`) and then, for each subscription
the call names, that subscription's whole queue key set, in the call's order (the number
varies by call). The few scripts that list their own keys are `lua/<verbNoun>-<N>.lua`, N
being the number of KEYS, and their header lists each key as `KEYS[i]  <name>` with the
logical names of `busd.storage.keys`. Either way the loader builds each call's KEYS from the
header, so the Python side cannot drift from what the script declares. `--- @include
"<name>"` lines pull in `lua/includes/<name>.lua` (one small local function each) before the
line's place, dependencies first, each include once.

The loaded text starts with a `#!lua` shebang: a script with one (even without flags) is
checked by the server, in cluster mode, to touch only keys of the slot its KEYS hash to, so
a key built inside a script with another hash tag fails loudly instead of working by luck.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hiredis
from redis.asyncio import Redis as PlainRedis
from redis.exceptions import ConnectionError as StoreConnectionError
from redis.exceptions import (
    DataError,
    InvalidResponse,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import TimeoutError as StoreTimeoutError

from busd.storage.api import StoreUnavailable
from busd.storage.keys import QUEUE_KEYS, TOPIC_KEYS, TRANSACTION_KEYS

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.connection import AbstractConnection
    from redis.commands.core import AsyncScript

log = logging.getLogger("busd.storage")

LUA_DIR = Path(__file__).with_name("lua")
INCLUDE_DIR = LUA_DIR / "includes"

_FILE_NAME = re.compile(r"^(?P<name>[a-z][A-Za-z]*)(?:-(?P<keys>\d+))?\.lua$")
_CONTEXT = re.compile(r"^\s*Context:\s*(?P<name>\w+)\s*$", re.M)
# The contexts a header may name, and the keys each one stands for.
# `transaction`: the via entity's staged transactions; the caller adds the contexts of the
# queues and topics the transaction names after them (lua/commitTransaction.lua).
CONTEXTS: dict[str, tuple[str, ...]] = {
    "queue": QUEUE_KEYS,
    "topic": TOPIC_KEYS,
    "transaction": TRANSACTION_KEYS,
}
# The keys a context repeats once per subscription named by the call.
PER_SUBSCRIPTION: dict[str, tuple[str, ...]] = {"queue": (), "topic": QUEUE_KEYS,
                                                "transaction": ()}
_INCLUDE = re.compile(r'^\s*---\s*@include\s+"(?P<name>[A-Za-z]+)"\s*$')
SHEBANG = "#!lua\n"
_HEADER_KEY = re.compile(r"^\s*KEYS\[(?P<index>\d+)\]\s+(?P<name>\S+)")
_QUEUE_ARGC = re.compile(r"^local QUEUE_ARGC = (?P<argc>\d+)$", re.M)
_CONTEXT_ARG = re.compile(r"ARGV\[ab \+ (?P<index>\d+)\]")

# How long the server waits for the fsync or the replica before the batch is refused.
DURABILITY_WAIT_MS = 1000
# --durability (docs/design.md §3.9): the commands that must confirm a batch of calls before
# any of them is answered. WAITAOF 1 0: in the primary's append-only file, on disk. WAIT 1:
# and received by a replica (WAITAOF 1 1, a replica's disk too, took 0.3 to 1 s a batch,
# since replicas report their fsyncs lazily: in memory on a replica is what a failover needs).
_WAITAOF = (b"WAITAOF", b"1", b"0", b"%d" % DURABILITY_WAIT_MS)
_WAIT = (b"WAIT", b"1", b"%d" % DURABILITY_WAIT_MS)
DURABILITY: dict[str, tuple[tuple[bytes, ...], ...]] = {
    "local": (),  # nothing more than running it (the server's own fsync policy)
    "fsync": (_WAITAOF,),
    "replicated": (_WAITAOF, _WAIT),
}


class ScriptError(Exception):
    """A script file that breaks the conventions above."""


def read_queue_argc(path: Path = INCLUDE_DIR / "queueContext.lua") -> int:
    """The number of a queue context's parameters, as lua/includes/queueContext.lua declares
    it (`local QUEUE_ARGC = <n>`) and its function reads them (ARGV[ab+1 .. ab+n])."""
    text = path.read_text()
    declared = _QUEUE_ARGC.search(text)
    if declared is None:
        raise ScriptError(f"{path.name}: no `local QUEUE_ARGC = <n>` line")
    argc = int(declared["argc"])
    read = {int(i) for i in _CONTEXT_ARG.findall(text)}
    if read != set(range(1, argc + 1)):
        raise ScriptError(f"{path.name}: QUEUE_ARGC is {argc}, the context reads ARGV[ab+i] "
                          f"for i in {sorted(read)}")
    return argc


# What a `Context: queue` script takes after the queue's keys, before its own arguments; the
# store's queue_context_args (busd/storage/redis_codec.py) builds them.
QUEUE_ARGC = read_queue_argc()


@dataclass(frozen=True, slots=True)
class ScriptSource:
    name: str  # verbNoun, e.g. "sendMessages"
    num_keys: int  # how many KEYS a call passes
    key_names: tuple[str, ...]  # logical key names, from the header, in KEYS order
    context: str | None  # the context the header names ("queue", "topic"), None for own keys
    text: str  # with includes resolved
    path: Path
    # logical key names that follow key_names once per subscription the call names (topic)
    per_subscription: tuple[str, ...] = ()


def header_of(text: str) -> str:
    """The leading `--[[ ... ]]` block of a script."""
    start = text.find("--[[")
    end = text.find("]]", start)
    if start != 0 or end < 0:
        raise ScriptError("a script must open with a --[[ ... ]] header")
    return text[start : end + 2]


def resolve_includes(text: str, seen: set[str] | None = None) -> str:
    seen = set() if seen is None else seen
    out: list[str] = []
    for line in text.splitlines():
        match = _INCLUDE.match(line)
        if not match:
            out.append(line)
            continue
        name = match["name"]
        if name in seen:
            continue
        seen.add(name)
        path = INCLUDE_DIR / f"{name}.lua"
        if not path.is_file():
            raise ScriptError(f"include {name!r} not found at {path}")
        out.append(resolve_includes(path.read_text(), seen))
    return "\n".join(out)


def read_source(path: Path) -> ScriptSource:
    match = _FILE_NAME.match(path.name)
    if not match:
        raise ScriptError(f"{path.name}: script files are named <verbNoun>[-<N>].lua")
    raw = path.read_text()
    header = header_of(raw)
    declared: dict[int, str] = {}
    for line in header.splitlines():
        key = _HEADER_KEY.match(line)
        if key:
            declared[int(key["index"])] = key["name"]
    context = _CONTEXT.search(header)
    if context is not None:
        if context["name"] not in CONTEXTS:
            raise ScriptError(f"{path.name}: unknown context {context['name']!r}")
        if match["keys"] is not None or declared:
            raise ScriptError(
                f"{path.name}: a script with a context neither lists KEYS nor counts them "
                "in its file name"
            )
        key_names = CONTEXTS[context["name"]]
    else:
        if match["keys"] is None:
            raise ScriptError(f"{path.name}: without a context the file name counts the KEYS")
        num_keys = int(match["keys"])
        if sorted(declared) != list(range(1, num_keys + 1)):
            raise ScriptError(
                f"{path.name}: header declares KEYS {sorted(declared)}, file name says {num_keys}"
            )
        key_names = tuple(declared[i] for i in range(1, num_keys + 1))
    return ScriptSource(
        name=match["name"],
        num_keys=len(key_names),
        key_names=key_names,
        context=context["name"] if context is not None else None,
        text=SHEBANG + resolve_includes(raw),
        path=path,
        per_subscription=PER_SUBSCRIPTION[context["name"]] if context is not None else (),
    )


def load_sources(directory: Path = LUA_DIR) -> dict[str, ScriptSource]:
    return {s.name: s for s in map(read_source, sorted(directory.glob("*.lua")))}


class Scripts:
    """The scripts registered with one client.

    On a single server each call is one EVALSHA written as a pre-encoded command, pipelined
    on one connection of our own (`_Pipe`): the part that repeats (script hash, the queue's
    keys) is encoded once per script and queue; the calls of one event-loop turn go out in one
    write and their answers come back in one read, in order; and a call skips redis-py's
    per-command machinery (pool, retries, observability hooks). Per call, that machinery and
    a socket write and read each cost more than the rest of a store call, in busd and in the
    server alike. The server runs scripts one at a time anyway, so one connection loses it no
    concurrency. The caller bounds the calls in flight (RedisStore._slots). A call is never
    retried: a script that ran must not run twice. On a cluster, redis-py's Script objects
    route each call to the node owning the queue's slot. Either way a server that lost the
    scripts (NOSCRIPT: restarted, failed over, flushed) gets them again."""

    def __init__(self, client: Redis, sources: dict[str, ScriptSource] | None = None,
                 durability: str = "local") -> None:
        self.sources = sources if sources is not None else load_sources()
        self._client = client
        self._registered: dict[str, AsyncScript] = {
            name: client.register_script(src.text) for name, src in self.sources.items()
        }
        self._sha = {
            name: hashlib.sha1(src.text.encode()).hexdigest().encode()
            for name, src in self.sources.items()
        }
        # Only a plain client has one pool for every key; a cluster client routes per slot.
        pool = client.connection_pool if type(client) is PlainRedis else None
        self._pipe = _Pipe(pool, DURABILITY[durability]) if pool is not None else None
        # (script, keys) -> (number of KEYS, encoded 'EVALSHA <sha> <numkeys> <keys...>')
        self._heads: dict[tuple[str, tuple[Any, ...]], tuple[int, bytes]] = {}

    async def preload(self) -> None:
        """Load every script now, so that the first calls need no NOSCRIPT round trip."""
        for src in self.sources.values():
            await self._client.script_load(src.text)

    async def close(self) -> None:
        if self._pipe is not None:
            await self._pipe.close()

    async def run(self, name: str, keys: list[str] | list[bytes], args: list[Any]) -> Any:
        pipe = self._pipe
        if pipe is None:
            return await self._registered[name](keys=keys, args=args)
        command = self._command(name, keys, args)
        try:
            return await pipe.call(command, name)
        except NoScriptError:
            pass
        await self._client.script_load(self.sources[name].text)
        return await pipe.call(command, name)

    def _command(self, name: str, keys: list[str] | list[bytes], args: list[Any]) -> bytes:
        """The RESP encoding of `EVALSHA <sha> <numkeys> <keys...> <args...>`."""
        cache_key = (name, tuple(keys))
        head = self._heads.get(cache_key)
        if head is None:
            parts = [_bulk(b"EVALSHA"), _bulk(self._sha[name]), _bulk(b"%d" % len(keys))]
            parts += [_bulk(_encode(k)) for k in keys]
            head = (len(keys), b"".join(parts))
            # A transaction's commit names whatever entities it touched: kept, its key sets
            # would grow the cache without end.
            if self.sources[name].context != "transaction":
                self._heads[cache_key] = head
        parts = [b"*%d\r\n" % (3 + head[0] + len(args)), head[1]]
        for arg in args:
            value = _encode(arg)
            parts.append(b"$%d\r\n" % len(value))
            parts.append(value)
            parts.append(b"\r\n")
        return b"".join(parts)


class _Pipe:
    """One connection to the server whose calls are pipelined: each call's command is queued
    and the queue written once per event-loop turn; a reader matches the answers to the calls
    in order. A call whose caller stopped waiting (cancelled, timed out) keeps its place: its
    answer is read and dropped, so the calls behind it still get their own. When the
    connection breaks, every call without an answer fails (it may or may not have run, as
    with any lost connection) and the next call connects again; so does a READONLY answer
    (the server was a primary and is now a replica: the next connection finds the new one).

    With a `durability` (DURABILITY's commands), each batch written is followed by those
    waits, which cover every call of the batch (they wait for this connection's writes):
    the answers of the batch are held until the waits answered, then given, or, when the
    server could not confirm them in time, replaced by StoreUnavailable
    (com.microsoft:server-busy): never acknowledged as durable what was not."""

    def __init__(self, pool: Any, durability: tuple[tuple[bytes, ...], ...] = ()) -> None:
        self._pool = pool
        self._wait = b"".join(_command(*c) for c in durability) or None
        self._waits = len(durability)  # answers of waits a batch has
        self._waited = 0  # of which this many came for the batch being read
        self._batch_confirmed = True
        self._held: list[tuple[asyncio.Future[Any], Any]] = []  # answers awaiting the waits
        self._confirmed = True  # the last batch's verdict, to log changes only
        # The client's socket time-out (redis-py's default: 5 s) bounds a whole call.
        self._timeout: float | None = pool.make_connection().socket_timeout
        self._conn: AbstractConnection | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        # (answer, script, deadline) of the calls sent, in that order; a batch's WAITAOF has
        # no answer of its own (None)
        self._waiting: deque[tuple[asyncio.Future[Any] | None, str, float]] = deque()
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._watch_handle: asyncio.TimerHandle | None = None

    async def call(self, command: bytes, name: str) -> Any:
        if self._writer is None:
            await self._connect()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        timeout = self._timeout
        self._waiting.append((answer, name, loop.time() + timeout if timeout else 0.0))
        if timeout and self._watch_handle is None:
            self._watch_handle = loop.call_later(timeout, self._watch)
        self._out.append(command)
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        return await answer

    def _watch(self) -> None:
        """Fail the calls unanswered for longer than the time-out (one timer for all calls, not
        one each: answers come in the order sent, so the deadlines do too)."""
        self._watch_handle = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for answer, name, deadline in self._waiting:
            if deadline > now:
                self._watch_handle = loop.call_at(deadline, self._watch)
                return
            if answer is not None and not answer.done():
                answer.set_exception(
                    StoreTimeoutError(f"{name}: no answer within {self._timeout} s"))

    def _flush(self) -> None:
        self._flush_handle = None
        out, self._out = self._out, []
        if self._writer is not None and out:
            if self._wait is not None:  # waits for the whole batch, never per call
                out.append(self._wait)
                deadline = self._waiting[-1][2]
                self._waiting.extend([(None, "WAIT", deadline)] * self._waits)
            self._writer.write(b"".join(out))

    async def _connect(self) -> None:
        if self._connecting is not None:  # another call is connecting: wait for it
            await asyncio.shield(self._connecting)
            return
        self._connecting = asyncio.get_running_loop().create_future()
        try:
            conn = self._pool.make_connection()
            conn.socket_timeout = None  # bounded per call instead
            await conn.connect()  # the client's handshake: TLS, AUTH, SELECT, CLIENT SETNAME
            self._conn = conn
            self._writer = conn._writer
            parser = conn._parser
            reader = hiredis.Reader(protocolError=InvalidResponse, replyError=parser.parse_error)
            # Named as busd's other long-lived tasks are: it lives as long as the connection.
            self._reading = asyncio.get_running_loop().create_task(
                self._read(conn._reader, reader), name="busd-store-reader")
            self._connecting.set_result(None)
        except BaseException as exc:
            self._connecting.set_exception(exc)
            self._connecting.exception()  # retrieved: only the waiters raise it
            raise
        finally:
            self._connecting = None

    async def _read(self, stream: asyncio.StreamReader, reader: Any) -> None:
        waiting = self._waiting
        try:
            while True:
                data = await stream.read(65536)
                if not data:
                    raise StoreConnectionError("Connection closed by server.")
                reader.feed(data)
                while (reply := reader.gets()) is not False:
                    answer = waiting.popleft()[0]
                    if self._wait is not None:
                        if answer is None:
                            self._waited_for(reply)
                        else:
                            self._held.append((answer, reply))
                    elif answer is None or answer.done():  # its caller stopped waiting
                        continue
                    elif isinstance(reply, ResponseError):
                        answer.set_exception(reply)
                    else:
                        answer.set_result(reply)
                    if type(reply) is ReadOnlyError:
                        raise StoreConnectionError("the server is now a replica")
        except asyncio.CancelledError:  # close()
            self._broken(StoreConnectionError("The store client is closed."))
            raise
        except Exception as exc:
            conn = self._broken(exc if isinstance(exc, StoreConnectionError)
                                else StoreConnectionError(str(exc)))
            if conn is not None:
                await conn.disconnect()

    def _waited_for(self, reply: Any) -> None:
        """A wait of the batch answered `reply` (WAITAOF: [fsynced locally, replicas]; WAIT:
        replicas): once all have, give the batch's held answers."""
        confirmed = reply[0] >= 1 if isinstance(reply, list) else (
            isinstance(reply, int) and reply >= 1)
        self._batch_confirmed = self._batch_confirmed and confirmed
        self._waited += 1
        if self._waited < self._waits:
            return
        confirmed, self._batch_confirmed, self._waited = self._batch_confirmed, True, 0
        held = self._held[:]
        self._held.clear()
        if confirmed != self._confirmed:  # changes only: not once per batch
            self._confirmed = confirmed
            if confirmed:
                log.warning("the store confirms writes as durable again")
            else:
                log.warning("the store did not confirm writes as durable (%s): they are "
                            "refused until it does", reply)
        refused = None if confirmed else StoreUnavailable(
            f"the store did not confirm the writes as durable in {DURABILITY_WAIT_MS} ms")
        for answer, result in held:
            if answer.done():
                continue
            if refused is not None:
                answer.set_exception(refused)
            elif isinstance(result, ResponseError):
                answer.set_exception(result)
            else:
                answer.set_result(result)

    def _broken(self, exc: Exception) -> AbstractConnection | None:
        """Forget the connection (returned, to be closed) and fail the calls it owes."""
        conn, self._conn, self._writer, self._reading = self._conn, None, None, None
        waiting, self._waiting = self._waiting, deque()
        held = [answer for answer, _ in self._held]
        self._held.clear()
        self._waited, self._batch_confirmed = 0, True
        self._out = []
        if self._watch_handle is not None:
            self._watch_handle.cancel()
            self._watch_handle = None
        for answer in held + [answer for answer, _, _ in waiting]:
            if answer is not None and not answer.done():
                answer.set_exception(exc)
        return conn

    async def close(self) -> None:
        reading, conn = self._reading, self._conn
        if reading is not None:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        if conn is not None:
            await conn.disconnect()


def _command(*parts: bytes) -> bytes:
    """The RESP encoding of a command."""
    return b"*%d\r\n" % len(parts) + b"".join(map(_bulk, parts))


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _encode(value: Any) -> bytes:
    """An argument as redis-py would send it: bytes as they are, text as UTF-8, numbers as
    their decimal text."""
    kind = type(value)
    if kind is bytes:
        return value
    if kind is str:
        return value.encode()
    if kind is int:
        return b"%d" % value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode()
    raise DataError(f"Invalid input of type: {type(value).__name__!r}")
