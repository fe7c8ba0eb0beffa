"""Transactional work on a connection's links (docs/wire.md §10.3, §10.4): what a sender, a
receiver or a `$management` node is given inside a transaction is staged in it
(busd.broker.transactions) instead of done, and answered once the store holds it.

A transfer or disposition says so with its state, `transactional-state` (one check of the
delivery state on the per-message path, in links.sending and links.receiving); a
`$management` request with its transfer state, kept in `REQUEST_TXN` while its handler runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, Protocol

from proton import Delivery, Described, ulong

from busd.amqp import engine
from busd.broker import messages
from busd.broker.links import outcomes
from busd.broker.links.base import ConnectionScope, amqp_condition
from busd.broker.transactions import NOT_CROSS_PARTITION
from busd.errors import BusdError, Condition
from busd.storage.messages import NewMessage, Outcome, Settlement
from busd.storage.specs import QueueSpec, TopicSpec
from busd.storage.staged import (
    StagedCancel,
    StagedOperation,
    StagedPublish,
    StagedSend,
    StagedSettlement,
    placed,
)

log = logging.getLogger("busd.broker")

# AMQP 1.0 Part 4 §4.5.5: the descriptor code of transactional-state.
TRANSACTIONAL_STATE = 0x34
_ACCEPTED = Described(ulong(outcomes.ACCEPTED), [])
# A settlement's outcome as a transactional echo carries it (docs/wire.md §7.2).
_ECHOES = {
    Outcome.COMPLETE: _ACCEPTED,
    Outcome.ABANDON: Described(ulong(outcomes.MODIFIED), [True, False]),
    Outcome.DEFER: Described(ulong(outcomes.MODIFIED), [True, True]),
    Outcome.DEAD_LETTER: Described(ulong(outcomes.REJECTED), []),
    Outcome.RELEASE: Described(ulong(outcomes.RELEASED), []),
}

# The transaction a `$management` request carries in its transfer state (None: none); set
# while the request's handler task is created, which copies it (busd.broker.links.management).
REQUEST_TXN: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "busd_request_txn", default=None
)


# The links whose transactional work this module stages (busd.broker.links.sending and
# busd.broker.links.receiving import this module; it names only what it uses of them).
class TransactionalSender(Protocol):
    """A sender link on a queue or topic (busd.broker.links.sending.QueueSenderEndpoint)."""

    conn: ConnectionScope
    queue: QueueSpec | TopicSpec

    def kick(self) -> None: ...


class TransactionalReceiver(Protocol):
    """A receiver link (busd.broker.links.receiving.QueueReceiverEndpoint)."""

    conn: ConnectionScope
    entity: QueueSpec
    holder: str
    session_id: str | None

    def kick(self) -> None: ...

    def answer_settlement(
        self, delivery: Any, settlement: Settlement, error: BusdError | None
    ) -> None: ...


def txn_id_of(raw_delivery) -> bytes | None:
    """The txn-id of a transfer or disposition whose state is transactional-state, else
    None."""
    if engine.remote_state(raw_delivery) != TRANSACTIONAL_STATE:
        return None
    data = engine.wrap(raw_delivery).remote.data
    if not data or data[0] is None:
        return b""  # transactional without an id: unknown
    return bytes(data[0])


def stage_transfer(endpoint: TransactionalSender, raw_delivery, payload: bytes, size: int) -> None:
    """A transactional send (the transfer's state is transactional-state): validated now,
    staged, answered `transactional-state(txn-id, accepted)` once the store holds it, or
    rejected (docs/wire.md §10.3)."""
    engine.hold(raw_delivery)
    txn_id = txn_id_of(raw_delivery) or b""
    target = endpoint.queue
    try:
        txn = endpoint.conn.transactions.get(txn_id)
        messages.check_size(target, size)
        new = [messages.admit(target, m) for m in messages.parse(payload)]
        ops = [_send_op(endpoint.conn, target, m) for m in new]
    except BusdError as error:
        _answer_transfer(endpoint, raw_delivery, txn_id, error)
        return
    except Exception as exc:  # (a rule that broke on it): refused, the link goes on
        log.error("staging a send to %s failed: %s", target.name, exc)
        _answer_transfer(
            endpoint,
            raw_delivery,
            txn_id,
            BusdError(Condition.INTERNAL, "The message could not be staged."),
        )
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


def _answer_transfer(
    endpoint: TransactionalSender, raw_delivery, txn_id: bytes, error: BusdError | None
) -> None:
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
    outcome): staged, then answered `transactional-state(txn-id, outcome)`; its effect waits
    for the commit, the message staying locked meanwhile (docs/wire.md §10.4)."""
    txn_id = txn_id_of(raw_delivery) or b""
    data = engine.wrap(raw_delivery).remote.data or []
    settlement = outcomes.of_described(data[1] if len(data) > 1 else None)
    error: BusdError | None = None
    if settlement is None:
        settlement = Settlement(token=token, outcome=Outcome.RELEASE)
        error = BusdError(
            Condition.INVALID_FIELD, "A transactional disposition carries an outcome."
        )
    settlement.token = token
    settlement.session_id = endpoint.session_id
    try:
        txn = endpoint.conn.transactions.get(txn_id)
    except BusdError as unknown:
        error = error or unknown
    if error is not None:
        endpoint.answer_settlement(raw_delivery, settlement, error)
        endpoint.kick()
        return
    future = txn.stage(StagedSettlement(endpoint.entity, settlement, endpoint.holder))

    def answered(_: Any) -> None:
        error = future.result()
        if error is None and not engine.remote_settled(raw_delivery):
            _echo_transactional(raw_delivery, txn_id, settlement.outcome)
        else:
            endpoint.answer_settlement(raw_delivery, settlement, error)
        endpoint.kick()

    future.add_done_callback(answered)


def _echo_transactional(raw_delivery, txn_id: bytes, outcome: Outcome) -> None:
    """Settle a staged settlement's delivery with `transactional-state(txn-id, outcome)`, the
    outcome as §7.2 echoes it: the Java SDK fails a transactional settlement answered with
    the plain outcome."""
    delivery = engine.wrap(raw_delivery)
    delivery.local.data = [txn_id, _ECHOES[outcome]]  # type: ignore[list-item]  # any AMQP list
    delivery.update(TRANSACTIONAL_STATE)
    delivery.settle()
    engine.release(raw_delivery)


def _send_op(
    conn: ConnectionScope,
    target: QueueSpec | TopicSpec,
    message: NewMessage,
    seq: int | None = None,
) -> StagedSend | StagedPublish:
    """A send to stage: to a topic, with the copies its subscriptions' rules make of it now."""
    if isinstance(target, TopicSpec):
        return conn.broker.fanout.staged(target, message, seq)
    return StagedSend(target, message, seq)


async def stage_scheduled(
    conn: ConnectionScope, target: QueueSpec | TopicSpec, new: list[NewMessage]
) -> list[int]:
    """`schedule-message` in a transaction: the messages' numbers now (a topic's), the
    messages at the commit (never, after a rollback: the numbers stay unused)."""
    txn = conn.transactions.get(REQUEST_TXN.get())
    if target.partitions:
        # numbered by the partition the messages go to: one, as the transaction's
        parts = {
            placed(
                StagedSend(target, m)
                if isinstance(target, QueueSpec)
                else StagedPublish(target, m, [], []),
                target,
                txn.via,
            )
            for m in new
        }
        if len(parts) > 1:
            raise BusdError(Condition.NOT_ALLOWED, NOT_CROSS_PARTITION)
        (target,) = parts
    seqs = await conn.broker.store.reserve_sequence_numbers(target, len(new))
    for message, seq in zip(new, seqs):
        await _staged(txn.stage(_send_op(conn, target, message, seq)))
    return seqs


async def stage_cancels(
    conn: ConnectionScope, target: QueueSpec | TopicSpec, seqs: list[int]
) -> None:
    """`cancel-scheduled-message` in a transaction: the messages go at the commit (every
    subscription's copy, on a topic)."""
    txn = conn.transactions.get(REQUEST_TXN.get())
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
    await _staged(conn.transactions.get(txn_id).stage(op))
    return True
