"""A process's waiters of partitioned entities, waiting as one: its next-available
acceptors of a queue, its receivers of a queue or subscription, of a dead-letter sub-queue
(docs/design.md §3.18).

An acceptor that finds no free session in any partition waits (a receiver short of
messages, likewise). Registered in each partition on its own, every waiting acceptor cost a
call per partition to register and another to leave: 16 partitions, 32 calls for each wait,
whatever the process already knew; an idle receiver's every fetch tried every partition.
Here the process waits instead, once per partition and kind: its waiter
(`<process id>:~<kind><p>:<entity>`, kind `s`, `q` or `d`) is registered in a partition by
the first call that finds it empty, and a later call skips a partition where it is
registered, since work there wakes that waiter (and so this process) first. The wake-up
goes to the process's oldest waiter of that kind, with the partition to look in first: one
call takes the session (or the messages). After one takes a session in the partition it was
woken for (or as many messages as it asked for there), the next waiting one looks there
too (the partition may have more, and woke one waiter): a chain that ends with the call
that finds the partition empty and registers the waiter again.

No wake-up is lost: one that finds no acceptor waiting here goes to an acceptor whose call
is under way (it looks in that partition once its call is done), else back to the store,
which passes it to another waiter where there is work (lua/stopWaiting.lua, called for an
id never registered, so that it cannot take off the process's waiter if a call registered
it again meanwhile). A registration is trusted for REGISTERED_S only: the store drops the
waiters of a process it thinks gone (lua/sweepQueue.lua) without saying so, and a lost
subscription (WAKE_ALL) forgets them all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from busd.storage.api import WAKE_ALL, WakeCallback
from busd.storage.messages import StoredMessage

log = logging.getLogger("busd.storage")

# How long a registration is trusted without a wake-up: then an accept looks again (one call
# per partition and process, registering the waiter again if it is still empty).
REGISTERED_S = 30.0


@dataclass
class QueueWaits:
    """One partitioned entity's waiters of one kind in this process: 's' next-available
    acceptors of a queue, 'q' receivers of a queue or subscription, 'd' of its dead-letter
    sub-queue. (An accept below is either's call.)"""

    name: str  # the entity's path
    kind: str = "s"
    # acceptors waiting, oldest first, with no wake-up in hand
    waiting: dict[str, None] = field(default_factory=dict)
    # acceptors woken for a partition they have not looked in yet
    woken: dict[str, int] = field(default_factory=dict)
    # partition -> when this process's waiter was registered there (monotonic)
    registered: dict[int, float] = field(default_factory=dict)
    # partition -> wake-ups of this process's waiter there so far: a registration whose
    # answer comes after a wake-up it did not see (the wake-up came first on its own
    # connection) is not one: the store took the waiter off again
    wakes: dict[int, int] = field(default_factory=dict)
    accepting: int = 0  # accept calls under way
    # partitions whose wake-up came while no acceptor waited but some were looking
    pending: list[int] = field(default_factory=list)
    # receivers that looked here through this process's waiters (their leaving is local)
    known: set[str] = field(default_factory=set)

    def skips(self, partition: int, now: float) -> bool:
        """Whether an accept need not look in `partition`: this process waits there."""
        since = self.registered.get(partition)
        return since is not None and now - since < REGISTERED_S


class PartitionWaits:
    """Every partitioned entity's waiters of this process, and the process's waiter ids.

    `wake(holder)` wakes an acceptor or receiver (the broker's wake-up for its id);
    `pass_on(waits, partition, waiter id)` hands a wake-up back to the store."""

    def __init__(self, process_id: str) -> None:
        self.process_id = process_id
        self.queues: dict[str, QueueWaits] = {}
        self._ids: dict[str, tuple[str, int]] = {}  # waiter id -> (kind + name, partition)
        self.wake: Callable[[str], None] = lambda holder: None
        self.pass_on: Callable[[QueueWaits, int, str], None] = lambda waits, p, waiter: None
        self.specs: dict[str, Any] = {}  # each waiting entity's spec, by kind + name
        self._passing: set[asyncio.Task] = set()

    # --- the store's side -----------------------------------------------------------------------
    def routed(self, on_wake: WakeCallback) -> WakeCallback:
        """What the inner store's subscription calls: a wake-up of this process's waiter of a
        partition goes to an acceptor or receiver here; WAKE_ALL drops every registration and,
        as any other, goes on to `on_wake`."""

        def wake(waiter: str, booked: Sequence[StoredMessage] = ()) -> None:
            if waiter == WAKE_ALL:
                self.lost()
            elif self.woke(waiter):  # this process's waiter of a partition
                return
            if booked:  # messages handed over to a holder (docs/design.md §3.5)
                on_wake(waiter, booked)
            else:
                on_wake(waiter)

        self.wake = on_wake
        return wake

    def hands_back(self, store: Any, parts: Callable[[Any], Sequence[Any]]) -> None:
        """A wake-up of this process's waiter that no acceptor or receiver here takes goes
        back to `store` (the inner one: the partition's handle from `parts`), which wakes
        another waiter if there is work in that partition (a free session, an available
        message: lua/stopWaiting.lua)."""

        def pass_on(waits: QueueWaits, partition: int, waiter: str) -> None:
            spec = self.specs.get(waits.kind + waits.name)
            if spec is None:
                return
            task = asyncio.get_running_loop().create_task(
                store.stop_waiting(parts(spec)[partition], waits.kind, waiter)
            )
            self._passing.add(task)
            task.add_done_callback(passed_on)

        def passed_on(task: asyncio.Task) -> None:
            self._passing.discard(task)
            if not task.cancelled() and task.exception() is not None:
                # the sweep wakes a waiter where a session is free (lua/sweepQueue.lua)
                log.debug("passing a wake-up on failed: %s", task.exception())

        self.pass_on = pass_on

    def of(self, name: str, kind: str = "s") -> QueueWaits:
        waits = self.queues.get(kind + name)
        if waits is None:
            waits = self.queues[kind + name] = QueueWaits(name, kind)
        return waits

    def waiter_id(self, waits: QueueWaits, partition: int) -> str:
        waiter = f"{self.process_id}:~{waits.kind}{partition}:{waits.name}"
        self._ids[waiter] = (waits.kind + waits.name, partition)
        return waiter

    # --- an accept ------------------------------------------------------------------------------
    async def look_in_turn(
        self,
        spec: Any,
        kind: str,
        holder: str,
        rotation: Callable[[Any], list[Any]],
        look: Callable[[Any, int, str | None], Awaitable[bool]],
        *,
        wait: bool = True,
        receiving: bool = False,
    ) -> None:
        """An accept (or a receive, `receiving`) of `holder` on the entity `spec`: `look(a
        partition's handle, its number, this process's waiter there or None)` in its partitions
        in turn (`to_look`, from `rotation(spec)`) until one finds what it looks for; with
        `wait`, the waiter is registered in each found short, and the partitions woken for
        meanwhile are looked in before the acceptor waits. A session found in the partition
        the acceptor was woken for lets the next one look there too; so does a receive that
        took all it asked for in any partition (the partition may have more: its call took
        the waiter off there, lua/receiveMessages.lua)."""
        waits = self.of(spec.name, kind)
        self.specs[kind + spec.name] = spec
        first = self.begin(waits, holder)
        found, woken_for = False, None
        try:
            while True:
                for part, p in self.to_look(waits, rotation(spec), first):
                    wakes = self.wakes_of(waits, p)
                    if await look(part, p, self.waiter_id(waits, p) if wait else None):
                        if receiving:
                            self.unregistered(waits, p)
                        found, woken_for = True, p if receiving or p == first else None
                        return
                    if wait:
                        self.registered(waits, p, wakes)
                if not wait or (first := self.next_pending(waits)) is None:
                    return
        finally:
            self.end(waits, holder, found=found, woken_for=woken_for, wait=wait)

    @staticmethod
    def to_look(waits: QueueWaits, order: list[Any], first: int | None) -> list[tuple[Any, int]]:
        """The partitions a call looks in, in turn, with their numbers: `first` (the one it
        was woken for) first, then in `order` (from a rotating one), less those where this
        process waits already."""
        if first is not None:
            order = sorted(order, key=lambda part: (part.partition or 0) != first)
        now = time.monotonic()
        return [
            (part, p)
            for part in order
            if (p := part.partition or 0) == first or not waits.skips(p, now)
        ]

    def begin(self, waits: QueueWaits, holder: str) -> int | None:
        """An accept of `holder` starts: it no longer waits; the partition it was woken for,
        to look in first (None: none)."""
        waits.waiting.pop(holder, None)
        if waits.kind != "s":  # a receiver leaves once, when its link closes
            waits.known.add(holder)
        waits.accepting += 1
        return waits.woken.pop(holder, None)

    def unregistered(self, waits: QueueWaits, partition: int) -> None:
        """A receive filled its count in `partition`: its call took the waiter off there."""
        waits.registered.pop(partition, None)

    def registered(self, waits: QueueWaits, partition: int, wakes: int) -> None:
        """The accept found `partition` empty and registered this process's waiter there;
        `wakes`: its wake-ups there when the accept's call went out (`wakes_of`)."""
        if waits.wakes.get(partition, 0) == wakes:
            waits.registered[partition] = time.monotonic()

    @staticmethod
    def wakes_of(waits: QueueWaits, partition: int) -> int:
        return waits.wakes.get(partition, 0)

    def next_pending(self, waits: QueueWaits) -> int | None:
        """A partition whose wake-up came while the accept looked, to look in now."""
        return waits.pending.pop(0) if waits.pending else None

    def end(
        self, waits: QueueWaits, holder: str, *, found: bool, woken_for: int | None, wait: bool
    ) -> None:
        """The accept is done: it locked a session (`found`) or, with `wait`, the acceptor
        waits. A session taken in the partition it was woken for (`woken_for`) lets the next
        acceptor look there too."""
        waits.accepting -= 1
        if not found and wait:
            waits.waiting[holder] = None
        elif found and woken_for is not None:
            self._give(waits, woken_for)
        # wake-ups that came while this accept looked and that no accept under way took
        pending, waits.pending = waits.pending, []
        for partition in pending:
            self._give(waits, partition)

    def leave(self, name: str, holder: str, kind: str = "s") -> bool:
        """`holder` stops waiting (it locked a session, its wait ran out, its link closed):
        whether it was waiting; a wake-up it had not used goes on."""
        waits = self.queues.get(kind + name)
        if waits is None:
            return False
        was = waits.waiting.pop(holder, False) is None
        partition = waits.woken.pop(holder, None)
        if partition is not None:
            self._give(waits, partition)
        return was

    def stop(self, name: str, holder: str, kind: str) -> bool | None:
        """`holder` stops waiting (Store.stop_waiting): an acceptor always here, a receiver
        here if it waited through this process's waiters (`knows`); whether it was waiting,
        or None where the store has its registration."""
        if kind == "s":
            return self.leave(name, holder)
        if self.knows(name, holder, kind):
            return self.leave(name, holder, kind)
        return None

    def knows(self, name: str, holder: str, kind: str) -> bool:
        """Whether `holder`, a receiver, waited through this process's waiters (else it
        registered itself, as a forwarder does, and leaves in the store)."""
        waits = self.queues.get(kind + name)
        if waits is None or holder not in waits.known:
            return False
        waits.known.discard(holder)
        return True

    # --- wake-ups -------------------------------------------------------------------------------
    def woke(self, waiter: str) -> bool:
        """A wake-up from the store: True when it was for this process's waiter of a
        partition (then it went to an acceptor, or on), False when it is someone else's."""
        target = self._ids.get(waiter)
        if target is None:
            return False
        key, partition = target
        waits = self.queues[key]
        waits.registered.pop(partition, None)  # the store took the waiter off
        waits.wakes[partition] = waits.wakes.get(partition, 0) + 1
        self._give(waits, partition)
        return True

    def lost(self) -> None:
        """Wake-ups may have been lost (WAKE_ALL): no registration is trusted."""
        for waits in self.queues.values():
            waits.registered.clear()

    def _give(self, waits: QueueWaits, partition: int) -> None:
        """A session may be free in `partition`: to the oldest acceptor waiting, else to an
        accept under way, else back to the store. Not where this process's waiter is
        registered again: an accept found the partition empty after the wake-up."""
        if partition in waits.registered:
            return
        holder = next(iter(waits.waiting), None)
        if holder is not None:
            del waits.waiting[holder]
            waits.woken[holder] = partition
            self.wake(holder)
        elif waits.accepting:
            waits.pending.append(partition)
        else:
            # As a waiter never registered: leaving, it wakes another where a session is free,
            # and cannot take off this process's waiter, registered again meanwhile.
            self.pass_on(waits, partition, f"{self.process_id}:~")
