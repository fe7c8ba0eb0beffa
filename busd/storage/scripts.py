"""Loads the Lua scripts: one file per atomic state transition.

A script that works on a queue says so once in its header, `Context: queue`: it takes the
queue's whole key set (`busd.storage.keys.QUEUE_KEYS`, in that order) and the six parameters
of `lua/includes/queueContext.lua` first, and its file is `lua/<verbNoun>.lua`. A script that
works on a topic says `Context: topic`: it takes the topic's keys (`TOPIC_KEYS`,
`lua/includes/topicContext.lua`) and then, for each subscription the call names, that
subscription's whole queue key set, in the call's order (the number varies by call). The few scripts
that list their own keys are `lua/<verbNoun>-<N>.lua`, N being the number of KEYS, and their
header lists each key as `KEYS[i]  <name>` with the logical names of `busd.storage.keys`. Either
way the loader builds each call's KEYS from the header, so the Python side cannot drift from
what the script declares. `--- @include "<name>"` lines pull in `lua/includes/<name>.lua` (one
small local function each) before the line's place, dependencies first, each include once.

The loaded text starts with a `#!lua` shebang: a script with one (even without flags) is
checked by the server, in cluster mode, to touch only keys of the slot its KEYS hash to, so
a key built inside a script with another hash tag fails loudly instead of working by luck.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis as PlainRedis
from redis.exceptions import DataError, NoScriptError
from redis.exceptions import TimeoutError as StoreTimeoutError

from busd.storage.keys import QUEUE_KEYS, TOPIC_KEYS, TRANSACTION_KEYS

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.connection import AbstractConnection
    from redis.commands.core import AsyncScript

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


class ScriptError(Exception):
    """A script file that breaks the conventions above."""


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

    On a single server each call is one EVALSHA written as a pre-encoded command on a
    connection of our own: the part that repeats (script hash, the queue's keys) is encoded
    once per script and queue, and the call skips redis-py's per-command machinery (pool lock,
    retries, observability hooks), which cost more than the rest of a store call. The caller
    bounds the calls in flight (RedisStore._slots), hence the connections kept here. A call is
    never retried: a script that ran must not run twice. On a cluster, redis-py's Script
    objects route each call to the node owning the queue's slot. Either way a server that lost
    the scripts (NOSCRIPT: restarted, failed over, flushed) gets them again."""

    def __init__(self, client: Redis, sources: dict[str, ScriptSource] | None = None) -> None:
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
        self._pool = client.connection_pool if type(client) is PlainRedis else None
        self._idle: list[AbstractConnection] = []
        # The client's socket time-out bounds a whole call (one timer, not one per read and
        # write).
        self._timeout: float | None = None
        if self._pool is not None:
            self._timeout = self._pool.make_connection().socket_timeout
        # (script, keys) -> (number of KEYS, encoded 'EVALSHA <sha> <numkeys> <keys...>')
        self._heads: dict[tuple[str, tuple[Any, ...]], tuple[int, bytes]] = {}

    async def preload(self) -> None:
        """Load every script now, so that the first calls need no NOSCRIPT round trip."""
        for src in self.sources.values():
            await self._client.script_load(src.text)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()

    async def run(self, name: str, keys: list[str] | list[bytes], args: list[Any]) -> Any:
        if self._pool is None:
            return await self._registered[name](keys=keys, args=args)
        command = self._command(name, keys, args)
        conn = await self._connection()
        try:
            async with asyncio.timeout(self._timeout):
                await conn.send_packed_command(command, check_health=False)
                try:
                    return await conn.read_response()
                except NoScriptError:
                    pass
                await self._client.script_load(self.sources[name].text)
                await conn.send_packed_command(command, check_health=False)
                return await conn.read_response()
        except TimeoutError:  # the call was cancelled half-way: the connection disconnected
            raise StoreTimeoutError(f"{name}: no answer within {self._timeout} s") from None
        finally:
            # Broken by an error, it is disconnected and connects again on its next use.
            self._idle.append(conn)

    async def _connection(self) -> AbstractConnection:
        assert self._pool is not None
        if not self._idle:
            conn = self._pool.make_connection()  # connects on its first command
            conn.socket_timeout = None  # bounded by run() instead
            return conn
        conn = self._idle.pop()
        reader = getattr(conn, "_reader", None)
        if reader is not None and reader.at_eof():
            # The server closed it while it was idle (restart, idle time-out): nothing was sent
            # on it yet, so it just connects again.
            await conn.disconnect()
        return conn

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
