"""Faults on demand: what a user's resilience test asks busd to get wrong (docs/faults.md).

Off unless busd was started with `--faults` (BUSD_FAULTS; the testing plugin's brokers turn
them on): then no fault can be set, and none left in the store acts. A fault is scoped to
one entity (a queue, topic or subscription, never a dead-letter queue; optionally one of its
sessions), at most MAX_PER_ENTITY at once, and lasts a count of hits or a time window, and
never longer than its window: DEFAULT_WINDOW_MS when none is given. Its record is a catalog
record of kind `fault` (which the catalog reads for this module,
busd.broker.catalog.RecordFollower): written by the process that served the admin request,
announced over the catalog's channel to every process, which keeps its own copy here.
A fault with a count counts its hits in the store (`Store.fault_hit`), so the count holds for
all workers together; the process that makes the last hit deletes the record.

The hot path pays one attribute check (`active`) while no fault is set: the hooks in the
sending, receiving and session paths call in only when it is true.

Kinds:
- `server-busy` / `timeout`: the matching operations (`send`, `receive`, `settle`) are answered
  with `com.microsoft:server-busy` / `com.microsoft:timeout`: a send's transfers are rejected,
  a receiving link's attach (or accept-session) is refused, a settlement is rejected. (A
  receiving link already attached is not detached: the SDKs keep a link that failed with
  server-busy and never attach it again.)
- `delay`: the matching operations (`deliver`: each fetch of deliveries, `accept`:
  accept-session) wait `delay_ms` first.
- `message-lock-lost`: every process ends the message locks its receivers of the entity hold
  now, as their expiry would (the messages come back with a counted attempt): the holder's
  next settle or renewal gets `com.microsoft:message-lock-lost`.
- `session-lock-lost`: the session's lock ends in the store now, as its expiry does
  (`Store.lose_session_lock`), and its holder's link is detached with
  `com.microsoft:session-lock-lost`, as at an expiry; the holder's next settle or renewal
  gets that condition, the next acceptor takes the session.
- `detach` / `close-connection`: every link of the entity (of the session, if given) is
  detached, or the connections holding one are closed, with the condition given.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from busd.broker.attached import AttachedLink
from busd.errors import BusdError, Condition
from busd.storage.messages import Outcome, Settlement

if TYPE_CHECKING:
    from busd.storage.api import Store

log = logging.getLogger("busd.faults")

# receive: a receiving link's attach (a session receiver's accept-session too); deliver: each
# fetch of deliveries for a receiving link; accept: accept-session.
SEND, RECEIVE, SETTLE, ACCEPT, DELIVER = "send", "receive", "settle", "accept", "deliver"
OPERATIONS = (SEND, RECEIVE, SETTLE, ACCEPT, DELIVER)
# kind -> the operations it applies to when none are given
ANSWERS = {"server-busy": Condition.SERVER_BUSY, "timeout": Condition.TIMEOUT}
DEFAULT_OPERATIONS = {
    "server-busy": (SEND, RECEIVE, SETTLE),
    "timeout": (SEND, RECEIVE, SETTLE),
    "delay": (DELIVER, ACCEPT),
}
ONCE = ("message-lock-lost", "session-lock-lost", "detach", "close-connection")
KINDS = (*DEFAULT_OPERATIONS, *ONCE)
# How long the record of a fault applied once stays: long enough for every process to hear
# of it, which each does once.
ONCE_WINDOW_MS = 10_000
MAX_DURATION_MS = 24 * 3600 * 1000
# The window of a fault given none (a count, or the next operation): a fault whose count is
# never spent ends all the same, in the store too.
DEFAULT_WINDOW_MS = 3600 * 1000
# Faults set on one entity at once: each is looked at by every matching operation.
MAX_PER_ENTITY = 100
MAX_DELAY_MS = 10 * 60 * 1000
RECORD_KIND = "fault"


class FaultError(ValueError):
    """A fault the request describes wrongly (the admin API answers 400)."""


class FaultRefused(Exception):
    """A fault busd will not set now: faults are off, or its entity has as many as it may
    (the admin API answers 403)."""


@dataclass
class Fault:
    id: str
    kind: str
    entity: str  # the entity's path, lower-cased (QueueSpec.name / TopicSpec.name)
    session: str | None = None
    operations: list[str] = field(default_factory=list)
    count: int | None = None  # hits, for every process together
    fraction: float = 1.0  # of the matching operations, while the window lasts
    until_ms: int | None = None  # the window's end (epoch ms); None only in older records
    delay_ms: int = 0
    condition: str | None = None  # detach, close-connection: the AMQP condition
    description: str | None = None
    created_ms: int = 0

    def live(self, now_ms: int) -> bool:
        return now_ms < self.ends_ms()

    def ends_ms(self) -> int:
        """The end of its window: a record written before every fault had one ends
        DEFAULT_WINDOW_MS after it was set."""
        return self.created_ms + DEFAULT_WINDOW_MS if self.until_ms is None else self.until_ms

    def error(self) -> BusdError:
        condition = ANSWERS.get(self.kind)
        text = self.description or f"Injected fault {self.id} ({self.kind})."
        if condition is not None:
            return BusdError(condition, text)
        default = Condition.CONNECTION_FORCED if self.kind == "close-connection" else None
        return BusdError(Condition(self.condition or default or Condition.DETACH_FORCED), text)

    def view(self, hits: int | None = None) -> dict[str, Any]:
        out = asdict(self)
        out["until_ms"] = self.ends_ms()
        if hits is not None:
            out["hits"] = hits
        return out


def _number(document: dict, name: str, kind: type, low: float, high: float) -> Any:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(f"{name} must be a number")
    if kind is int and value != int(value):
        raise FaultError(f"{name} must be a whole number")
    if not low <= value <= high:
        raise FaultError(f"{name} must be {low:g}..{high:g}, got {value}")
    return kind(value)


def parse(document: dict[str, Any], entity: str, now_ms: int) -> Fault:
    """A fault from the admin API's JSON (docs/faults.md), for the entity already resolved."""
    known = {
        "kind",
        "entity",
        "session",
        "operations",
        "count",
        "fraction",
        "duration_ms",
        "delay_ms",
        "condition",
        "description",
    }
    unknown = sorted(set(document) - known)
    if unknown:
        raise FaultError(f"unknown field(s): {', '.join(unknown)}")
    kind = document.get("kind")
    if kind not in KINDS:
        raise FaultError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    session = document.get("session")
    if session is not None and (not isinstance(session, str) or not session or "\0" in session):
        raise FaultError("session must be a session id")
    if kind == "session-lock-lost" and session is None:
        raise FaultError("session-lock-lost needs the session")
    operations = document.get("operations")
    if kind in DEFAULT_OPERATIONS:
        if operations is None:
            operations = list(DEFAULT_OPERATIONS[kind])
        if (
            not isinstance(operations, list)
            or not operations
            or any(op not in DEFAULT_OPERATIONS[kind] for op in operations)
        ):
            raise FaultError(
                f"operations of {kind}: a list of {', '.join(DEFAULT_OPERATIONS[kind])}"
            )
    elif operations is not None:
        raise FaultError(f"{kind} takes no operations: it is applied once, now")
    count = _number(document, "count", int, 1, 1_000_000)
    fraction = _number(document, "fraction", float, 0.0, 1.0)
    duration_ms = _number(document, "duration_ms", int, 1, MAX_DURATION_MS)
    delay_ms = _number(document, "delay_ms", int, 0, MAX_DELAY_MS)
    if kind == "delay" and delay_ms is None:
        raise FaultError("delay needs delay_ms")
    if fraction is not None and duration_ms is None:
        raise FaultError("a fraction needs duration_ms: the window it holds for")
    if kind in ONCE:
        if fraction is not None or duration_ms is not None or delay_ms is not None:
            raise FaultError(f"{kind} is applied once, now: no fraction, duration or delay")
        duration_ms = ONCE_WINDOW_MS
    elif count is None and duration_ms is None:
        count = 1  # "the next operation"
    if duration_ms is None:
        duration_ms = DEFAULT_WINDOW_MS  # a count not spent within it ends all the same
    condition = document.get("condition")
    if condition is not None:
        if kind not in ("detach", "close-connection"):
            raise FaultError("condition is for detach and close-connection")
        if condition not in {c.value for c in Condition}:
            raise FaultError(
                f"condition must be an AMQP error condition busd sends "
                f"(e.g. {Condition.DETACH_FORCED.value}, {Condition.CONNECTION_FORCED.value}, "
                f"{Condition.SERVER_BUSY.value}), got {condition!r}"
            )
    description = document.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > 1000):
        raise FaultError("description must be text of at most 1000 characters")
    return Fault(
        id=uuid.uuid4().hex[:12],
        kind=kind,
        entity=entity,
        session=session,
        operations=list(operations or []),
        count=count,
        fraction=1.0 if fraction is None else fraction,
        until_ms=now_ms + duration_ms,
        delay_ms=delay_ms or 0,
        condition=condition,
        description=description,
        created_ms=now_ms,
    )


def _from_record(record: dict[str, Any]) -> Fault | None:
    try:
        return Fault(**record)
    except TypeError:
        return None


def _now_ms() -> int:
    return int(time.time() * 1000)


class Faults:
    """This process's copy of the faults set on its namespace, and what they do here."""

    def __init__(
        self, store: Store, broker: Any, metrics: Any = None, *, enabled: bool = False
    ) -> None:
        self.store = store
        self.broker = broker  # busd.broker.broker.Broker: its links by entity
        self.metrics = metrics
        self.enabled = enabled  # --faults: else none is set, and none in the store acts
        self._faults: dict[str, Fault] = {}
        self._by_entity: dict[str, list[Fault]] = {}
        # faults applied once here already, until their window ends: never applied again
        self._applied: set[str] = set()
        self._stale: set[str] = set()  # records past their window never added here
        self.active = False  # the hot path's one check

    # --- following the store ----------------------------------------------------------------
    # The faults are catalog records of their own kind: the catalog reads each change of one
    # and hands it here (busd.broker.catalog.RecordFollower).
    async def start(self) -> None:
        if not self.enabled:
            return  # records left in the store by a busd that had them on stay inert
        self.broker.catalog.follow_records(RECORD_KIND, self)
        await self.reload()

    async def reload(self) -> None:
        records = await self.store.catalog_all()
        prefix = RECORD_KIND + ":"
        self.replace({n[len(prefix) :]: r for n, r in records.items() if n.startswith(prefix)})

    def replace(self, records: dict[str, dict[str, Any]]) -> None:
        fresh = {}
        for fault_id, record in records.items():
            fault = _from_record(record)
            if fault is not None:
                fresh[fault_id] = fault
        for gone in set(self._faults) - set(fresh):
            self._remove(gone)
        for fault in fresh.values():
            self._add(fault)

    def changed(self, path: str, record: dict[str, Any] | None) -> None:
        fault = None if record is None else _from_record(record)
        if fault is None:
            self._remove(path)
        else:
            self._add(fault)

    def _add(self, fault: Fault) -> None:
        if not fault.live(_now_ms()):
            self._stale.add(fault.id)  # past its window: for the sweep to delete
            return
        if fault.id in self._faults:
            return
        self._faults[fault.id] = fault
        self._index()
        if fault.kind in ONCE and fault.id not in self._applied:
            self._applied.add(fault.id)
            self._apply_once(fault)

    def _remove(self, fault_id: str) -> None:
        if self._faults.pop(fault_id, None) is not None:
            self._index()

    def _index(self) -> None:
        by_entity: dict[str, list[Fault]] = {}
        for fault in self._faults.values():
            if fault.kind not in ONCE:
                by_entity.setdefault(fault.entity, []).append(fault)
        self._by_entity = by_entity
        self.active = bool(by_entity)

    # --- the admin API's operations ---------------------------------------------------------
    async def add(self, fault: Fault) -> dict[str, Any]:
        """Set a fault (parsed, its entity resolved): every process hears of it. Raises
        FaultRefused when faults are off or the entity has MAX_PER_ENTITY already."""
        if not self.enabled:
            raise FaultRefused(
                "faults on demand are off: start busd with --faults (BUSD_FAULTS=1), "
                "for tests only (docs/faults.md)"
            )
        await self.reload()  # those other processes set too
        now = _now_ms()
        set_now = sum(1 for f in self._faults.values() if f.entity == fault.entity and f.live(now))
        if set_now >= MAX_PER_ENTITY:
            raise FaultRefused(
                f"{fault.entity!r} has {set_now} faults set, the most one entity may have "
                f"({MAX_PER_ENTITY}): remove one, or wait for one to end"
            )
        applied: dict[str, Any] = {}
        if fault.kind == "session-lock-lost":
            spec = self.broker.receivable(fault.entity)
            assert fault.session is not None and spec is not None
            ended = await self.store.lose_session_lock(spec, fault.session)
            applied["released"] = ended
        await self.store.catalog_put(RECORD_KIND, fault.id, asdict(fault))
        self._add(fault)
        self._hit(fault, "set")
        log.warning(
            "fault on demand %s set: %s on %s%s (%s)",
            fault.id,
            fault.kind,
            fault.entity,
            f" session {fault.session!r}" if fault.session else "",
            _scope_text(fault) or "now",
        )
        return {**fault.view(), **applied}

    async def listed(self) -> list[dict[str, Any]]:
        if not self.enabled:
            return []
        await self.reload()
        now = _now_ms()
        return [f.view() for f in self._faults.values() if f.live(now)]

    async def delete(self, fault_id: str) -> bool:
        existed = await self.store.catalog_delete([(RECORD_KIND, fault_id)])
        await self.store.fault_forget(fault_id)
        self._remove(fault_id)
        if existed:
            log.warning("fault on demand %s removed", fault_id)
        return bool(existed)

    async def sweep(self) -> None:
        """The broker's sweep tick: drop faults past their window (any process may)."""
        now = _now_ms()
        stale, self._stale = self._stale, set()
        for fault_id in stale:
            try:
                await self.store.catalog_delete([(RECORD_KIND, fault_id)])
                await self.store.fault_forget(fault_id)
            except Exception as exc:
                log.debug("dropping fault %s failed: %s", fault_id, exc)
        for fault in [f for f in self._faults.values() if not f.live(now)]:
            self._remove(fault.id)
            self._applied.discard(fault.id)  # past its window: never added again (_add)
            try:
                await self.store.catalog_delete([(RECORD_KIND, fault.id)])
                await self.store.fault_forget(fault.id)
            except Exception as exc:
                log.debug("dropping fault %s failed: %s", fault.id, exc)
            if fault.kind not in ONCE:
                log.warning("fault on demand %s ended: its window is over", fault.id)

    # --- the hooks --------------------------------------------------------------------------
    async def refusal(
        self, operation: str | tuple[str, ...], entity: str, session: str | None = None
    ) -> BusdError | None:
        """What a fault makes of one operation on an entity (only asked while `active`): the
        error to answer it with, None to go on (after a delay fault's wait). `operation`: one,
        or those one step of the protocol is (accept-session is also a receive)."""
        asked = (operation,) if isinstance(operation, str) else operation
        for fault in self._by_entity.get(entity, ()):
            operation = next((op for op in asked if op in fault.operations), "")
            if not operation:
                continue
            if fault.session is not None and fault.session != session:
                continue
            if not fault.live(_now_ms()):
                continue
            if fault.fraction < 1.0 and random.random() >= fault.fraction:
                continue
            if fault.count is not None and not await self._claim(fault):
                continue
            self._hit(fault, operation)
            if fault.kind == "delay":
                await asyncio.sleep(fault.delay_ms / 1000)
                continue
            return fault.error()
        return None

    async def check(
        self, operation: str | tuple[str, ...], entity: str, session: str | None = None
    ) -> None:
        """Raise what a fault makes of one operation (see `refusal`)."""
        error = await self.refusal(operation, entity, session)
        if error is not None:
            raise error

    async def _claim(self, fault: Fault) -> bool:
        """One hit of a counted fault, if any is left; the last one ends the fault."""
        hits = await self.store.fault_hit(fault.id)
        if hits >= (fault.count or 0):
            self._remove(fault.id)
            if hits == fault.count:
                await self.store.catalog_delete([(RECORD_KIND, fault.id)])
                await self.store.fault_forget(fault.id)
                log.warning("fault on demand %s ended: its count is spent", fault.id)
        return hits <= (fault.count or 0)

    def _hit(self, fault: Fault, operation: str) -> None:
        if operation != "set":
            log.info("fault on demand %s: %s of %s", fault.id, fault.kind, operation)
        if self.metrics is not None:
            self.metrics.fault_hit(fault.entity, fault.kind, operation)

    # --- faults applied once, in each process ------------------------------------------------
    def _endpoints(self, fault: Fault) -> Iterable[AttachedLink]:
        for endpoint in self.broker.attached(fault.entity):
            if endpoint.detached:
                continue
            if fault.session is not None and getattr(endpoint, "session_id", None) != (
                fault.session
            ):
                continue
            yield endpoint

    def _apply_once(self, fault: Fault) -> None:
        if fault.kind == "detach":
            self._detach(fault)
        elif fault.kind == "close-connection":
            self._close_connections(fault)
        elif fault.kind == "message-lock-lost":
            task = asyncio.get_running_loop().create_task(self._lose_message_locks(fault))
            task.add_done_callback(_log_failure)
        elif fault.kind == "session-lock-lost":
            self._lose_session(fault)

    def _lose_session(self, fault: Fault) -> None:
        """The session's holder here is told as at its lock's expiry: detached with
        session-lock-lost (`add` ended the lock in the store first). The Go SDK learns of a
        lost session lock from that detach alone: a refused settlement it retries on a
        session it accepts again, and then counts as settled."""
        error = BusdError(
            Condition.SESSION_LOCK_LOST, f"The lock on session '{fault.session}' was lost."
        )
        for endpoint in list(self._endpoints(fault)):
            lost = getattr(endpoint, "lost", None)
            if lost is not None:
                lost(error)

    def _detach(self, fault: Fault) -> None:
        error = fault.error()
        for endpoint in list(self._endpoints(fault)):
            endpoint.detach_with(error, triple=False)
            self._hit(fault, "detach")

    def _close_connections(self, fault: Fault) -> None:
        error = fault.error()
        seen = set()
        for endpoint in list(self._endpoints(fault)):
            if id(endpoint.conn) in seen:
                continue
            seen.add(id(endpoint.conn))
            endpoint.close_connection_with(error)
            self._hit(fault, "close-connection")

    async def _lose_message_locks(self, fault: Fault) -> None:
        """The message locks this process's receivers of the entity hold end now, as their
        expiry does: the messages come back with a counted attempt (abandon)."""
        for endpoint in list(self._endpoints(fault)):
            tokens = list(getattr(endpoint, "locked_tokens", lambda: [])())
            if not tokens:
                continue
            entity = endpoint.entity  # type: ignore[attr-defined]
            refused = await self.store.settle(
                entity, [Settlement(token=t, outcome=Outcome.ABANDON) for t in tokens]
            )
            lost = sum(1 for r in refused if r is None)
            for _ in range(lost):
                self._hit(fault, "lock")
            log.info("fault on demand %s: %d message lock(s) lost", fault.id, lost)


def _scope_text(fault: Fault) -> str:
    parts = []
    if fault.operations:
        parts.append("operations " + ",".join(fault.operations))
    if fault.count is not None:
        parts.append(f"count {fault.count}")
    if fault.fraction < 1.0:
        parts.append(f"fraction {fault.fraction:g}")
    if fault.kind not in ONCE:
        parts.append(f"for {(fault.ends_ms() - fault.created_ms) / 1000:g} s")
    if fault.delay_ms:
        parts.append(f"delay {fault.delay_ms} ms")
    return ", ".join(parts)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a fault on demand failed", exc_info=task.exception())
