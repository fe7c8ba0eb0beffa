"""This process's receivers as the store knows them: where its wake-ups go, and the sessions
they hold (docs/design.md §3.5).

Every receiver (and forwarder) listens under its id in the store (lock holder, waiter): a
wake-up for that id calls it. A receiver holding a session is also found by (entity, session
id), as one record, the receiver itself: its lease is what the sweep checks when the store
expired the session's lock, it is the target a send hands the session's messages to, and the
link `$management` acts on the session through.

Hand-over (docs/design.md §3.5): at a steady rate a session's holder is usually waiting, with
credit, when the next message of its session is sent. Filed available, that message costs a
wake-up and a receive of the holder's own; offered, the send's store call locks it for the
holder and returns it, and it goes out through the holder's outbox (busd.broker.links.outbox) as
its own receive would have sent it. Only a receiver of this process can be offered (this
process delivers what was handed over), and the store hands over only what is next in its
session's order. A holder of another process is reached through the store instead: its
standing offer, left by its own receive, lets a send lock the message for it, and the wake-up
that would have sent it looking carries the message (`booked`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from busd.broker.lease import LeaseTimer
from busd.errors import BusdError, store_unavailable
from busd.storage.api import WAKE_ALL
from busd.storage.messages import HandOver, NewMessage, Sent, StoredMessage
from busd.storage.specs import QueueSpec

if TYPE_CHECKING:
    from busd.broker.lease import SessionLease

log = logging.getLogger("busd.broker")


class HeldSession(Protocol):
    """A receiver holding a session's lock (busd.broker.links.sessions)."""

    queue: QueueSpec
    holder: str  # its id in the store
    lease: SessionLease | None  # set before it is held

    @property
    def conn(self) -> object:
        """Its connection (a ConnectionScope of busd.broker.links.base, which names this module):
        only compared, so that `$management` acts on a session its own connection holds."""

    def sent_here(self) -> None:
        """A send of this process carries messages of the session."""

    def offer(self, wanted: int) -> HandOver | None:
        """Take part in a send with up to `wanted` messages of the session: the offer, or
        None when it cannot take any now. `handed_over` follows, whatever the send's fate."""

    def handed_over(self, offer: HandOver, taken: list[StoredMessage], filed: bool) -> None:
        """The send is done: deliver what the store handed over (`filed`: it filed some of the
        session's messages available too, and woke no one for them)."""

    def lost(self, error: BusdError) -> None:
        """Detach with `error` (the session is let go)."""

    def booked(self, messages: Sequence[StoredMessage]) -> None:
        """A send of another process handed these over under the receiver's standing offer."""

    def missed(self) -> None:
        """Wake-ups may have been lost: its next look recovers what was handed over to it."""


# Each offer, with how many messages of its session the send carries.
Offers = list[tuple[HeldSession, HandOver, int]]


class Receivers:
    """The receivers of one process, by their id in the store and by the session they hold."""

    def __init__(self) -> None:
        self._listening: dict[str, Callable[[], None]] = {}  # id -> what a wake-up calls
        self._held: dict[tuple[str, str], HeldSession] = {}  # (entity path, session id)
        self._booking: dict[str, HeldSession] = {}  # the same by their id in the store
        self.lease_timer = LeaseTimer()  # the one timer of the held sessions' leases

    # --- wake-ups ------------------------------------------------------------------------------
    def listen(self, receiver_id: str, wake: Callable[[], None]) -> None:
        self._listening[receiver_id] = wake

    def forget(self, receiver_id: str) -> None:
        self._listening.pop(receiver_id, None)

    def wake(self, receiver_id: str, booked: Sequence[StoredMessage] = ()) -> None:
        """The store woke one of our receivers (or, WAKE_ALL, wake-ups may have been lost), or
        carried messages handed over to one of our holders (`booked`). A wake-up for a
        receiver that has gone is dropped: it passed it on when it left."""
        if receiver_id == WAKE_ALL:
            for receiver in list(self._held.values()):
                receiver.missed()
            targets = list(self._listening.values())
        elif booked:
            held = self._booking.get(receiver_id)
            if held is not None:  # (else it let its session go: its release returned them)
                try:
                    held.booked(booked)
                except Exception:
                    log.exception("delivering to %s failed", receiver_id)
            return
        else:
            target = self._listening.get(receiver_id)
            targets = [target] if target is not None else []
        for wake in targets:
            try:
                wake()
            except Exception:
                log.exception("waking %s failed", receiver_id)

    # --- held sessions ---------------------------------------------------------------------------
    def hold(self, receiver: HeldSession) -> None:
        """`receiver` holds the session of its lease from now."""
        assert receiver.lease is not None
        self._held[(receiver.queue.name, receiver.lease.session_id)] = receiver
        self._booking[receiver.holder] = receiver

    def let_go(self, receiver: HeldSession) -> None:
        if receiver.lease is None:
            return
        key = (receiver.queue.name, receiver.lease.session_id)
        if self._held.get(key) is receiver:
            del self._held[key]
        if self._booking.get(receiver.holder) is receiver:
            del self._booking[receiver.holder]

    def holding(self, entity: str, session_id: str) -> HeldSession | None:
        """The receiver of this process holding `session_id` of `entity`, if any."""
        return self._held.get((entity, session_id))

    def expired_in_store(self, entity: str, session_ids: list[str]) -> None:
        """The sweep expired these session locks of `entity` in the store."""
        for session_id in session_ids:
            receiver = self._held.get((entity, session_id))
            if receiver is not None and receiver.lease is not None:
                receiver.lease.check()

    # --- hand-over -------------------------------------------------------------------------------
    def offers(self, queue: QueueSpec, messages: list[NewMessage]) -> Offers:
        """The offers to send with `messages`: one per session of theirs held here whose
        receiver can take some now."""
        if not self._held or not queue.requires_session:
            return []
        wanted: dict[str, int] = {}
        carried: dict[str, int] = {}
        for m in messages:
            if m.session_id is not None:
                carried[m.session_id] = carried.get(m.session_id, 0) + 1
                if m.scheduled_ms is None:
                    wanted[m.session_id] = wanted.get(m.session_id, 0) + 1
        made = []
        for session_id, count in wanted.items():
            receiver = self._held.get((queue.name, session_id))
            if receiver is None:
                continue
            receiver.sent_here()
            if (offer := receiver.offer(count)) is not None:
                made.append((receiver, offer, carried[session_id]))
        return made


def hand_over(made: Offers, sent: Sent | None, failure: BaseException | None = None) -> None:
    """After the send: each receiver offered delivers what it was handed (`sent` None: the send
    failed). A send that failed otherwise than by a refusal may have run: its receivers let
    their sessions go, so that nothing handed over unseen is overtaken by the session's next
    messages."""
    for i, (receiver, offer, carried) in enumerate(made):
        taken = [] if sent is None else sent.handed[i]
        # Fewer taken than carried: the rest was filed (or scheduled, or a duplicate dropped),
        # and the store woke no holder it was offered to (lua/sendMessages.lua).
        receiver.handed_over(offer, taken, sent is not None and len(taken) < carried)
        if failure is not None and not isinstance(failure, BusdError):
            receiver.lost(store_unavailable())
