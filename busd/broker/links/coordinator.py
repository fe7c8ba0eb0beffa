"""The coordinator link (docs/wire.md §10.2): the client's controller link, `declare` and
`discharge` in, settled answers out.

OASIS AMQP 1.0 Part 4 [4.5] describes the coordinator, `declare`, `discharge` and
`declared`. A declared transaction lives in its connection's `TransactionScope`
(busd.broker.transactions); the link going (detach, end of its session, close of the
connection) rolls back what it declared and did not discharge.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Delivery,
    Described,
    Link,
    Message,
    Terminus,
    symbol,
    ulong,
)

from busd.amqp import engine
from busd.broker.links.base import (
    CREDIT_WINDOW,
    ConnectionScope,
    LinkEndpoint,
    amqp_condition,
    echo_termini,
)
from busd.broker.transactions import Transaction, unknown
from busd.errors import BusdError, Condition

log = logging.getLogger("busd.broker")

# AMQP 1.0 Part 4 §4.5: descriptor codes of the coordinator's types.
COORDINATOR = 0x30
DECLARE = 0x31
DISCHARGE = 0x32
DECLARED = 0x33
_DECLARE_NAMES = (ulong(DECLARE), symbol("amqp:declare:list"))
_DISCHARGE_NAMES = (ulong(DISCHARGE), symbol("amqp:discharge:list"))
CAPABILITIES = (
    symbol("amqp:local-transactions"),
    symbol("amqp:multi-txns-per-ssn"),
    symbol("amqp:multi-ssns-per-txn"),
)


def is_coordinator(link: Link) -> bool:
    return not link.is_sender and engine.remote_target_is_coordinator(link._impl)


class CoordinatorEndpoint(LinkEndpoint):
    """The client's controller link: `declare` and `discharge` in, settled answers out
    (docs/wire.md §10.2)."""

    def __init__(self, conn: ConnectionScope, link: Link) -> None:
        super().__init__(conn, link)
        self.scope = conn.transactions
        self.declared: set[bytes] = set()
        self._work: list[asyncio.Task] = []
        session = link.session._impl
        # A coordinator attached before any entity link of its AMQP session puts the session in
        # cross-entity mode: its first entity becomes the send-via entity.
        if not any(e.link.session._impl == session and hasattr(e, "queue") for e in conn.links):
            self.scope.cross_entity(session)

    def on_attach(self) -> None:
        echo_termini(self.link)
        self.link.target.type = Terminus.COORDINATOR
        caps: Data = self.link.target.capabilities
        caps.clear()
        # an array without a descriptor: the Java SDK's proton-j refuses a described one (as
        # Data.NULL for the descriptor makes it) and closes the connection
        caps.put_object(Array(UNDESCRIBED, Data.SYMBOL, *CAPABILITIES))  # type: ignore[arg-type]
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
            _reject(
                delivery,
                BusdError(Condition.NOT_IMPLEMENTED, "Distributed transactions are not supported."),
            )
        else:
            txn_id = os.urandom(16)
            self.scope.declare(txn_id)
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
                raise unknown()
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
        self.scope.forget(txn)
        self.declared.discard(txn.id)

    def on_detach(self) -> None:
        """docs/wire.md §10.2: the link going rolls back what it declared and did not
        discharge."""
        super().on_detach()
        for txn_id in list(self.declared):
            txn = self.scope.transactions.get(txn_id)
            if txn is not None and not txn.discharging:
                self._work.append(self.spawn(self._roll_back(txn)))
        self.scope.end_cross_entity(self.link.session._impl)

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
        raise BusdError(
            Condition.DECODE_ERROR, "Undecodable transaction control message."
        ) from None
    body = message.body
    if isinstance(body, Described) and body.descriptor in _DECLARE_NAMES + _DISCHARGE_NAMES:
        # a binary decodes as a view of proton's buffer, which is reused: copy it now
        fields = [
            bytes(f) if isinstance(f, memoryview) else f
            for f in (body.value if isinstance(body.value, list) else [])
        ]
        if body.descriptor in _DISCHARGE_NAMES and (not fields or fields[0] is None):
            raise BusdError(Condition.INVALID_FIELD, "A discharge names its txn-id.")
        return body.descriptor, fields
    raise BusdError(
        Condition.NOT_IMPLEMENTED, "A coordinator takes declare and discharge messages only."
    )


def _reject(delivery: Delivery, error: BusdError) -> None:
    delivery.local.condition = amqp_condition(error)
    delivery.update(Delivery.REJECTED)
    delivery.settle()
