"""Local transactions (docs/wire.md §10, docs/design.md §3.15): a declared transaction, and the
transactions of one connection.

OASIS AMQP 1.0 Part 4 [4.5] describes transactions; Service Bus uses local transactions only,
one connection each. A transaction belongs to the connection that declared it (valid on all of
its sessions, unknown on any other connection: its `TransactionScope` is the connection's
`transactions`) and to the coordinator link it was declared on (busd.broker.links.coordinator),
whose going rolls it back. Its operations (busd.broker.links.staging: sends to queues and topics,
settlements, `$management` schedule/cancel/update-disposition/set-session-state) are staged in
the store under its via entity as they arrive, each answered once staged. The commit applies
all of them in one store script (busd.storage's commitTransaction), so a process that dies at
any point leaves every transaction applied whole or not at all. What a dead process staged is
dropped by the sweep once the transaction's time is up. A message settled in a transaction
stays locked to its holder until the discharge.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from proton import Link

from busd.amqp import engine
from busd.errors import BusdError, Condition, store_unavailable
from busd.storage.api import Store
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import StagedOperation, StagedPublish, StagedSettlement, placed

if TYPE_CHECKING:
    from busd.broker.fanout import Fanout
    from busd.broker.settings import BrokerSettings

log = logging.getLogger("busd.broker")

# Service Bus limits (docs/wire.md §10.5): operations per transaction; the time from its first
# operation after which it is rolled back (BrokerSettings.transaction_timeout_s).
MAX_OPERATIONS = 100
# Operations staged by one store call.
MAX_STAGE_BATCH = 100

NOT_CROSS_ENTITY = (
    "Local transactions cannot span multiple top-level entities such as queue or topic."
)
NOT_CROSS_PARTITION = (
    "A transaction on a partitioned entity stays within one partition: this operation's "
    "session id, partition key or message is in another partition, or another entity."
)


def unknown() -> BusdError:
    return BusdError(
        Condition.TRANSACTION_UNKNOWN_ID,
        "The transaction is unknown on this connection, or already discharged.",
    )


def _timed_out() -> BusdError:
    return BusdError(
        Condition.TRANSACTION_TIMEOUT, "The transaction timed out and was rolled back."
    )


class Transaction:
    """One declared transaction: what it staged where, and the staging still under way."""

    def __init__(self, scope: TransactionScope, txn_id: bytes) -> None:
        self.scope = scope
        self.id = txn_id
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
    def store(self) -> Store:
        return self.scope.broker.store

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
            return unknown()
        if self.count >= MAX_OPERATIONS:
            return BusdError(
                Condition.RESOURCE_LIMIT,
                f"A transaction cannot hold more than {MAX_OPERATIONS} operations.",
            )
        entity = _entity_of(op)
        if entity.partitions:
            entity = placed(op, entity, self.via)
            _set_entity(op, entity)
        if self.via is None:
            self.via = entity
        elif entity.partition is not None or self.via.partition is not None:
            # one partition of one entity (a topic with its subscriptions: one key scope),
            # as Service Bus asks (docs/design.md §3.18)
            if entity.key_scope[0] != self.via.key_scope[0]:
                return BusdError(Condition.NOT_ALLOWED, NOT_CROSS_PARTITION)
        elif (
            not self.store.cross_slot_transactions and entity.key_scope[0] != self.via.key_scope[0]
        ):
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
                        self.via,
                        self.id,
                        [op for op, _ in batch],
                        first=not self.staged,
                        timeout_ms=int(self.scope.timeout_s * 1000),
                        limit=MAX_OPERATIONS,
                    )
                except BusdError as error:
                    result: BusdError | None = error
                except Exception as exc:
                    log.error("staging transaction work failed: %s", exc)
                    result = store_unavailable()
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
                route = self.scope.broker.fanout.route(topic.name)
            except BusdError:  # the topic is gone: the commit is refused
                continue
            if topic.partition is None:
                topics.append((route.topic, route.specs))
            else:  # the transaction's partition of it (docs/design.md §3.18)
                topics.append(
                    (
                        route.topic.partition_spec(topic.partition),
                        [s.partition_spec(topic.partition) for s in route.specs],
                    )
                )
        try:
            await self.store.commit_transaction(
                self.via, list(self.others.values()), self.id, topics
            )
        except BusdError:
            raise
        except Exception as exc:
            log.error("committing transaction %s failed: %s", self.id.hex(), exc)
            raise BusdError(
                Condition.INTERNAL, "The store did not answer the commit: its outcome is unknown."
            ) from None


Spec = QueueSpec | TopicSpec


def _set_entity(op: StagedOperation, entity: Spec) -> None:
    if isinstance(op, StagedSettlement):
        assert isinstance(entity, QueueSpec)
        op.entity = entity
    elif isinstance(op, StagedPublish):
        assert isinstance(entity, TopicSpec)
        op.topic = entity
    else:
        op.queue = entity


def _entity_of(op: StagedOperation) -> QueueSpec | TopicSpec:
    if isinstance(op, StagedSettlement):
        return op.entity
    if isinstance(op, StagedPublish):
        return op.topic
    return op.queue


class TransactionBroker(Protocol):
    """What transactions use of their broker: declared here rather than imported from
    busd.broker.links.base (whose ConnectionScope holds a TransactionScope), so that imports flow
    one way; busd.broker.links.base.BrokerScope has all of it."""

    @property
    def store(self) -> Store: ...

    @property
    def fanout(self) -> Fanout: ...

    @property
    def settings(self) -> BrokerSettings: ...


class TransactionScope:
    """A connection's transactions (they are unknown to its other connections), and which
    entity each of its cross-entity AMQP sessions is pinned to (docs/wire.md §10.6). The
    connection holds it (`ConnectionScope.transactions`) and it goes with the connection."""

    def __init__(self, broker: TransactionBroker) -> None:
        self.broker = broker
        self.transactions: dict[bytes, Transaction] = {}
        # raw pn_session_t -> entity name of its first entity link (None: not yet), for
        # sessions whose first link was a coordinator
        self._via_of_session: dict[Any, str | None] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def timeout_s(self) -> float:
        return self.broker.settings.transaction_timeout_s

    def declare(self, txn_id: bytes) -> Transaction:
        txn = self.transactions[txn_id] = Transaction(self, txn_id)
        return txn

    def get(self, txn_id: Any) -> Transaction:
        txn = self.transactions.get(bytes(txn_id)) if txn_id is not None else None
        if txn is None:
            raise unknown()
        return txn

    def forget(self, txn: Transaction) -> None:
        self.transactions.pop(txn.id, None)

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- cross-entity sessions ---------------------------------------------------------------
    def cross_entity(self, session: Any) -> None:
        """A coordinator attached before any entity link of the raw AMQP `session`: the
        session's first entity becomes its send-via entity."""
        self._via_of_session.setdefault(session, None)

    def end_cross_entity(self, session: Any) -> None:
        self._via_of_session.pop(session, None)

    def check_entity_link(self, link: Link, entity_name: str) -> None:
        """An entity link attaches on `link`'s session: in cross-entity mode, the first one
        pins the send-via entity, and a receiver on another entity is refused (docs/wire.md
        §10.6)."""
        session = engine.link_session(link._impl)
        if session not in self._via_of_session:
            return
        via = self._via_of_session[session]
        if via is None:
            self._via_of_session[session] = entity_name
        elif link.is_sender and entity_name != via:  # we send: a receiver on another entity
            raise BusdError(Condition.NOT_ALLOWED, NOT_CROSS_ENTITY)
