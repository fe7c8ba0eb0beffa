"""A receiver holding one session (docs/wire.md §6.5, docs/design.md §2.6).

It first locks a session - a named one, or the next available one within the client's
`com.microsoft:timeout`, woken by any broker process's sends - and only then answers the
attach, echoing the session id in the source filter and the lock expiry in
`com.microsoft:locked-until-utc`. It then delivers that session's messages in order like any
queue receiver, and takes those a send on this process hands it (busd.broker.receivers).
The lock is its `SessionLease` (busd.broker.lease): it lasts LockDuration unless renewed
through `$management`; when it runs out the link is detached with
`com.microsoft:session-lock-lost` and the store's sweep returns the unsettled messages with
their delivery count raised. A receiver that closes releases the session: its unsettled
messages are available again, count unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from proton import Link, symbol

from busd.amqp import engine
from busd.broker.lease import SessionLease
from busd.broker.links.base import ConnectionScope
from busd.broker.links.outbox import MAX_BATCH
from busd.broker.links.receiving import QueueReceiverEndpoint
from busd.broker.messages import new_tokens
from busd.errors import BusdError, Condition, store_unavailable
from busd.storage.messages import HandOver, ReceiveMode, Settlement, StoredMessage
from busd.storage.specs import QueueSpec

log = logging.getLogger("busd.broker")

SESSION_FILTER = symbol("com.microsoft:session-filter")
TIMEOUT_PROPERTY = symbol("com.microsoft:timeout")
LOCKED_UNTIL_PROPERTY = symbol("com.microsoft:locked-until-utc")
SESSION_FILTER_NAME = SESSION_FILTER.encode()
LOCKED_UNTIL_NAME = LOCKED_UNTIL_PROPERTY.encode()
# Without `com.microsoft:timeout`, wait this long for a session, as Service Bus does.
DEFAULT_ACCEPT_TIMEOUT_MS = 60_000
DOTNET_EPOCH_TICKS = 621355968000000000


def _offer_of(token: bytes | None) -> bytes:
    """The random bytes of a lock token, which tell the tokens of one call (a token is the
    message's sequence number and 8 bytes of the broker's, the last of them a partitioned
    entity's partition, which the store's token has and this link's have not)."""
    return bytes(token[8:15]) if token else b""


def unix_ms_to_ticks(ms: int) -> int:
    """.NET ticks (100 ns since 0001-01-01), the unit of `locked-until-utc` (docs/wire.md §4.2)."""
    return ms * 10_000 + DOTNET_EPOCH_TICKS


class SessionReceiverEndpoint(QueueReceiverEndpoint):
    """Link scope: a receiver holding one session's lock."""

    def __init__(
        self,
        conn: ConnectionScope,
        link: Link,
        queue: QueueSpec,
        session_id: str | None,
        timeout_ms: int | None,
        filter_descriptor: int | str | None = None,
    ) -> None:
        super().__init__(conn, link, queue)
        self.requested_session = session_id
        # a described session filter's descriptor: the answer's filter is described alike, as
        # clients that only read described filters (go-amqp, so Go's SDK) need
        self.filter_descriptor = filter_descriptor
        self.timeout_ms = int(timeout_ms) if timeout_ms is not None else DEFAULT_ACCEPT_TIMEOUT_MS
        # the session's lock, once the store granted it to this link
        self.lease: SessionLease | None = None
        self._accepted = False  # the attach was answered: the link delivers
        self._accept_task: asyncio.Task | None = None
        self._woken: asyncio.Future | None = None  # set while waiting for a free session
        self._credit_seen = False  # first_credit was learnt from this link
        # Its standing offer (docs/design.md §3.5, busd.broker.links.outbox): the random bytes
        # of the tokens of the fetch under way (one of them may name the next offer), whether
        # the next fetch recovers what lost wake-ups carried, the sequence numbers of what
        # went out and the store has not settled yet, and of what the last recovery found.
        self._asked: set[bytes] = set()
        # Since its last fetch: woken by the store, and a send of this process carried the
        # session's messages. Woken with no send of its own to explain it, its messages come
        # from other processes, and its next fetch leaves a standing offer for them; else
        # the hand-over in this process (busd.broker.receivers) serves it better.
        self._nudged = False
        self._sent_here = False
        self._offered = False  # it asked for a standing offer once (its release ends it)
        self._recover = False
        self._out: set[int] = set()
        self._recovered: set[int] = set()

    @property
    def ready(self) -> bool:
        return self._accepted

    @property
    def locked_session(self) -> str:
        """The id of the session this link locked (only asked once it has)."""
        assert self.session_id is not None, "no session locked yet"
        return self.session_id

    def on_attach(self) -> None:
        self.broker.receivers.listen(self.holder, self.wake)
        self._accept_task = self.spawn(self._accept())

    def wake(self) -> None:
        """A wake-up from the store: a session became free (while waiting for one), or the
        held session got messages."""
        if self._accepted:
            self._nudged = True
            self.outbox.wake()
        elif self._woken is not None and not self._woken.done():
            self._woken.set_result(None)

    @property
    def _client(self) -> str:
        """Who holds the lock, for the session inspector: the client's container id and
        address."""
        return f"{self.conn.remote_container}\0{self.conn.proto.peer}"

    async def _accept(self) -> None:
        if self._forwarded:  # its forwarder takes every message (docs/design.md §2.15)
            return self._refuse(
                BusdError(
                    Condition.TIMEOUT,
                    "No session can be locked: the entity's messages are auto-forwarded.",
                )
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_ms / 1000
        store = self.broker.store
        if self.broker.faults.active and (  # faults on demand (docs/faults.md)
            error := await self.broker.faults.refusal(
                ("accept", "receive"), self.queue.name, self.requested_session
            )
        ):
            return self._refuse(error)
        next_available = self.requested_session is None
        waiting = False  # an earlier call registered us as a waiter
        while not self.detached:
            self._woken = woken = loop.create_future()
            # The same store call takes the session's first messages: as many as the client
            # has granted credit, else (most clients grant it once the attach is answered) as
            # many as this connection's last session receiver first granted, held until the
            # credit comes. Only in peek-lock: a link detached meanwhile gives them back with
            # the session, whereas receive-and-delete would have deleted them.
            credit = max(self.link.credit, 0)
            if credit:
                self._learn_credit()
            count = 0
            if self.mode == ReceiveMode.PEEK_LOCK:
                count = min(credit or self.conn.first_credit.get(self.queue.name, 0), MAX_BATCH)
            sent_at = time.monotonic()  # the lease's end here counts from it (lease.py)
            try:
                # With none free, the store registers us as a waiter in the same step: a
                # session that becomes free afterwards wakes exactly one waiter.
                lock = await store.accept_session(
                    self.queue,
                    self.requested_session,
                    self.holder,
                    wait=next_available,
                    count=count,
                    tokens=new_tokens(count),
                    client=self._client,
                    waiting=waiting,
                )
            except BusdError as error:
                return self._refuse(error)
            except Exception as exc:  # the store is unreachable: answer within the timeout
                log.warning("accepting a session of %s failed: %s", self.queue.name, exc)
                await self._stop_waiting(next_available)
                return self._refuse(store_unavailable())
            if lock is not None:
                self.session_id = lock.session_id
                self.lease = SessionLease(
                    store, self.queue, lock.session_id, self.holder, lock.locked_until_ms, sent_at
                )
                if not self.detached:
                    self._open_locked(self.lease)
                    # woken during the call: the session may have more than was taken
                    self.outbox.hold_first(lock.messages, count, woken.done())
                return  # (detached meanwhile: finish() releases the lock and what it took)
            waiting = next_available
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._woken, remaining)
            except TimeoutError:
                break
        self._woken = None
        await self._stop_waiting(next_available)
        if not self.detached:
            log.debug("no session available in %s within %d ms", self.queue.name, self.timeout_ms)
            self._refuse(
                BusdError(
                    Condition.TIMEOUT,
                    "No session with available messages could be locked within the timeout.",
                )
            )

    async def _stop_waiting(self, next_available: bool) -> None:
        """Leave the store's waiters, passing on a wake-up we may have been sent."""
        if not next_available:
            return
        try:
            await self.broker.store.stop_waiting(self.queue, "s", self.holder)
        except Exception as exc:  # the sweep drops a waiter whose process stops anyway
            log.debug("leaving the session waiters of %s failed: %s", self.queue.name, exc)

    def _refuse(self, error: BusdError) -> None:
        if not self.detached:
            self.conn.refuse(self, error)

    def _open_locked(self, lease: SessionLease) -> None:
        """Answer the attach; the first messages go out as the credit allows."""
        engine.open_session_link(
            self._raw_link,
            SESSION_FILTER_NAME,
            self.locked_session,
            LOCKED_UNTIL_NAME,
            unix_ms_to_ticks(lease.locked_until_ms),
            self.filter_descriptor,
        )
        self._accepted = True
        lease.start(self.broker.receivers.lease_timer, self._expired)
        self.broker.receivers.hold(self)
        self.kick()

    def on_flow(self) -> None:
        if not self._credit_seen and self.link.credit > 0:
            self._learn_credit()
        super().on_flow()

    def _learn_credit(self) -> None:
        self._credit_seen = True
        self.conn.first_credit[self.queue.name] = self.link.credit

    @property
    def delivering(self) -> bool:
        # Once the lock ended here (busd.broker.lease), nothing more goes out: what was taken
        # stays in flight in the store and comes back when it ends there (count + 1).
        return self.lease is not None and self.lease.held

    async def give_back(self, messages: list[StoredMessage]) -> None:
        # Detached, or the lock ended: the session's release, or the lock running out in the
        # store, returns them.
        if not self.detached and self.delivering:
            await super().give_back(messages)

    def settlement_refusal(self) -> BusdError | None:
        try:
            if self.lease is not None:
                self.lease.check_held()
        except BusdError as lost:
            return lost
        return None

    # --- messages handed over by sends (docs/design.md §3.5) ----------------------------------
    def offer(self, wanted: int) -> HandOver | None:
        """Take part in a send with up to `wanted` messages of the session (peek-lock only):
        the offer, or None. `handed_over` follows, whatever the send's fate."""
        if self.mode != ReceiveMode.PEEK_LOCK or (count := self.outbox.offer(wanted)) <= 0:
            return None
        return HandOver(self.locked_session, self.holder, count, new_tokens(count))

    def handed_over(self, offer: HandOver, taken: list[StoredMessage], filed: bool) -> None:
        self.outbox.handed_over(offer.count, taken, filed)

    def _expired(self) -> None:
        """The session lock ran out: the link is detached, and the store's sweep returns the
        in-flight messages with their delivery count raised (not a release)."""
        self.lost(
            BusdError(
                Condition.SESSION_LOCK_LOST,
                f"The lock on session '{self.session_id}' expired.",
            )
        )

    async def _receive(self, count: int, tokens: Sequence[bytes]) -> list[StoredMessage]:
        peek_lock = self.mode == ReceiveMode.PEEK_LOCK
        recover, self._recover = self._recover, False
        stand = peek_lock and self._nudged and not self._sent_here
        self._nudged = self._sent_here = False
        self._offered = self._offered or stand
        replace = self.outbox.standing
        if peek_lock:
            self._asked = {_offer_of(t) for t in tokens[:count]}
        try:
            got = await self.broker.store.receive_session(
                self.queue,
                self.locked_session,
                self.holder,
                count,
                self.mode,
                tokens,
                stand=stand,
                replace=replace,
                recover=recover,
            )
        except BusdError as error:
            if error.condition == Condition.SESSION_LOCK_LOST and self.lease is not None:
                self.lease.lost = True
            raise
        outbox = self.outbox
        outbox.standing = False
        if not (stand or replace or recover):
            return got
        messages: list[StoredMessage] = got
        taken = len(got)
        if recover:  # what went out already stays out; what the fetch took is new
            new = [m for m in got if _offer_of(m.lock_token) in self._asked]
            found = [m for m in got if _offer_of(m.lock_token) not in self._asked]
            self._recovered = {m.seq for m in found}
            messages = [m for m in found if m.seq not in self._out] + new
            taken = len(new)
        self._asked = set()
        # what was in flight before the fetch and has not come yet is on its way on wake-ups
        # (a send handed it over under the offer the fetch replaced): the round waits for it
        if stand or replace:
            known = self._out.union(m.seq for m in messages)
            outbox.awaiting = {s for s in got.in_flight if s not in known} - outbox.gathered
            outbox.standing = stand and taken < count
        return messages

    def sent_here(self) -> None:
        self._sent_here = True

    def booked(self, messages: Sequence[StoredMessage]) -> None:
        """A send handed these over under this link's standing offer (a wake-up carried them)."""
        if not self._accepted:
            return  # (its release returns them)
        out, recovered = self._out, self._recovered
        self.outbox.booked([m for m in messages if m.seq not in out and m.seq not in recovered])

    def missed(self) -> None:
        """Wake-ups may have been lost: the next fetch recovers what they carried."""
        if self.mode == ReceiveMode.PEEK_LOCK and self._accepted:
            self._recover = True
            self.outbox.recover()

    def transmit(self, messages: list[StoredMessage]) -> None:
        if self.mode == ReceiveMode.PEEK_LOCK:
            self._out.update(m.seq for m in messages)
        super().transmit(messages)

    def answer_settlement(self, delivery, settlement: Settlement, error: BusdError | None) -> None:
        super().answer_settlement(delivery, settlement, error)
        if settlement.token:
            seq = int.from_bytes(settlement.token[:8], "big")
            self._out.discard(seq)
            self.outbox.settled(seq)

    def on_detach(self) -> None:
        super().on_detach()
        if self.lease is not None:
            self.broker.receivers.let_go(self)
            self.lease.end()
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)  # stop waiting for a session now

    async def finish(self) -> None:
        """The acceptance under way, the fetch and the settlements the client sent before it
        detached, and only then the release: a settlement is never refused for a lock this
        link gave up itself, and the session can be accepted again the moment the detach is
        answered."""
        if self._accept_task is not None and not self._accept_task.done():
            await asyncio.gather(self._accept_task, return_exceptions=True)
        await super().finish()

    async def _last_call(self) -> None:
        if self.lease is None or self.lease.lost:
            return  # never held it, or the lock ran out (the sweep counts the attempt)
        try:
            # Closed by the client: unsettled messages are available again, count unchanged.
            await self.lease.release(offered=self._offered)
        except Exception as exc:  # the lock then runs out by itself
            log.warning(
                "releasing session %r of %s failed: %s", self.session_id, self.queue.name, exc
            )
