"""Loads the Lua scripts: one file per atomic state transition.

A script that works on a queue says so once in its header, `Context: queue`: it takes the
queue's context key (`busd.storage.keys.context_key`, from which
`lua/includes/queueKeys.lua` names the keys of `QUEUE_KEYS`) and the QUEUE_ARGC
parameters of `lua/includes/queueContext.lua` first (`QUEUE_ARGC` below is read from there;
a header writes it `c`, the script's own arguments starting at `ARGV[c+1]`), and its file is
`lua/<verbNoun>.lua`. A script that works on a topic says `Context: topic`: it takes the
topic's keys (`TOPIC_KEYS`, `lua/includes/topicContext.lua`) and then, for each subscription
the call names, that subscription's context key, in the call's order (the number
varies by call). The few scripts that list their own keys are `lua/<verbNoun>-<N>.lua`, N
being the number of KEYS, and their header lists each key as `KEYS[i]  <name>` with the
logical names of `busd.storage.keys`. Either way the loader builds each call's KEYS from the
header, so the Python side cannot drift from what the script declares. `--- @include
"<name>"` lines pull in `lua/includes/<name>.lua` (one small local function each) before the
line's place, dependencies first, each include once.

The server gets the scripts as one Functions library (`build_library`): its chunk defines
each include once, each script is a function of it. A script's own text (`ScriptSource.text`,
includes resolved) starts with a `#!lua` shebang, as the library does: a script or function
with one (even without flags) is checked by the server, in cluster mode, to touch only keys
of the slot its KEYS hash to, so a key built inside a script with another hash tag fails
loudly instead of working by luck.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis as PlainRedis
from redis.exceptions import ResponseError

from busd.storage.keys import (
    QUEUE_CONTEXT,
    QUEUE_KEYS,
    SHARED_WITH_TOPIC,
    TOPIC_KEYS,
    TRANSACTION_KEYS,
)
from busd.storage.redis.cluster import ShardPipelines
from busd.storage.redis.pipeline import DURABILITY, PipelinedConnection, bulk, encode, resp_command

if TYPE_CHECKING:
    from redis.asyncio import Redis


LUA_DIR = Path(__file__).with_name("lua")
INCLUDE_DIR = LUA_DIR / "includes"

_FILE_NAME = re.compile(r"^(?P<name>[a-z][A-Za-z]*)(?:-(?P<keys>\d+))?\.lua$")
_CONTEXT = re.compile(r"^\s*Context:\s*(?P<name>\w+)\s*$", re.M)
# The contexts a header may name, and the keys each one stands for.
# `transaction`: the via entity's staged transactions; the caller adds the contexts of the
# queues and topics the transaction names after them (lua/commitTransaction.lua).
CONTEXTS: dict[str, tuple[str, ...]] = {
    "queue": (QUEUE_CONTEXT,),
    "topic": TOPIC_KEYS,
    "transaction": TRANSACTION_KEYS,
}
# The keys a context repeats once per subscription named by the call.
PER_SUBSCRIPTION: dict[str, tuple[str, ...]] = {
    "queue": (),
    "topic": (QUEUE_CONTEXT,),
    "transaction": (),
}
_INCLUDE = re.compile(r'^\s*---\s*@include\s+"(?P<name>[A-Za-z]+)"\s*$')
SHEBANG = "#!lua\n"
_HEADER_KEY = re.compile(r"^\s*KEYS\[(?P<index>\d+)\]\s+(?P<name>\S+)")
_CONTEXT_ARG = re.compile(r"ARGV\[ab \+ (?P<index>\d+)\]")
_CONTEXT_KEY = re.compile(r"KEYS\[kb \+ (?P<index>\d+)\]")
QUEUE_CONTEXT_LUA = INCLUDE_DIR / "queueContext.lua"
QUEUE_KEY_NAMES_LUA = INCLUDE_DIR / "queueKeys.lua"
_NAMED_KEY = re.compile(r"\b(?P<kind>[kt])\('(?P<name>[a-z.]+)'\)")
TOPIC_CONTEXT = INCLUDE_DIR / "topicContext.lua"


class ScriptError(Exception):
    """A script file that breaks the conventions above."""


def read_context_width(path: Path, name: str, reads: re.Pattern[str], what: str) -> int:
    """A width `path` declares (`local <name> = <n>`) that its function reads all of:
    `reads` finds exactly the indexes 1 .. n (of `what`, for the error)."""
    text = path.read_text()
    declared = re.search(rf"^local {name} = (?P<n>\d+)$", text, re.M)
    if declared is None:
        raise ScriptError(f"{path.name}: no `local {name} = <n>` line")
    width = int(declared["n"])
    read = {int(i) for i in reads.findall(text)}
    if read != set(range(1, width + 1)):
        raise ScriptError(
            f"{path.name}: {name} is {width}, the context reads {what} for i in {sorted(read)}"
        )
    return width


def read_queue_argc(path: Path = QUEUE_CONTEXT_LUA) -> int:
    """The number of a queue context's parameters, as lua/includes/queueContext.lua declares
    it (`local QUEUE_ARGC = <n>`) and its function reads them (ARGV[ab+1 .. ab+n])."""
    return read_context_width(path, "QUEUE_ARGC", _CONTEXT_ARG, "ARGV[ab+i]")


def read_queue_keyc(path: Path = QUEUE_CONTEXT_LUA, names: Path = QUEUE_KEY_NAMES_LUA) -> int:
    """The number of a queue context's keys, as lua/includes/queueContext.lua declares it
    (`local QUEUE_KEYC = <n>`) and its function reads them (KEYS[kb+1 .. kb+n]): the one
    key of CONTEXTS["queue"], which the loader passes. The names lua/includes/queueKeys.lua
    builds from it are checked too: each of QUEUE_KEYS once, those shared with a
    subscription's topic (`t(...)`) exactly SHARED_WITH_TOPIC."""
    keyc = read_context_width(path, "QUEUE_KEYC", _CONTEXT_KEY, "KEYS[kb+i]")
    if keyc != len(CONTEXTS["queue"]):
        raise ScriptError(
            f"{path.name}: QUEUE_KEYC is {keyc}, a queue context is passed "
            f"{len(CONTEXTS['queue'])} key"
        )
    built = [(m["kind"], m["name"]) for m in _NAMED_KEY.finditer(names.read_text())]
    if sorted(n for _, n in built) != sorted(QUEUE_KEYS):
        raise ScriptError(
            f"{names.name}: names {sorted(n for _, n in built)}, busd.storage.keys.QUEUE_KEYS "
            f"has {sorted(QUEUE_KEYS)}"
        )
    if {n for kind, n in built if kind == "t"} != SHARED_WITH_TOPIC:
        raise ScriptError(f"{names.name}: the topic's own names are not {set(SHARED_WITH_TOPIC)}")
    return keyc


def read_topic_keyc(path: Path = TOPIC_CONTEXT) -> int:
    """The number of a topic context's own keys, as lua/includes/topicContext.lua declares it
    (`local TOPIC_KEYC = <n>`) and its function reads them: the length of TOPIC_KEYS."""
    keyc = read_context_width(path, "TOPIC_KEYC", _CONTEXT_KEY, "KEYS[kb+i]")
    if keyc != len(TOPIC_KEYS):
        raise ScriptError(
            f"{path.name}: TOPIC_KEYC is {keyc}, busd.storage.keys.TOPIC_KEYS "
            f"has {len(TOPIC_KEYS)} keys"
        )
    read_context_width(path, "TOPIC_ARGC", _CONTEXT_ARG, "ARGV[ab+i]")
    return keyc


# What a `Context: queue` script takes after the queue's keys, before its own arguments; the
# store's queue_context_args (busd/storage/redis/connection.py) builds them.
QUEUE_ARGC = read_queue_argc()
# How many keys a queue context is (one): a script finds the keys it takes after one from there.
QUEUE_KEYC = read_queue_keyc()
# How many keys a topic's own context is, before its subscriptions' queue contexts.
TOPIC_KEYC = read_topic_keyc()


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


# The library's name and each function's name end in the library's version (the hash of its
# text), so that processes of two busd versions can share a server during an upgrade, each
# calling its own functions.
LIBRARY_PREFIX = "busd_"


@dataclass(frozen=True, slots=True)
class Library:
    """The scripts as one Valkey Functions library (docs/design.md §3.4): the includes are
    defined once, when the library is loaded, rather than on every call as an EVALSHA'd
    script defines them; each script is a function, `function_names[script]`, called with
    FCALL."""

    text: str
    version: str
    function_names: dict[str, bytes]


def build_library(sources: dict[str, ScriptSource]) -> Library:
    """Every script of `sources` in one library: its chunk defines each include once (as the
    scripts' own text would, dependencies first) and registers each script's body as a
    function. The bodies read KEYS and ARGV as scripts do: the function sets the chunk's
    `KEYS`, `ARGV` (locals of the library, shared by its functions and includes) from its
    arguments first; the server runs one function at a time."""
    seen: set[str] = set()
    prelude: list[str] = []
    bodies: dict[str, str] = {}
    for name, src in sorted(sources.items()):
        lines: list[str] = []
        for line in src.path.read_text().splitlines():
            if _INCLUDE.match(line):
                prelude.append(resolve_includes(line, seen))
            else:
                lines.append(line)
        bodies[name] = "\n".join(lines)
    chunk = "\n".join(["local KEYS, ARGV", "local BODIES = {}", *prelude])
    version = hashlib.sha1(
        "\0".join([chunk, *(f"{n}\0{b}" for n, b in bodies.items()), _EACH]).encode()
    ).hexdigest()[:12]
    parts = [f"#!lua name={LIBRARY_PREFIX}{version}", chunk]
    for name, body in bodies.items():
        parts.append(
            f"BODIES['{name}'] = function(keys, argv)\nKEYS, ARGV = keys, argv\n{body}\nend\n"
            f"redis.register_function('{name}_{version}', BODIES['{name}'])"
        )
    parts.append(_EACH.replace("<version>", version))
    return Library(
        text="\n".join(parts) + "\n",
        version=version,
        function_names={
            **{name: f"{name}_{version}".encode() for name in bodies},
            EACH: f"{EACH}_{version}".encode(),
        },
    )


# `Scripts.run_many`: several calls of the library's functions as one FCALL, so that calls
# bound for one server (a partitioned entity's partitions) cost one call's round of the
# server and of busd. Its KEYS are the first call's, which route it on a Cluster; each later
# call passes its keys among the arguments, and on a Cluster (ARGV[1] '1') the server first
# checks that it serves them and that their slot is not being migrated: the keys' EXISTS
# fails where a call of their own would get MOVED, ASK or TRYAGAIN (a Cluster call's keys
# include a key that is never written, keys.context_guard), and that call is not run but
# answered ELSEWHERE, for the caller to send alone. With `allow-cross-slot-keys` the server
# lets one call touch several slots of its own; each call still keeps to its own slot.
# A call's error is its answer; the calls after it still run, as separate calls would.
EACH = "each"
ELSEWHERE = "BUSDELSEWHERE"
_EACH = f"""redis.register_function{{function_name='{EACH}_<version>',
flags={{'allow-cross-slot-keys'}}, callback=function(keys, argv)
  local out, i, first, check = {{}}, 2, true, argv[1] == '1'
  while i <= #argv do
    local name, nk, na = argv[i], tonumber(argv[i + 1]), tonumber(argv[i + 2])
    i = i + 3
    local ks, as = keys, {{}}
    if not first then
      ks = {{}}
      for j = 1, nk do ks[j] = argv[i + j - 1] end
      i = i + nk
    end
    for j = 1, na do as[j] = argv[i + j - 1] end
    i = i + na
    local answer
    if check and not first and type(redis.pcall('EXISTS', unpack(ks))) ~= 'number' then
      answer = {{err = '{ELSEWHERE}'}}
    else
      local ok, value = pcall(BODIES[name], ks, as)
      if ok then
        answer = value == nil and false or value
      elseif type(value) == 'table' and value.err then
        answer = value
      else
        answer = {{err = tostring(value)}}
      end
    end
    out[#out + 1] = answer
    first = false
  end
  return out
end}}"""


def lost_library(exc: ResponseError) -> bool:
    """Whether a call failed because the server has not got the library's functions (a
    restarted server without its data, a promoted replica that never had them, FUNCTION
    FLUSH): the call did not run, and runs once the library is loaded."""
    return str(exc).startswith("Function not found")


class Scripts:
    """The scripts registered with one client.

    The scripts are one Functions library (`build_library`), loaded once per server: a
    call is an FCALL of the script's function, so it no longer defines every include it
    uses on each call (about 2.5 µs of the server's time per call, docs/design.md §3.19).
    On a single server each call is one FCALL written as a pre-encoded command, pipelined
    on one connection of our own (`PipelinedConnection`, busd/storage/redis/pipeline.py): the part
    that repeats (function name, the queue's keys) is encoded once per script and queue; the
    calls of one event-loop turn go out in one write and their answers come back in one
    read, in order; and a call skips redis-py's per-command machinery (pool, retries,
    observability hooks). Per call, that machinery and a socket write and read each cost
    more than the rest of a store call, in busd and in the server alike. The server runs
    scripts one at a time anyway, so one connection loses it no concurrency. The caller
    bounds the calls in flight (RedisStore._slots). A call is never retried: a script that
    ran must not run twice. On a cluster, each primary has such a connection of its own and
    a call goes to the one owning its first key's slot (`ShardPipelines`,
    busd/storage/redis/cluster.py). Either way a server that lost the library ("Function not
    found": restarted without its data, failed over to a replica that never had it,
    flushed) gets it again, and the call runs once."""

    def __init__(
        self,
        client: Redis,
        sources: dict[str, ScriptSource] | None = None,
        durability: str = "local",
    ) -> None:
        self.sources = sources if sources is not None else load_sources()
        self._client = client
        self.library = build_library(self.sources)
        self._load = resp_command(b"FUNCTION", b"LOAD", b"REPLACE", self.library.text.encode())
        # Only a plain client has one pool for every key; a cluster has a pipeline per primary.
        plain = type(client) is PlainRedis
        self._pipe = (
            PipelinedConnection(client.connection_pool, DURABILITY[durability]) if plain else None
        )
        self._shards = (
            None if plain else ShardPipelines(client, DURABILITY[durability])  # type: ignore[arg-type]
        )
        # (script, keys) -> (number of KEYS, encoded 'FCALL <function> <numkeys> <keys...>')
        self._heads: dict[tuple[str, tuple[Any, ...]], tuple[int, bytes]] = {}

    async def refresh_map(self) -> None:
        """Read a Cluster's slot map again (cluster.py; nothing on one server)."""
        if self._shards is not None:
            await self._shards.refresh()

    async def preload(self) -> None:
        """Load the library now (on every primary of a cluster), so that the first calls
        need no reload round trip."""
        if self._pipe is not None:
            # FUNCTION LOAD is written to the AOF and sent to the replicas (the library's 0.15
            # MB, once per busd process started): not when this version is there already.
            name = f"{LIBRARY_PREFIX}{self.library.version}"
            if await self._client.function_list(library=name):
                return
        # A cluster client sends FUNCTION LOAD to every primary.
        await self._client.function_load(self.library.text, replace=True)

    async def close(self) -> None:
        if self._pipe is not None:
            await self._pipe.close()
        if self._shards is not None:
            await self._shards.close()

    async def run(self, name: str, keys: list[str] | list[bytes], args: list[Any]) -> Any:
        pipe = self._pipe
        if pipe is None:
            if self._shards is not None and keys:
                return await self._run_on_shard(self._shards, name, keys, args)
            cluster: Any = self._client
            return await cluster.fcall(self.library.function_names[name].decode(), 0, *args)
        command = self._command(name, keys, args)
        try:
            return await pipe.call(command, name)
        except ResponseError as exc:
            if not lost_library(exc):
                raise
        await pipe.call(self._load, name)
        return await pipe.call(command, name)

    async def _run_on_shard(
        self, shards: ShardPipelines, name: str, keys: list[str] | list[bytes], args: list[Any]
    ) -> Any:
        command = self._command(name, keys, args)
        key = encode(keys[0])
        try:
            return await shards.call(command, name, key)
        except ResponseError as exc:
            if not lost_library(exc):
                raise
        # On that primary (a promoted replica has none of the functions its primary loaded,
        # unless it replicated the load).
        await shards.call(self._load, name, key)
        return await shards.call(command, name, key)

    async def run_many(
        self, calls: list[tuple[str, list[bytes], list[Any]]], checked: bool = False
    ) -> list[Any]:
        """Each call's answer, in order: a call's error is its answer (a ResponseError, or on a
        Cluster whatever failed its primary's calls), not raised; an exception raised failed
        them all. The calls bound for one server go as one FCALL of the library's `each`
        (`_EACH` above); `checked`: on a Cluster, whose calls' keys include a context guard
        (keys.context_guard): a call the server found it cannot run there is sent alone."""
        if len(calls) == 1:
            return [await self._alone(*calls[0])]
        pipe = self._pipe
        if pipe is not None:
            return await self._merged(lambda command: pipe.call(command, EACH), calls, False)
        shards = self._shards
        assert shards is not None
        groups: dict[int, list[int]] = {}
        for i, (_, keys, _) in enumerate(calls):
            groups.setdefault(id(shards.owner(encode(keys[0]))), []).append(i)
        out: list[Any] = [None] * len(calls)

        async def group(idx: list[int]) -> None:
            own = [calls[i] for i in idx]
            key = encode(own[0][1][0])
            try:
                answers = (
                    [await self._alone(*own[0])]
                    if len(own) == 1
                    else await self._merged(
                        lambda command: shards.call(command, EACH, key), own, checked
                    )
                )
            except Exception as exc:  # this primary's calls failed; the others' did not
                answers = [exc] * len(own)
            for i, answer in zip(idx, answers):
                out[i] = answer

        if len(groups) == 1:
            await group(next(iter(groups.values())))
        else:
            await asyncio.gather(*(group(idx) for idx in groups.values()))
        return out

    async def _alone(self, name: str, keys: list[bytes], args: list[Any]) -> Any:
        try:
            return await self.run(name, keys, args)
        except ResponseError as exc:
            return exc

    async def _merged(
        self,
        send: Callable[[bytes], Awaitable[Any]],
        calls: list[tuple[str, list[bytes], list[Any]]],
        checked: bool,
    ) -> list[Any]:
        command = self._each_command(calls, checked)
        try:
            answers = await send(command)
        except ResponseError as exc:
            if not lost_library(exc):
                raise
            await send(self._load)
            answers = await send(command)
        out = list(answers)
        for i, answer in enumerate(out):
            if isinstance(answer, ResponseError) and str(answer) == ELSEWHERE:
                try:  # alone, it gets what a call of its own gets: MOVED followed, TRYAGAIN...
                    out[i] = await self._alone(*calls[i])
                except Exception as exc:  # ...which fails it, not the calls that ran
                    out[i] = exc
        return out

    def _each_command(
        self, calls: list[tuple[str, list[bytes], list[Any]]], checked: bool
    ) -> bytes:
        """`FCALL each <first call's keys> <checked> (<script> <nkeys> <nargs> [<keys>]
        <args>)...`, the first call's keys being the command's KEYS (`_EACH`)."""
        first_keys = calls[0][1]
        parts = [b"FCALL", self.library.function_names[EACH], b"%d" % len(first_keys)]
        parts += [encode(k) for k in first_keys]
        parts.append(b"1" if checked else b"0")
        for n, (name, keys, args) in enumerate(calls):
            parts += [name.encode(), b"%d" % len(keys), b"%d" % len(args)]
            if n:
                parts += [encode(k) for k in keys]
            parts += [encode(a) for a in args]
        return b"*%d\r\n" % len(parts) + b"".join(map(bulk, parts))

    def _command(self, name: str, keys: list[str] | list[bytes], args: list[Any]) -> bytes:
        """The RESP encoding of `FCALL <function> <numkeys> <keys...> <args...>`."""
        cache_key = (name, tuple(keys))
        head = self._heads.get(cache_key)
        if head is None:
            function = self.library.function_names[name]
            parts = [bulk(b"FCALL"), bulk(function), bulk(b"%d" % len(keys))]
            parts += [bulk(encode(k)) for k in keys]
            head = (len(keys), b"".join(parts))
            # A transaction's commit names whatever entities it touched: kept, its key sets
            # would grow the cache without end.
            if self.sources[name].context != "transaction":
                self._heads[cache_key] = head
        parts = [b"*%d\r\n" % (3 + head[0] + len(args)), head[1]]
        for arg in args:
            value = encode(arg)
            parts.append(b"$%d\r\n" % len(value))
            parts.append(value)
            parts.append(b"\r\n")
        return b"".join(parts)
