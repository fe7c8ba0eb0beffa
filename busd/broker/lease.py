"""A session lock held by a receiver of this process: its one owner here (docs/design.md §2.6).

The lock itself lives in the store, which alone decides whether it is live: every store call
made under it (receive, settle, renew, session state) checks it there. `SessionLease` is what
this process knows of it, kept in one place: the session, its holder id, and its expiry as the
store last returned it (`locked_until_ms`, in the store's clock: from the accept, then from
each renewal). The receiver holding the session, `$management` (renew-session-lock,
get/set-session-state) and the broker's sweep all go through it.

The lease also ends here, sooner than in the store (`held`, docs/design.md §2.6): at the
lock's length after the call that took or renewed it was *sent* (so the store, which starts
the lock when the call arrives, cannot end it sooner whatever the round trip took), less
LEASE_MARGIN_S for the clocks (the store's may gain on this process's over a lock, or jump at
a failover to a replica). From then on the receiver delivers nothing more and its
settlements, renewals and session-state calls are refused here with session-lock-lost, even
while the store cannot be reached: the store can never give the session to another receiver
while this one still acts on it.

The process's leases share one timer (`LeaseTimer`, kept by busd.broker.receivers): each
lease is filed in the slot of the moment its receiver must be detached because the lock ran
out without a store call saying so (`lost_at`), a renewal files it again, and its end takes
it out; the timer wakes at the earliest slot only. A session's life so costs no timer of its
own (a many-short-sessions load held one asyncio timer per session, armed at the accept and
cancelled at the release). The sweep, which finds expired session locks in the store, checks
the leases too, through the registry of held sessions. Nothing of it runs per message.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable

from busd.errors import BusdError, Condition
from busd.storage.api import Store
from busd.storage.specs import QueueSpec

# See SessionLease.lost_at.
LOCK_LOST_GRACE_S = 2.0
# How much sooner than the store a lease ends here (module docstring): what the clocks may
# differ by over one lock. At most a quarter of the lock.
LEASE_MARGIN_S = 0.2
# Width of a slot of the leases' timer: a lost lock is told at most this much later than
# `lost_at` (plus the event loop's delay), past a grace of up to LOCK_LOST_GRACE_S anyway.
SLOT_S = 0.05


class SessionLease:
    """One session lock held by one receiver link of this process."""

    def __init__(
        self,
        store: Store,
        queue: QueueSpec,
        session_id: str,
        holder: str,
        locked_until_ms: int,
        sent_at: float,
    ) -> None:
        """`sent_at`: when the call that took the lock was sent (time.monotonic())."""
        self.store = store
        self.queue = queue
        self.session_id = session_id
        self.holder = holder  # the receiver's id in the store
        self.locked_until_ms = locked_until_ms  # the store's clock
        # When the lease ends here (time.monotonic()): `held`.
        self.held_until = self._ends_here(sent_at)
        # The store said the lock is gone, or it ran out here: its receiver does not release
        # the session (the sweep returns the messages, counting the attempt).
        self.lost = False
        self._on_lost: Callable[[], None] | None = None
        self._leases: LeaseTimer | None = None
        self.slot: int | None = None  # its slot in the leases' timer (`LeaseTimer`)

    def start(self, leases: LeaseTimer, on_lost: Callable[[], None]) -> None:
        """The receiver delivers under the lock from now: `on_lost` is called once the lock
        ran out (its timer, or the sweep), until `end`."""
        self._on_lost = on_lost
        self._leases = leases
        leases.add(self)

    @property
    def margin_s(self) -> float:
        """How much sooner than the store the lease ends here."""
        return min(LEASE_MARGIN_S, self.queue.lock_duration_ms / 4000)

    def _ends_here(self, sent_at: float) -> float:
        return sent_at + self.queue.lock_duration_ms / 1000 - self.margin_s

    @property
    def held(self) -> bool:
        """Whether the receiver may still act under the lock: not lost, and not past its end
        here (module docstring)."""
        return not self.lost and time.monotonic() < self.held_until

    def check_held(self) -> None:
        """Raise SESSION_LOCK_LOST unless `held`."""
        if not self.held:
            raise BusdError(
                Condition.SESSION_LOCK_LOST,
                f"The lock on session '{self.session_id}' expired.",
            )

    async def renew(self) -> int:
        """Extend the lock by LockDuration from now (raises SESSION_LOCK_LOST when it is no
        longer live, here or in the store); returns the new locked-until."""
        self.check_held()
        sent_at = time.monotonic()
        locked_until_ms = await self.store.renew_session_lock(
            self.queue, self.session_id, self.holder
        )
        self.locked_until_ms = locked_until_ms
        self.held_until = max(self.held_until, self._ends_here(sent_at))
        if self._leases is not None:  # started and not ended: the timer follows the lock
            self._leases.file(self)
        return locked_until_ms

    async def release(self, *, offered: bool = True) -> None:
        """The receiver closed: unlock the session (its unsettled messages are available
        again, count unchanged). `offered` False: it never left a standing offer."""
        await self.store.release_session(self.queue, self.session_id, self.holder, offered=offered)

    def lost_at(self) -> float:
        """When the receiver is told its session lock ran out (docs/wire.md §6.5): the lock's
        end plus a grace of the lock's own length, at most LOCK_LOST_GRACE_S. The store frees
        the session at the lock's end all the same, and any store call on the link meets the
        lost lock from then on; only the unprompted detach waits, so that a receive waiting as
        long as the lock (the SDK iterating with max_wait_time = LockDuration) ends on its own,
        as it does against Service Bus."""
        grace = min(LOCK_LOST_GRACE_S, self.queue.lock_duration_ms / 1000)
        return self.locked_until_ms / 1000 + grace

    def check(self) -> None:
        """The lease's timer, or the sweep that found the lock expired in the store: past
        `lost_at`, the lock is lost and its receiver told."""
        if self._on_lost is not None and self.lost_at() <= time.time():
            self.lost = True
            self._on_lost()

    def end(self) -> None:
        """The receiver is gone: no timer, no sweep for this lease any more."""
        self._on_lost = None
        if self._leases is not None:
            self._leases.remove(self)
            self._leases = None


class LeaseTimer:
    """The one timer of the process's session leases: slots of SLOT_S (by wall-clock time, as
    `lost_at`), each with the leases whose lock is told lost then, and one asyncio timer armed
    at the earliest slot."""

    def __init__(self) -> None:
        self._slots: dict[int, set[SessionLease]] = {}
        self._order: list[int] = []  # the slots, a heap (may hold emptied ones)
        self._ordered: set[int] = set()  # the slots `_order` holds, each once
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot: int | None = None

    def add(self, lease: SessionLease) -> None:
        self.file(lease)

    def remove(self, lease: SessionLease) -> None:
        self._unfile(lease)

    def file(self, lease: SessionLease) -> None:
        """File `lease` in the slot of its `lost_at` (again, after a renewal)."""
        slot = math.ceil(lease.lost_at() / SLOT_S) + 1
        if slot == lease.slot:
            return
        self._unfile(lease)
        lease.slot = slot
        leases = self._slots.get(slot)
        if leases is None:
            leases = self._slots[slot] = set()
            if slot not in self._ordered:  # (emptied and filled again before it came due)
                self._ordered.add(slot)
                heapq.heappush(self._order, slot)
        leases.add(lease)
        if self._timer_slot is None or slot < self._timer_slot:
            self._arm(slot)

    def _unfile(self, lease: SessionLease) -> None:
        slot, lease.slot = lease.slot, None
        if slot is None:
            return
        leases = self._slots.get(slot)
        if leases is not None:
            leases.discard(lease)
            if not leases:
                del self._slots[slot]  # (its number leaves `_order` when it comes due)

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        delay = max(0.0, slot * SLOT_S - time.time())
        self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        """The timer: check the leases of every slot that came due, then wait for the next."""
        self._timer = self._timer_slot = None
        now = time.time()
        order = self._order
        while order and order[0] * SLOT_S <= now:
            slot = heapq.heappop(order)
            self._ordered.discard(slot)
            for lease in list(self._slots.pop(slot, ())):
                lease.slot = None
                lease.check()  # lost: its receiver's detach ends the lease
                if not lease.lost and lease._leases is self:  # not yet (the clock went back)
                    self.file(lease)
        while order and order[0] not in self._slots:  # emptied slots
            self._ordered.discard(heapq.heappop(order))
        if order:
            self._arm(order[0])
