"""How a Store call reaches the partitions of a partitioned entity: one policy per kind of call
(docs/design.md §3.18). `PartitionedStore` declares each method that follows one in a line,
`renew_session_lock = by_session(Store.renew_session_lock)`: the route takes the Store method's
parameters, its docstring and its type (mypy sees the protocol's method), and sends a call on
an entity without partitions (or a topic named by a string) straight to the inner store.

- `whole`: the call concerns no entity (the catalog, lifecycle, transactions staged under a
  partition the broker already holds): the inner store's, unchanged;
- `by_session`: to the partition of the call's session id;
- `over_all`: to every partition at once, the answers merged (summed, or as `merge` says);
- `by_lock_token`, `by_sequence`: each item to the partition its lock token or sequence number
  carries, one call per partition concerned;
- `in_turn`: partition after partition (from a rotating one with `rotate`) until the call's
  count is met, a partition's lock tokens stamped with it;
- `partitioned`: a method written by hand for partitioned entities only.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from busd.storage.api import Store
from busd.storage.messages import ReceiveMode
from busd.storage.partitioned.base import PartitionedBase, in_order
from busd.storage.partitioned.routing import partition_of_seq, partition_of_token, stamped

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
StoreMethod = Callable[Concatenate[Store, P], Awaitable[R]]
Route = Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]


class Call:
    """A call of a Store method on a partitioned entity: its arguments, read by name, and
    the inner store's call of one partition, with the arguments that partition needs."""

    def __init__(self, method: Callable[..., Any], store: PartitionedBase, args: tuple, kw: dict):
        self.method, self.store, self.args, self.kw = method, store, args, kw
        self.params: dict[str, tuple[int, Any]] = method.__dict__["params"]
        self.entity = next(iter(self.params))

    def __getitem__(self, name: str) -> Any:
        i, default = self.params[name]
        return self.args[i] if i < len(self.args) else self.kw.get(name, default)

    def tokens(self, p: int, start: int, count: int) -> Any:
        """`count` of the call's lock tokens from `start`, stamped with partition `p` (none in
        receive-and-delete mode: it locks nothing)."""
        if "mode" in self.params and self["mode"] != ReceiveMode.PEEK_LOCK:
            return ()
        return stamped(self["tokens"], p, start, count)

    def subscriptions(self, p: int) -> list[Any]:
        return [self.store.parts(s)[p] for s in self["subscriptions"]]

    def to(self, part: Any, **values: Any) -> Awaitable[Any]:
        """The inner store's call on partition `part`, some arguments replaced by `values`."""
        args, kw = self.args, dict(self.kw)
        for name, value in {self.entity: part, **values}.items():
            i = self.params[name][0]
            if i < len(args):
                args = (*args[:i], value, *args[i + 1 :])
            else:
                kw[name] = value
        return getattr(self.store.inner, self.method.__name__)(*args, **kw)


Spread = Callable[[Call, Any], Awaitable[Any]]


def _route(method: Callable[..., Any], spread: Spread | None, like: Callable[..., Any]) -> Any:
    """`method`'s route: a call on an entity with partitions is `spread` over them, any other
    goes to the inner store unchanged. It takes `like`'s name, signature and docstring."""
    name, signature = method.__name__, inspect.signature(like)
    params = list(signature.parameters.values())[1:]  # less self
    entity = params[0].name if params else ""

    async def routed(self: PartitionedBase, /, *args: Any, **kw: Any) -> Any:
        spec: Any = args[0] if args else kw.get(entity)
        if spread is None or type(spec) is str or not spec.partitions:
            return await getattr(self.inner, name)(*args, **kw)
        return await spread(Call(routed, self, args, kw), spec)

    routed.__name__ = routed.__qualname__ = name
    routed.__doc__, routed.__signature__ = like.__doc__, signature  # type: ignore[attr-defined]
    routed.__dict__["params"] = {p.name: (i, p.default) for i, p in enumerate(params)}
    routed.__dict__["returns"] = signature.return_annotation
    return routed


def whole(method: StoreMethod[P, R]) -> Route[P, R]:
    return cast(Route[P, R], _route(method, None, method))


def partitioned(method: F) -> F:
    """A route written by hand: it sees the calls on entities with partitions."""
    return cast(
        F, _route(method, lambda call, _: method(call.store, *call.args, **call.kw), method)
    )


def by_session(method: StoreMethod[P, R]) -> Route[P, R]:
    async def spread(call: Call, spec: Any) -> Any:
        return await call.to(call.store.part_of_session(spec, call["session_id"]))

    return cast(Route[P, R], _route(method, spread, method))


def over_all(
    method: StoreMethod[P, R], merge: Callable[[list[Any]], Any] = sum, *, fan_out: bool = False
) -> Route[P, R]:
    """Every partition at once, the answers merged; with `fan_out`, a topic's partition p
    with partition p of each of the call's subscriptions."""

    async def spread(call: Call, spec: Any) -> Any:
        parts = call.store.parts(spec)
        subs = (
            dict(subscriptions=call.subscriptions(p)) if fan_out else {} for p in range(len(parts))
        )
        return merge(list(await asyncio.gather(*(call.to(t, **s) for t, s in zip(parts, subs)))))

    return cast(Route[P, R], _route(method, spread, method))


def _grouped(
    method: StoreMethod[P, R],
    items: str,
    partition_of: Callable[[Any, int], int],
    *,
    at_once: bool = False,
    joined: bool = False,
    fan_out: bool = False,
) -> Route[P, R]:
    """The call's `items`, one call per partition they fall in: at once, or one after another
    (a failure stops the rest). The answers one per item in the items' order; `joined`, the
    answers' items together, in the partitions' order."""

    async def spread(call: Call, spec: Any) -> Any:
        values, groups, out = call[items], dict[int, list[int]](), list[Any]()
        for i, value in enumerate(values):
            groups.setdefault(partition_of(value, spec.partitions), []).append(i)
        parts = call.store.parts(spec)

        def one(p: int, idx: list[int]) -> Awaitable[Any]:
            more = {items: [values[i] for i in idx]}
            if fan_out:
                more["subscriptions"] = call.subscriptions(p)
            if "tokens" in call.params and items != "tokens":  # new locks: stamped
                more["tokens"] = call.tokens(p, len(out), len(idx))
            return call.to(parts[p], **more)

        if at_once and len(groups) > 1:
            answers = await asyncio.gather(*(one(p, idx) for p, idx in groups.items()))
        else:
            answers = []
            for p, idx in groups.items():
                answers.append(answer := await one(p, idx))
                out += answer if joined else ()
        if call.method.__dict__["returns"] == "None":
            return None
        return out if joined else in_order(groups, answers, len(values))

    return cast(Route[P, R], _route(method, spread, method))


def by_lock_token(
    method: StoreMethod[P, R], items: str = "tokens", *, at_once: bool = True
) -> Route[P, R]:
    """Tokens (or items with a `token`), each to the partition stamped in its last byte."""

    def partition_of(item: Any, count: int) -> int:
        return partition_of_token(item if isinstance(item, bytes) else item.token, count)

    return _grouped(method, items, partition_of, at_once=at_once)


def by_sequence(
    method: StoreMethod[P, R], *, at_once: bool = False, joined: bool = False, fan_out: bool = False
) -> Route[P, R]:
    """Sequence numbers, each to the partition in its top bits."""
    return _grouped(
        method, "seqs", partition_of_seq, at_once=at_once, joined=joined, fan_out=fan_out
    )


def in_turn(
    method: StoreMethod[P, R], count: str, *, rotate: bool = False, counted: bool = False
) -> Route[P, R]:
    """Partition after partition until `count` is met: the answers are messages (their list
    together) or, `counted`, how many (their sum). A call naming a session goes to its
    partition alone."""

    async def spread(call: Call, spec: Any) -> Any:
        store = call.store
        if "session_id" in call.params and (session := call["session_id"]) is not None:
            return await call.to(store.part_of_session(spec, session))
        asked, done, out = call[count], 0, list[Any]()
        for part in store.rotation(spec) if rotate else store.parts(spec):
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

    return cast(Route[P, R], _route(method, spread, method))
