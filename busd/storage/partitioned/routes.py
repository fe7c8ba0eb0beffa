"""How a Store call reaches the partitions of a partitioned entity: one route per kind of call
(docs/design.md §3.18). `PartitionedStore` declares each method in a line,
`renew_session_lock = by_session(Store.renew_session_lock)`: the route takes the Store method's
name, signature, docstring and type (mypy sees the protocol's method), and sends a call on an
entity without partitions (or a topic named by a string) straight to the inner store.

- `whole`: partitions do not concern the call: the inner store's, unchanged;
- `by_session`: to the partition of the call's session id;
- `over_all`: to every partition at once, the answers merged (summed, or as `merge` says);
- `by_lock_token`, `by_sequence`: each item to the partition its lock token or sequence number
  carries, one call per partition concerned;
- `in_turn`: partition after partition (from a rotating one with `rotate`) until the call's
  count is met;
- `partitioned`: a route written by hand, for the calls on entities with partitions.
A partition's share of the new lock tokens a call brings is stamped with it (routing.py).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from busd.storage.api import Store
from busd.storage.messages import ReceiveMode
from busd.storage.partitioned.base import PartitionedBase
from busd.storage.partitioned.routing import in_order, partition_of_seq, partition_of_token, stamped

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
StoreMethod = Callable[Concatenate[Store, P], Awaitable[R]]
Route = Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]


class Call:
    """A call on a partitioned entity: its arguments, by name, and the inner store's call of
    one partition, with some of them replaced."""

    def __init__(self, name: str, params: dict, store: PartitionedBase, args: tuple, kw: dict):
        self.name, self.params, self.store, self.args, self.kw = name, params, store, args, kw

    def __getitem__(self, name: str) -> Any:
        i, default = self.params[name]
        return self.args[i] if i < len(self.args) else self.kw.get(name, default)

    def tokens(self, p: int, start: int, count: int) -> Any:
        """`count` of the call's new lock tokens from `start`, stamped with partition `p`
        (none in receive-and-delete mode: it locks nothing)."""
        if "mode" in self.params and self["mode"] != ReceiveMode.PEEK_LOCK:
            return ()
        return stamped(self["tokens"], p, start, count)

    def to(self, part: Any, **values: Any) -> Awaitable[Any]:
        """The inner store's call on partition `part`, some arguments replaced by `values`."""
        args, kw = self.args, dict(self.kw)
        for name, value in {next(iter(self.params)): part, **values}.items():
            if (i := self.params[name][0]) < len(args):
                args = (*args[:i], value, *args[i + 1 :])
            else:
                kw[name] = value
        return getattr(self.store.inner, self.name)(*args, **kw)


def _route(method: Callable[..., Any], spread: Callable[[Call, Any], Awaitable[Any]] | None) -> Any:
    """A call on an entity with partitions is `spread` over them; any other goes to the inner
    store unchanged."""
    name, signature = method.__name__, inspect.signature(method)
    params = {p.name: (i, p.default) for i, p in enumerate(list(signature.parameters.values())[1:])}
    entity = next(iter(params), "")

    async def routed(self: PartitionedBase, /, *args: Any, **kw: Any) -> Any:
        spec: Any = args[0] if args else kw.get(entity)
        if spread is None or type(spec) is str or not spec.partitions:
            return await getattr(self.inner, name)(*args, **kw)
        return await spread(Call(name, params, self, args, kw), spec)

    routed.__name__ = routed.__qualname__ = name
    routed.__doc__, routed.__signature__ = method.__doc__, signature  # type: ignore[attr-defined]
    return routed


def whole(method: StoreMethod[P, R]) -> Route[P, R]:
    return cast(Route[P, R], _route(method, None))


def partitioned(method: F) -> F:
    return cast(F, _route(method, lambda call, _: method(call.store, *call.args, **call.kw)))


def _to_session(call: Call, spec: Any) -> Awaitable[Any]:
    return call.to(call.store.part_of_session(spec, call["session_id"]))


def by_session(method: StoreMethod[P, R]) -> Route[P, R]:
    return cast(Route[P, R], _route(method, _to_session))


def _fan_out(call: Call, p: int) -> dict[str, Any]:
    """A topic's partition p fans out to partition p of each of the call's subscriptions."""
    return {"subscriptions": [call.store.parts(s)[p] for s in call["subscriptions"]]}


def over_all(
    method: StoreMethod[P, R], merge: Callable[[list[Any]], Any] = sum, *, fan_out: bool = False
) -> Route[P, R]:
    async def spread(call: Call, spec: Any) -> Any:
        parts = call.store.parts(spec)
        calls = (call.to(t, **(_fan_out(call, p) if fan_out else {})) for p, t in enumerate(parts))
        return merge(list(await asyncio.gather(*calls)))

    return cast(Route[P, R], _route(method, spread))


def _grouped(
    method: StoreMethod[P, R],
    items: str,
    partition_of: Callable[[Any, int], int],
    at_once: bool,
    joined: bool = False,
    fan_out: bool = False,
) -> Route[P, R]:
    """The call's `items`, one call per partition they fall in: at once, or one after another
    (a failure stops the rest). The answers one per item in the items' order; `joined`, the
    answers' items together, in the partitions' order."""
    nothing = inspect.signature(method).return_annotation == "None"

    async def spread(call: Call, spec: Any) -> Any:
        values, groups, out = call[items], dict[int, list[int]](), list[Any]()
        for i, value in enumerate(values):
            groups.setdefault(partition_of(value, spec.partitions), []).append(i)
        parts = call.store.parts(spec)

        def one(p: int, idx: list[int]) -> Awaitable[Any]:
            more = {items: [values[i] for i in idx], **(_fan_out(call, p) if fan_out else {})}
            if "tokens" in call.params and items != "tokens":
                more["tokens"] = call.tokens(p, len(out), len(idx))
            return call.to(parts[p], **more)

        if at_once and len(groups) > 1:
            answers = await asyncio.gather(*(one(p, idx) for p, idx in groups.items()))
        else:
            answers = []
            for p, idx in groups.items():
                answers.append(answer := await one(p, idx))
                out += answer if joined else ()
        return None if nothing else out if joined else in_order(groups, answers, len(values))

    return cast(Route[P, R], _route(method, spread))


def by_lock_token(
    method: StoreMethod[P, R], items: str = "tokens", *, at_once: bool = True
) -> Route[P, R]:
    """Lock tokens (or items with a `token`), each to the partition in its last byte."""

    def partition_of(item: Any, count: int) -> int:
        return partition_of_token(item if isinstance(item, bytes) else item.token, count)

    return _grouped(method, items, partition_of, at_once)


def by_sequence(
    method: StoreMethod[P, R], *, at_once: bool = False, joined: bool = False, fan_out: bool = False
) -> Route[P, R]:
    """Sequence numbers, each to the partition in its top 16 bits."""
    return _grouped(method, "seqs", partition_of_seq, at_once, joined, fan_out)


def in_turn(
    method: StoreMethod[P, R], count: str, *, rotate: bool = False, counted: bool = False
) -> Route[P, R]:
    """Partition after partition until `count` is met: the answers are messages (their list
    together) or, `counted`, how many (their sum). A call naming a session goes to its
    partition alone."""

    async def spread(call: Call, spec: Any) -> Any:
        if "session_id" in call.params and call["session_id"] is not None:
            return await _to_session(call, spec)
        asked, done, out = call[count], 0, list[Any]()
        for part in call.store.rotation(spec) if rotate else call.store.parts(spec):
            if (want := asked - done) <= 0:
                break
            more = {count: want}
            if "tokens" in call.params:
                more["tokens"] = call.tokens(part.partition or 0, done, want)
            if counted:
                done += await call.to(part, **more)
            else:
                out += await call.to(part, **more) or ()
                done = len(out)
        return done if counted else out

    return cast(Route[P, R], _route(method, spread))
