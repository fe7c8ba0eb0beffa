"""Local transactions (docs/wire.md §10, docs/design.md §3.15): the coordinator link, and the
transactional work of a connection's other links.

OASIS AMQP 1.0 Part 4 [4.5] describes the coordinator, `declare`, `discharge`, `declared` and
`transactional-state`; Service Bus uses local transactions only, one connection each.

A transaction belongs to the connection that declared it (valid on all of its sessions,
unknown on any other connection) and to the coordinator link it was declared on: that link
going (detach, end of its session, close of the connection) rolls it back. Its operations
(sends to queues and topics, settlements, `$management` schedule/cancel/update-disposition/
set-session-state) are staged in the store under its via entity as they arrive, each answered
once staged; a send to a topic is staged with the copies its subscriptions' rules make of it
then. The commit applies all of them in one store script (busd.storage's commitTransaction),
so a process that dies at any point leaves every transaction applied whole or not at all.
What a dead process staged is dropped by the sweep once the transaction's time is up. A
message settled in a transaction stays locked to its holder until the discharge.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import weakref
from typing import Any, Protocol

from proton import Array, Data, Delivery, Described, Link, Message, Terminus, symbol, ulong

from busd.amqp import codec, engine
from busd.broker import messages
from busd.broker.links import (
    CREDIT_WINDOW,
    ConnectionScope,
    LinkEndpoint,
    amqp_condition,
    echo_termini,
)
from busd.errors import BusdError, Condition
from busd.storage.api import (
    NewMessage,
    Outcome,
    QueueSpec,
    Settlement,
    StagedCancel,
    StagedOperation,
    StagedPublish,
    StagedSend,
    StagedSettlement,
    TopicSpec,
)

log = logging.getLogger("busd.broker")


# The links whose transactional work this module stages (busd.broker.sending and
# busd.broker.receiving import this module; it names only what it uses of them).
class TransactionalSender(Protocol):
    """A sender link on a queue or topic (busd.broker.sending.QueueSenderEndpoint)."""

    conn: ConnectionScope
    queue: QueueSpec | TopicSpec

    def kick(self) -> None: ...


class TransactionalReceiver(Protocol):
    """A receiver link (busd.broker.receiving.QueueReceiverEndpoint)."""

    conn: ConnectionScope
    entity: QueueSpec
    holder: str
    session_id: str | None

    def kick(self) -> None: ...

    def _answer(self, delivery: Any, settlement: Settlement, error: BusdError | None
                ) -> None: ...


# AMQP 1.0 Part 4 §4.5: descriptor codes of the transaction types.
COORDINATOR = 0x30
DECLARE = 0x31
DISCHARGE = 0x32
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
_DECLARE_NAMES = (ulong(DECLARE), symbol("amqp:declare:list"))
_DISCHARGE_NAMES = (ulong(DISCHARGE), symbol("amqp:discharge:list"))
_ACCEPTED = Described(ulong(0x24), [])
CAPABILITIES = (
    symbol("amqp:local-transactions"),
    symbol("amqp:multi-txns-per-ssn"),
    symbol("amqp:multi-ssns-per-txn"),
)

# Service Bus limits (docs/wire.md §10.5): operations per transaction; the time from its first
# operation after which it is rolled back (Broker.transaction_timeout_s, default 120 s).
MAX_OPERATIONS = 100
DEFAULT_TIMEOUT_S = 120.0
# Operations staged by one store call.
MAX_STAGE_BATCH = 100

NOT_CROSS_ENTITY = (
    "Local transactions cannot span multiple top-level entities such as queue or topic."
)

# The transaction a `$management` request carries in its transfer state (None: none); set
# while the request's handler task is created, which copies it (busd.broker.management).
REQUEST_TXN: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "busd_request_txn", default=None
)


def _unknown() -> BusdError:
    return BusdError(Condition.TRANSACTION_UNKNOWN_ID,
                     "The transaction is unknown on this connection, or already discharged.")


def _timed_out() -> BusdError:
    return BusdError(Condition.TRANSACTION_TIMEOUT,
                     "The transaction timed out and was rolled back.")


class Transaction:
    """One declared transaction: what it staged where, and the staging still under way."""

    def __init__(self, scope: TransactionScope, txn_id: bytes,
                 coordinator: CoordinatorEndpoint) -> None:  # fmt: skip
        self.scope = scope
        self.id = txn_id
        self.coordinator = coordinator
        # the entity its operations are staged under
        self.via: QueueSpec | TopicSpec | None = None
        self.others: dict[str, QueueSpec] = {}  # the queue-like entities it touches but via
        self.topics: dict[str, TopicSpec] = {}  # the topics it sends to or cancels on
        # what it settled, held locked until the discharge: entity path -> (entity, tokens)
        self.held: dict[str, tuple[QueueSpec, list[bytes]]] = {}
        self.count = 0  # operations staged or being staged
        self.staged = False  # the store holds something of it
        self.timed_out = False
        self.discharging = False
        self._queue: list[tuple[StagedOperation, asyncio.Future]] = []
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def store(self):
        return self.scope.conn.broker.store

    def stage(self, op: StagedOperation) -> asyncio.Future:
        """Stage one operation; the future is done (None, or the BusdError refusing it) once
        the store holds it. A refused operation is not part of the transaction."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        error = self._admit(op)
        if error is not None:
            future.set_result(error)
            return future
        self.count += 1
        self._queue.append((op, future))
        if self._timer is None:  # "the timer starts when the first operation starts"
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.scope.timeout_s, self._time_out)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._stage_pending())
        return future

    def _admit(self, op: StagedOperation) -> BusdError | None:
        if self.timed_out:
            return _timed_out()
        if self.discharging:
            return _unknown()
        if self.count >= MAX_OPERATIONS:
            return BusdError(
                Condition.RESOURCE_LIMIT,
                f"A transaction cannot hold more than {MAX_OPERATIONS} operations.",
            )
        entity = _entity_of(op)
        if self.via is None:
            self.via = entity
        elif (not self.store.cross_slot_transactions
              and entity.key_scope[0] != self.via.key_scope[0]):
            # one script reaches one cluster slot: one queue, or one topic with its
            # subscriptions (docs/design.md §3.15)
            return BusdError(Condition.NOT_ALLOWED, NOT_CROSS_ENTITY)
        if isinstance(entity, TopicSpec):
            self.topics[entity.name] = entity
        elif not (isinstance(self.via, QueueSpec) and entity.name == self.via.name):
            self.others.setdefault(entity.name, entity)
        return None

    async def _stage_pending(self) -> None:
        try:
            while self._queue:
                batch = self._queue[:MAX_STAGE_BATCH]
                del self._queue[:MAX_STAGE_BATCH]
                assert self.via is not None
                refused: dict[int, BusdError] = {}
                try:
                    _, due_ms = await self.store.stage_transaction(
                        self.via, self.id, [op for op, _ in batch], first=not self.staged,
                        timeout_ms=int(self.scope.timeout_s * 1000), limit=MAX_OPERATIONS,
                    )
                except BusdError as error:
                    result: BusdError | None = error
                except Exception as exc:
                    log.error("staging transaction work failed: %s", exc)
                    result = BusdError(Condition.SERVER_BUSY,
                                       "The store is unavailable; try again.")
                else:
                    result = None
                    self.staged = True
                    refused = await self._hold([op for op, _ in batch], due_ms)
                if result is not None:
                    self.count -= len(batch)
                for i, (_, future) in enumerate(batch):
                    if not future.done():
                        future.set_result(result or refused.get(i))
        finally:
            self._task = None

    async def _hold(self, ops: list[StagedOperation], due_ms: int) -> dict[int, BusdError]:
        """Keep what the operations settle locked to its holder until the transaction's time
        (docs/design.md §3.15): a lock that ran out before the commit would refuse it. The
        settlements whose lock is already gone, by index: the commit will refuse them."""
        by_entity: dict[str, list[tuple[int, StagedSettlement]]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, StagedSettlement):
                by_entity.setdefault(op.entity.path, []).append((i, op))
        refused: dict[int, BusdError] = {}
        for settlements in by_entity.values():
            entity = settlements[0][1].entity
            indexes = [i for i, _ in settlements]
            tokens = [op.settlement.token for _, op in settlements]
            try:
                await self.store.renew_message_locks(entity, tokens, until_ms=due_ms)
            except BusdError:  # one of them is lost: find which
                for i, token in zip(indexes, tokens):
                    try:
                        await self.store.renew_message_locks(entity, [token], until_ms=due_ms)
                    except BusdError as error:
                        refused[i] = error
            except Exception as exc:
                log.warning("holding the locks of a transaction's settlements failed: %s", exc)
            held = self.held.setdefault(entity.path, (entity, []))[1]
            held += [t for i, t in zip(indexes, tokens) if i not in refused]
        return refused

    async def _settled(self) -> None:
        """Wait for the staging under way: a discharge follows the work sent before it."""
        while self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def _time_out(self) -> None:
        self._timer = None
        if self.discharging:
            return
        self.timed_out = True
        log.info("transaction %s timed out: rolled back", self.id.hex())
        self.scope.spawn(self._discard())

    async def _discard(self) -> None:
        await self._settled()
        if not self.staged or self.via is None:
            return
        try:
            await self.store.discard_transaction(self.via, self.id)
        except Exception as exc:  # the sweep drops it once its time is up
            log.warning("dropping the staged work of a transaction failed: %s", exc)
        # What it settled stays locked to its holder, with the same token, for LockDuration
        # from now (as a renewal), no longer to the transaction's time.
        for entity, tokens in self.held.values():
            for token in tokens:  # one by one: one settled meanwhile fails alone
                try:
                    await self.store.renew_message_locks(entity, [token])
                except Exception:
                    pass

    async def discharge(self, fail: bool) -> None:
        """Commit (`fail` False) or roll back; raises the BusdError refusing a commit (the
        transaction is then rolled back: nothing of it applies)."""
        self.discharging = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._settled()
        if self.timed_out:
            if fail:
                return
            raise _timed_out()
        if fail or not self.staged:
            await self._discard()
            return
        assert self.via is not None
        topics = []
        for topic in self.topics.values():  # with their subscriptions as they are now
            try:
                route = self.scope.conn.broker.fanout.route(topic.name)
            except BusdError:  # the topic is gone: the commit is refused
                continue
            topics.append((route.topic, route.specs))
        try:
            await self.store.commit_transaction(self.via, list(self.others.values()), self.id,
                                                topics)
        except BusdError:
            raise
        except Exception as exc:
            log.error("committing transaction %s failed: %s", self.id.hex(), exc)
            raise BusdError(Condition.INTERNAL,
                            "The store did not answer the commit: its outcome is unknown.")\
                from None


def _entity_of(op: StagedOperation) -> QueueSpec | TopicSpec:
    if isinstance(op, StagedSettlement):
        return op.entity
    if isinstance(op, StagedPublish):
        return op.topic
    return op.queue


class TransactionScope:
    """A connection's transactions (they are unknown to its other connections), and which
    entity each of its cross-entity AMQP sessions is pinned to (docs/wire.md §10.6)."""

    def __init__(self, conn: ConnectionScope) -> None:
        self._conn = weakref.ref(conn)
        self.transactions: dict[bytes, Transaction] = {}
        # raw pn_session_t -> entity name of its first entity link (None: not yet), for
        # sessions whose first link was a coordinator
        self.via_of_session: dict[Any, str | None] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def conn(self) -> ConnectionScope:
        conn = self._conn()
        assert conn is not None
        return conn

    @property
    def timeout_s(self) -> float:
        return getattr(self.conn.broker, "transaction_timeout_s", DEFAULT_TIMEOUT_S)

    def get(self, txn_id: Any) -> Transaction:
        txn = self.transactions.get(bytes(txn_id)) if txn_id is not None else None
        if txn is None:
            raise _unknown()
        return txn

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


_SCOPES: weakref.WeakKeyDictionary[Any, TransactionScope] = weakref.WeakKeyDictionary()


def scope_of(conn: ConnectionScope) -> TransactionScope:
    scope = _SCOPES.get(conn)
    if scope is None:
        scope = _SCOPES[conn] = TransactionScope(conn)
    return scope


def has_transactions(conn: ConnectionScope) -> bool:
    scope = _SCOPES.get(conn)
    return scope is not None and bool(scope.transactions)


# --- the coordinator link ------------------------------------------------------------------
def is_coordinator(link: Link) -> bool:
    return not link.is_sender and link.remote_target.type == Terminus.COORDINATOR


class CoordinatorEndpoint(LinkEndpoint):
    """The client's controller link: `declare` and `discharge` in, settled answers out
    (docs/wire.md §10.2)."""

    def __init__(self, conn: ConnectionScope, link: Link) -> None:
        super().__init__(conn, link)
        self.scope = scope_of(conn)
        self.declared: set[bytes] = set()
        self._work: list[asyncio.Task] = []
        session = link.session._impl
        # A coordinator attached before any entity link of its AMQP session puts the session in
        # cross-entity mode: its first entity becomes the send-via entity.
        if not any(e.link.session._impl == session and hasattr(e, "queue") for e in conn.links):
            self.scope.via_of_session.setdefault(session, None)

    def on_attach(self) -> None:
        echo_termini(self.link)
        self.link.target.type = Terminus.COORDINATOR
        caps: Data = self.link.target.capabilities
        caps.clear()
        caps.put_object(Array(Data.NULL, Data.SYMBOL, *CAPABILITIES))
        self.link.open()
        self.link.flow(CREDIT_WINDOW)

    def on_delivery(self, delivery: Delivery) -> None:
        if not delivery.readable or delivery.partial:
            return
        payload = self.link.recv(delivery.pending)
        self.link.advance()
        if self.link.credit < CREDIT_WINDOW // 2:
            self.link.flow(CREDIT_WINDOW - self.link.credit)
        if delivery.aborted:
            delivery.settle()
            return
        try:
            name, fields = _control(payload)
        except BusdError as error:
            _reject(delivery, error)
            self.kick()
            return
        if name in _DECLARE_NAMES:
            self._declare(delivery, fields)
        else:
            self._work.append(self.spawn(self._discharge(delivery, fields)))

    def _declare(self, delivery: Delivery, fields: list) -> None:
        if fields and fields[0] is not None:
            _reject(delivery, BusdError(Condition.NOT_IMPLEMENTED,
                                        "Distributed transactions are not supported."))
        else:
            txn_id = os.urandom(16)
            self.scope.transactions[txn_id] = Transaction(self.scope, txn_id, self)
            self.declared.add(txn_id)
            delivery.local.data = [txn_id]  # type: ignore[list-item]  # any AMQP list
            delivery.update(DECLARED)
            delivery.settle()
        self.kick()

    async def _discharge(self, delivery: Delivery, fields: list) -> None:
        txn_id = fields[0] if fields else None
        fail = bool(fields[1]) if len(fields) > 1 and fields[1] is not None else False
        try:
            txn = self.scope.get(txn_id)
            if txn.discharging:
                raise _unknown()
            try:
                await txn.discharge(fail)
            finally:
                self._forget(txn)
        except BusdError as error:
            log.debug("discharge refused: %s", error)
            _reject(delivery, error)
        else:
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        self.kick()

    def _forget(self, txn: Transaction) -> None:
        self.scope.transactions.pop(txn.id, None)
        self.declared.discard(txn.id)

    def on_detach(self) -> None:
        """docs/wire.md §10.2: the link going rolls back what it declared and did not
        discharge."""
        super().on_detach()
        for txn_id in list(self.declared):
            txn = self.scope.transactions.get(txn_id)
            if txn is not None and not txn.discharging:
                self._work.append(self.spawn(self._roll_back(txn)))
        self.scope.via_of_session.pop(self.link.session._impl, None)

    async def _roll_back(self, txn: Transaction) -> None:
        try:
            await txn.discharge(True)
        finally:
            self._forget(txn)

    async def finish(self) -> None:
        if self._work:
            await asyncio.gather(*self._work, return_exceptions=True)


def _control(payload: bytes) -> tuple[Any, list]:
    """The descriptor and fields of a declare or discharge body (numeric or symbolic
    descriptor; header and properties sections ignored)."""
    message = Message()
    try:
        message.decode(payload)
    except Exception:
        raise BusdError(Condition.DECODE_ERROR, "Undecodable transaction control message.")\
            from None
    body = message.body
    if isinstance(body, Described) and body.descriptor in _DECLARE_NAMES + _DISCHARGE_NAMES:
        # a binary decodes as a view of proton's buffer, which is reused: copy it now
        fields = [bytes(f) if isinstance(f, memoryview) else f
                  for f in (body.value if isinstance(body.value, list) else [])]
        if body.descriptor in _DISCHARGE_NAMES and (not fields or fields[0] is None):
            raise BusdError(Condition.INVALID_FIELD, "A discharge names its txn-id.")
        return body.descriptor, fields
    raise BusdError(Condition.NOT_IMPLEMENTED,
                    "A coordinator takes declare and discharge messages only.")


def _reject(delivery: Delivery, error: BusdError) -> None:
    delivery.local.condition = amqp_condition(error)
    delivery.update(Delivery.REJECTED)
    delivery.settle()


# --- cross-entity sessions -------------------------------------------------------------------
def check_entity_link(conn: ConnectionScope, link: Link, entity_name: str) -> None:
    """An entity link attaches on `link`'s session: in cross-entity mode, the first one pins
    the send-via entity, and a receiver on another entity is refused (docs/wire.md §10.6)."""
    scope = _SCOPES.get(conn)
    if scope is None:
        return
    session = link.session._impl
    if session not in scope.via_of_session:
        return
    via = scope.via_of_session[session]
    if via is None:
        scope.via_of_session[session] = entity_name
    elif link.is_sender and entity_name != via:  # we send: a receiver on another entity
        raise BusdError(Condition.NOT_ALLOWED, NOT_CROSS_ENTITY)


# --- transactional work on other links --------------------------------------------------------
def txn_id_of(raw_delivery) -> bytes | None:
    """The txn-id of a transfer or disposition whose state is transactional-state, else
    None."""
    if engine.remote_state(raw_delivery) != TRANSACTIONAL_STATE:
        return None
    data = engine.wrap(raw_delivery).remote.data
    if not data or data[0] is None:
        return b""  # transactional without an id: unknown
    return bytes(data[0])


def stage_transfer(endpoint: TransactionalSender, raw_delivery, payload: bytes,
                   size: int) -> None:  # fmt: skip
    """A transactional send (the transfer's state is transactional-state): validated now,
    staged, answered `transactional-state(txn-id, accepted)` once the store holds it, or
    rejected (docs/wire.md §10.3)."""
    engine.hold(raw_delivery)
    txn_id = txn_id_of(raw_delivery) or b""
    target = endpoint.queue
    try:
        txn = scope_of(endpoint.conn).get(txn_id)
        messages.check_size(target, size)
        new = [messages.admit(target, m) for m in messages.parse(payload)]
        ops = [_send_op(endpoint.conn, target, m) for m in new]
    except BusdError as error:
        _answer_transfer(endpoint, raw_delivery, txn_id, error)
        return
    except Exception as exc:  # (a rule that broke on it): refused, the link goes on
        log.error("staging a send to %s failed: %s", target.name, exc)
        _answer_transfer(endpoint, raw_delivery, txn_id,
                         BusdError(Condition.INTERNAL, "The message could not be staged."))
        return
    futures = [txn.stage(op) for op in ops]

    def answered(_: Any) -> None:
        if all(f.done() for f in futures):
            errors = [f.result() for f in futures if f.result() is not None]
            _answer_transfer(endpoint, raw_delivery, txn_id, errors[0] if errors else None)

    for future in futures:
        future.add_done_callback(answered)
    if not futures:
        _answer_transfer(endpoint, raw_delivery, txn_id, None)


def _answer_transfer(endpoint: TransactionalSender, raw_delivery, txn_id: bytes,
                     error: BusdError | None) -> None:  # fmt: skip
    delivery = engine.wrap(raw_delivery)
    if error is None:
        delivery.local.data = [txn_id, _ACCEPTED]  # type: ignore[list-item]  # any AMQP list
        delivery.update(TRANSACTIONAL_STATE)
    else:
        log.debug("transactional send rejected: %s", error)
        delivery.local.condition = amqp_condition(error)
        delivery.update(Delivery.REJECTED)
    delivery.settle()
    engine.release(raw_delivery)
    endpoint.kick()


def stage_disposition(endpoint: TransactionalReceiver, raw_delivery, token: bytes) -> None:
    """A transactional settlement (the disposition's state is transactional-state with an
    outcome): staged, then answered with the plain outcome; its effect waits for the commit,
    the message staying locked meanwhile (docs/wire.md §10.4)."""
    txn_id = txn_id_of(raw_delivery) or b""
    data = engine.wrap(raw_delivery).remote.data or []
    settlement = _settlement(data[1] if len(data) > 1 else None)
    error: BusdError | None = None
    if settlement is None:
        settlement = Settlement(token=token, outcome=Outcome.RELEASE)
        error = BusdError(Condition.INVALID_FIELD,
                          "A transactional disposition carries an outcome.")
    settlement.token = token
    settlement.session_id = endpoint.session_id
    try:
        txn = scope_of(endpoint.conn).get(txn_id)
    except BusdError as unknown:
        error = error or unknown
    if error is not None:
        endpoint._answer(raw_delivery, settlement, error)
        endpoint.kick()
        return
    future = txn.stage(StagedSettlement(endpoint.entity, settlement, endpoint.holder))

    def answered(_: Any) -> None:
        endpoint._answer(raw_delivery, settlement, future.result())
        endpoint.kick()

    future.add_done_callback(answered)


_OUTCOME_CODES = {
    "amqp:accepted:list": 0x24, "amqp:rejected:list": 0x25, "amqp:released:list": 0x26,
    "amqp:modified:list": 0x27,
}  # fmt: skip


def _settlement(outcome: Any) -> Settlement | None:
    """The settlement an outcome inside a transactional-state asks for (docs/wire.md §7.1:
    accepted completes, modified abandons or defers, rejected dead-letters)."""
    if not isinstance(outcome, Described):
        return None
    descriptor = outcome.descriptor
    code = _OUTCOME_CODES.get(str(descriptor), 0) if isinstance(descriptor, str) else descriptor
    fields = outcome.value if isinstance(outcome.value, list) else []
    fields = fields + [None] * (3 - len(fields))
    if code == 0x24:
        return Settlement(token=b"", outcome=Outcome.COMPLETE)
    if code == 0x26:
        return Settlement(token=b"", outcome=Outcome.RELEASE)
    if code == 0x27:
        failed, undeliverable, annotations = fields[:3]
        result = Outcome.DEFER if undeliverable else Outcome.ABANDON
        if not failed and not undeliverable:
            result = Outcome.RELEASE
        patch = dict(annotations) if isinstance(annotations, dict) and annotations else None
        try:
            encoded = codec.encode_properties_patch({
                str(k): bytes(v) if isinstance(v, memoryview) else v for k, v in patch.items()
            }) if patch else None
        except codec.CodecError:
            encoded = None
        return Settlement(token=b"", outcome=result, properties_patch=encoded)
    if code == 0x25:
        error = fields[0]
        cond = error.value if isinstance(error, Described) and isinstance(error.value, list) \
            else []
        cond = cond + [None] * (3 - len(cond))
        info = cond[2] if isinstance(cond[2], dict) else {}
        reason = info.get(symbol("DeadLetterReason"), info.get("DeadLetterReason"))
        description = info.get(symbol("DeadLetterErrorDescription"),
                               info.get("DeadLetterErrorDescription", cond[1]))
        return Settlement(
            token=b"", outcome=Outcome.DEAD_LETTER,
            dead_letter_reason=None if reason is None else str(reason),
            dead_letter_description=None if description is None else str(description),
        )
    return None


def _send_op(conn: ConnectionScope, target: QueueSpec | TopicSpec, message: NewMessage,
             seq: int | None = None) -> StagedSend | StagedPublish:  # fmt: skip
    """A send to stage: to a topic, with the copies its subscriptions' rules make of it now."""
    if isinstance(target, TopicSpec):
        return conn.broker.fanout.staged(target, message, seq)
    return StagedSend(target, message, seq)


async def stage_scheduled(conn: ConnectionScope, target: QueueSpec | TopicSpec,
                          new: list[NewMessage]) -> list[int]:  # fmt: skip
    """`schedule-message` in a transaction: the messages' numbers now (a topic's), the
    messages at the commit (never, after a rollback: the numbers stay unused)."""
    txn = scope_of(conn).get(REQUEST_TXN.get())
    seqs = await conn.broker.store.reserve_sequence_numbers(target, len(new))
    for message, seq in zip(new, seqs):
        await _staged(txn.stage(_send_op(conn, target, message, seq)))
    return seqs


async def stage_cancels(conn: ConnectionScope, target: QueueSpec | TopicSpec,
                        seqs: list[int]) -> None:  # fmt: skip
    """`cancel-scheduled-message` in a transaction: the messages go at the commit (every
    subscription's copy, on a topic)."""
    txn = scope_of(conn).get(REQUEST_TXN.get())
    for seq in seqs:
        await _staged(txn.stage(StagedCancel(target, seq)))


async def _staged(future: asyncio.Future) -> None:
    error = await future
    if error is not None:
        raise error


async def stage_request(conn: ConnectionScope, op: StagedOperation) -> bool:
    """Stage the operation of a `$management` request made in a transaction (REQUEST_TXN);
    False when the request carries none (then it runs now). Raises what refuses it."""
    txn_id = REQUEST_TXN.get()
    if txn_id is None:
        return False
    await _staged(scope_of(conn).get(txn_id).stage(op))
    return True
