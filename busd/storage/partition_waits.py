"""A process's next-available acceptors of partitioned queues, waiting as one
(docs/design.md §3.18).

An acceptor that finds no free session in any partition waits. Registered in each partition
on its own, every waiting acceptor cost a call per partition to register and another to
leave: 16 partitions, 32 calls for each wait, whatever the process already knew. Here the
process waits instead, once per partition: its waiter (`<process id>:~<p>:<queue>`) is
registered in a partition by the first accept that finds it empty, and a later accept skips
a partition where it is registered, since a session freed there wakes that waiter (and so
this process) first. The wake-up goes to the process's oldest waiting acceptor, with the
partition to look in first: one call takes the session. After an acceptor takes a session
in the partition it was woken for, the next waiting acceptor looks there too (the partition
may have freed more than one, and woke one waiter): a chain that ends with the call that
finds the partition empty and registers the waiter again.

No wake-up is lost: one that finds no acceptor waiting here goes to an acceptor whose call
is under way (it looks in that partition once its call is done), else back to the store,
which passes it to another waiter where a session is free (lua/stopWaiting.lua, called for
an id never registered, so that it cannot take off the process's waiter if an accept
registered it again meanwhile). A
registration is trusted for REGISTERED_S only: the store drops the waiters of a process it
thinks gone (lua/sweepQueue.lua) without saying so, and a lost subscription (WAKE_ALL)
forgets them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# How long a registration is trusted without a wake-up: then an accept looks again (one call
# per partition and process, registering the waiter again if it is still empty).
REGISTERED_S = 30.0


@dataclass
class QueueWaits:
    """One partitioned queue's acceptors of this process."""

    name: str
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

    def skips(self, partition: int, now: float) -> bool:
        """Whether an accept need not look in `partition`: this process waits there."""
        since = self.registered.get(partition)
        return since is not None and now - since < REGISTERED_S


class PartitionWaits:
    """Every partitioned queue's acceptors of this process, and the process's waiter ids.

    `wake(holder)` wakes an acceptor (the broker's wake-up for its id); `pass_on(queue name,
    partition, waiter id)` hands a wake-up back to the store."""

    def __init__(self, process_id: str) -> None:
        self.process_id = process_id
        self.queues: dict[str, QueueWaits] = {}
        self._ids: dict[str, tuple[str, int]] = {}  # waiter id -> (queue name, partition)
        self.wake: Callable[[str], None] = lambda holder: None
        self.pass_on: Callable[[str, int, str], None] = lambda name, p, waiter: None

    def of(self, name: str) -> QueueWaits:
        waits = self.queues.get(name)
        if waits is None:
            waits = self.queues[name] = QueueWaits(name)
        return waits

    def waiter_id(self, name: str, partition: int) -> str:
        waiter = f"{self.process_id}:~{partition}:{name}"
        self._ids[waiter] = (name, partition)
        return waiter

    # --- an accept ------------------------------------------------------------------------------
    def begin(self, waits: QueueWaits, holder: str) -> int | None:
        """An accept of `holder` starts: it no longer waits; the partition it was woken for,
        to look in first (None: none)."""
        waits.waiting.pop(holder, None)
        waits.accepting += 1
        return waits.woken.pop(holder, None)

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

    def leave(self, name: str, holder: str) -> bool:
        """`holder` stops waiting (it locked a session, its wait ran out, its link closed):
        whether it was waiting; a wake-up it had not used goes on."""
        waits = self.queues.get(name)
        if waits is None:
            return False
        was = waits.waiting.pop(holder, False) is None
        partition = waits.woken.pop(holder, None)
        if partition is not None:
            self._give(waits, partition)
        return was

    # --- wake-ups -------------------------------------------------------------------------------
    def woke(self, waiter: str) -> bool:
        """A wake-up from the store: True when it was for this process's waiter of a
        partition (then it went to an acceptor, or on), False when it is someone else's."""
        target = self._ids.get(waiter)
        if target is None:
            return False
        name, partition = target
        waits = self.of(name)
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
            self.pass_on(waits.name, partition, f"{self.process_id}:~")
