"""Loads the Lua scripts: one file per atomic state transition, `lua/<verbNoun>-<N>.lua`.

N, the number of KEYS, lives only in the file name. The script's header lists each key as
`KEYS[i]  <name>` with the logical names of `busd.storage.keys`; the loader checks that list
against N and builds each call's KEYS from it, so the Python side cannot drift from what the
script declares. `--- @include "<name>"` lines pull in `lua/includes/<name>.lua` (one small
local function each) before the line's place, dependencies first, each include once.

The loaded text starts with a `#!lua` shebang: a script with one (even without flags) is
checked by the server, in cluster mode, to touch only keys of the slot its KEYS hash to, so
a key built inside a script with another hash tag fails loudly instead of working by luck.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

LUA_DIR = Path(__file__).with_name("lua")
INCLUDE_DIR = LUA_DIR / "includes"

_FILE_NAME = re.compile(r"^(?P<name>[a-z][A-Za-z]*)-(?P<keys>\d+)\.lua$")
_INCLUDE = re.compile(r'^\s*---\s*@include\s+"(?P<name>[A-Za-z]+)"\s*$')
SHEBANG = "#!lua\n"
_HEADER_KEY = re.compile(r"^\s*KEYS\[(?P<index>\d+)\]\s+(?P<name>\S+)")


class ScriptError(Exception):
    """A script file that breaks the conventions above."""


@dataclass(frozen=True, slots=True)
class ScriptSource:
    name: str  # verbNoun, e.g. "sendMessages"
    num_keys: int  # N from the file name
    key_names: tuple[str, ...]  # logical key names, from the header, in KEYS order
    text: str  # with includes resolved
    path: Path


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
        raise ScriptError(f"{path.name}: script files are named <verbNoun>-<N>.lua")
    num_keys = int(match["keys"])
    raw = path.read_text()
    declared: dict[int, str] = {}
    for line in header_of(raw).splitlines():
        key = _HEADER_KEY.match(line)
        if key:
            declared[int(key["index"])] = key["name"]
    if sorted(declared) != list(range(1, num_keys + 1)):
        raise ScriptError(
            f"{path.name}: header declares KEYS {sorted(declared)}, file name says {num_keys}"
        )
    return ScriptSource(
        name=match["name"],
        num_keys=num_keys,
        key_names=tuple(declared[i] for i in range(1, num_keys + 1)),
        text=SHEBANG + resolve_includes(raw),
        path=path,
    )


def load_sources(directory: Path = LUA_DIR) -> dict[str, ScriptSource]:
    return {s.name: s for s in map(read_source, sorted(directory.glob("*.lua")))}


class Scripts:
    """The scripts registered with one client. redis-py's Script object runs EVALSHA and
    falls back to loading the script on NOSCRIPT (a restarted or failed-over server)."""

    def __init__(self, client: Redis, sources: dict[str, ScriptSource] | None = None) -> None:
        self.sources = sources if sources is not None else load_sources()
        self._client = client
        self._registered: dict[str, AsyncScript] = {
            name: client.register_script(src.text) for name, src in self.sources.items()
        }

    async def preload(self) -> None:
        """Load every script now, so that the first calls need no NOSCRIPT round trip."""
        for src in self.sources.values():
            await self._client.script_load(src.text)

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._registered[name](keys=keys, args=args)
