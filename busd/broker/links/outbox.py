"""One receiver link's way out: every message the store hands the link goes out here.

Three producers fill it (docs/design.md §3.5): the link's own fetch, the first messages its
session accept took, and what sends handed over to the session it holds. Whatever they
return is gathered until the last call under way is done, then goes out in sequence order
while credit lasts; what does not fit (the credit went with a drain, the link closed, the
session's lock ended here) is given back from this one place, before anything else is taken,
so the order on the link holds.

A round is the producer calls under way together: a fetch and the sends that offered while
it ran, or sends alone. A send offers while no give-back is under way and nothing of the
round has come back yet (so a round under load still ends); with the others', the fetch's
messages may exceed the credit, and the excess is given back from the one place. The store
hands a send's message over only when its session has no other available message, so
whatever the round's calls return, merged by sequence number, is the session's order. Before
the client's first credit, what the accept took waits for it, and sends are offered the
credit the accept expected less what it took; what they hand over waits with it. When the
credit comes and covers the accept's messages, they go at once, earlier in the session than
anything a send under way may hand over. After a fetch that found fewer messages than it
asked for, and no wake-up came meanwhile, the link is dry: the same store call registered it
as a waiter, so a flow that only tops up credit costs no store call until the store wakes it.
A drain is answered after one more look.

A fourth producer is a held session's standing offer (docs/design.md §3.5): a fetch that
found fewer messages than it asked for leaves its offer in the store, under which a send of
any process locks the session's next messages for the link and publishes them on this
process's wake-up channel (`booked`); what exceeds the credit goes back as after a drain,
and its release, which files it available, ends the offer. While such messages may
still come (`standing`), sends of this process make no offer of their own, so that what they
hand over, returned on the store connection, never overtakes a booked message still on the
wake-up channel: their messages are handed over under the standing offer too, and come the
same way, in the store's order. The next fetch replaces the offer and learns which of the
session's messages were in flight before it; its round ends only once those of them the
link has not seen have come (`awaiting`), or the wake-ups may have been lost and a fetch
that recovers them (the link's messages in flight) ends it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine
from typing import Any, Protocol

from proton import Link

from busd.broker.links.base import is_open
from busd.errors import BusdError, store_unavailable
from busd.storage.messages import StoredMessage

log = logging.getLogger("busd.broker")

# Most messages one store call takes for one link, whatever the credit.
MAX_BATCH = 128


class Sink(Protocol):
    """The receiver link an outbox serves (busd.broker.links.receiving)."""

    link: Link
    detached: bool

    @property
    def ready(self) -> bool:
        """The attach was answered: the link may deliver."""

    @property
    def delivering(self) -> bool:
        """Messages may go out on the link now (not: its session's lock ended here, or its
        entity's messages are forwarded); when not, a drain is answered at once."""

    async def take(self, count: int) -> list[StoredMessage]:
        """The fetch: up to `count` messages from the store (raises as the store does)."""

    def transmit(self, messages: list[StoredMessage]) -> None:
        """Send messages on the link (the credit covers them)."""

    async def give_back(self, messages: list[StoredMessage]) -> None:
        """Return messages taken for the link that will not go out on it."""

    def lost(self, error: BusdError) -> None:
        """Detach the link with `error`."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task: ...

    def kick(self) -> None: ...


class Outbox:
    """Credit-bounded, sequence-ordered delivery of one receiver link."""

    def __init__(self, sink: Sink) -> None:
        # Weakly: the link owns its outbox, and a cycle between them would keep a closed
        # connection's objects until a full garbage collection (busd_connection_objects).
        self._sink: Sink = weakref.proxy(sink)
        self._under_way = 0  # producer calls whose messages are not gathered yet
        self._reserved = 0  # the credit the sends under way may fill
        self._gathered: list[StoredMessage] = []  # what they returned so far
        self._fetch: asyncio.Task | None = None
        self._returning: asyncio.Task | None = None  # a give-back: nothing is taken meanwhile
        self._woken = False  # a wake-up came while the fetch was under way
        self._dry = False  # see the module's docstring
        # The client has granted credit once: until then, what the accept took waits for it,
        # and sends are offered what the accept expected (`_expected`) less what it took.
        self._credited = False
        self._expected = 0
        self._looked = False  # the round under way includes a fetch
        # the link's standing offer: whether one stands, and the sequence numbers the round
        # waits for, in flight before the fetch that replaced it (see the module's docstring)
        self.standing = False
        self.awaiting: set[int] = set()
        self._back_later: list[StoredMessage] = []  # booked during a give-back: go back too

    @property
    def under_way(self) -> int:
        """How many producer calls (a fetch, the sends that offered) the link awaits."""
        return self._under_way

    # --- producers ---------------------------------------------------------------------------
    def pump(self) -> None:
        """Fetch when there is credit and perhaps something to take (a flow, a wake-up, the end
        of a round)."""
        sink = self._sink
        if sink.detached or not sink.ready:
            return
        link = sink.link
        if not sink.delivering:
            if link.drain_mode and is_open(link):
                link.drained()
                sink.kick()
            return
        if not self._credited and link.credit > 0:
            if self._gathered:
                self._first_credit()
                return
            self._credited = True
        if self._under_way or self._returning is not None:
            return  # the round's end pumps again
        credit = link.credit
        if credit <= 0 or (self._dry and not link.drain_mode):
            return
        count = min(credit, MAX_BATCH)
        self._credited = True
        self._under_way += 1
        self._woken = False
        self._fetch = sink.spawn(self._fetch_some(count))

    def wake(self) -> None:
        """Something may be available for the link now (a wake-up from the store, or its own
        abandon or release, for which the store wakes no one)."""
        self._dry = False
        if self._fetch is not None:
            self._woken = True
        self.pump()

    def hold_first(self, messages: list[StoredMessage], count: int, woken: bool) -> None:
        """What the session accept took (asking for `count`; `woken` during the call): sent
        once the client grants credit."""
        self._dry = len(messages) < count and not woken
        self._expected = count
        self._gathered += messages
        self.pump()

    def _first_credit(self) -> None:
        """The client's first credit, with messages waiting for it: they go now if nothing is
        under way or the credit covers them all (every message a send under way hands over is
        later in the session); else when the round ends, which gives back what does not fit."""
        if self._under_way and len(self._gathered) > self._sink.link.credit:
            return
        if not self._under_way:
            self._end_round(looked=True)
            return
        self._credited = True
        messages, self._gathered = self._gathered, []
        self._sink.transmit(messages)

    def offer(self, wanted: int) -> int:
        """A send offers up to `wanted` messages of the link's session: the credit reserved for
        them (0: none now). `handed_over` follows, whatever the send's fate."""
        sink = self._sink
        if self._returning is not None or (self._gathered and self._credited):
            return 0  # what goes back first, or the round is closing
        if self.standing or self.awaiting:
            return 0  # booked messages may be on their way: see the module's docstring
        if sink.detached or not sink.ready or not sink.delivering:
            return 0
        limit = sink.link.credit if self._credited else self._expected
        count = min(wanted, limit - self._reserved - len(self._gathered))
        if count <= 0:
            return 0
        self._under_way += 1
        self._reserved += count
        return count

    def handed_over(self, count: int, messages: list[StoredMessage], filed: bool) -> None:
        """The send that reserved `count` is done: what the store handed over to the link.
        `filed`: it also filed messages of the session available, for which the store wakes
        no holder it was offered to (lua/sendMessages.lua): the link looks again itself."""
        self._under_way -= 1
        self._reserved -= count
        self._gathered += messages
        if filed:
            self._dry = False
            if self._fetch is not None:
                self._woken = True  # the round's end looks again
        self._end_round(looked=False)

    @property
    def gathered(self) -> set[int]:
        """The sequence numbers of what the round gathered so far."""
        return {m.seq for m in self._gathered}

    def booked(self, messages: list[StoredMessage]) -> None:
        """Messages a send handed over under the link's standing offer."""
        if self.awaiting:
            self.awaiting.difference_update(m.seq for m in messages)
        if self._returning is not None:  # later in the session than what goes back now
            self._back_later += messages
            return
        self._gathered += messages
        self._end_round(looked=False)

    def settled(self, seq: int) -> None:
        """The store settled a message of the link: it is no longer awaited."""
        if seq in self.awaiting:
            self.awaiting.discard(seq)
            self._end_round(looked=False)

    def recover(self) -> None:
        """Wake-ups may have been lost, booked messages with them: look again at once, the
        link's messages in flight included (the sink's take knows), before the round ends."""
        self.awaiting = set()
        self._dry = False
        if self._under_way or self._returning is not None:
            self._woken = True
            return
        self._under_way += 1
        self._woken = False
        count = min(max(self._sink.link.credit, 0), MAX_BATCH)
        self._fetch = self._sink.spawn(self._fetch_some(count))

    async def _fetch_some(self, count: int) -> None:
        messages: list[StoredMessage] = []
        try:
            messages = await self._sink.take(count)
            self._dry = len(messages) < count and not self._woken
        except BusdError as error:
            self._dry = True  # the link goes: take nothing more
            self._sink.lost(error)
        except Exception as exc:  # the store is unreachable
            log.warning("receive failed: %s", exc)
            self._dry = True
            self._sink.lost(store_unavailable())
        finally:
            self._fetch = None
            self._under_way -= 1
        self._gathered += messages
        self._looked = True
        self._end_round(looked=True)

    # --- the way out -------------------------------------------------------------------------
    def _end_round(self, *, looked: bool) -> None:
        """Once nothing is under way: send what was gathered, in order, as far as the credit
        goes, and give back the rest. `looked`: the round was a look at the store (a fetch or
        an accept), whose finding answers a drain."""
        if self.awaiting:  # what came by any way, or was settled meanwhile, is not awaited
            self.awaiting.difference_update([m.seq for m in self._gathered])
        if self._under_way or self.awaiting:
            return
        looked, self._looked = looked or self._looked, False
        sink = self._sink
        link = sink.link
        messages, self._gathered = self._gathered, []
        if messages and (sink.detached or not is_open(link) or not sink.delivering):
            self._give_back(messages)
            return
        credit = max(link.credit, 0)  # less than was reserved only after a drain
        if messages and not self._credited:
            if not credit:
                self._gathered = messages  # until the client's first credit
                return
            self._credited = True
        if len(messages) > 1:
            messages.sort(key=lambda m: m.seq)  # sends may finish in any order
            # a fetch that recovered the link's messages in flight may meet what a send or a
            # wake-up brought in the same round
            messages = [m for i, m in enumerate(messages) if not i or messages[i - 1].seq != m.seq]
        if messages:
            sink.transmit(messages[:credit])
        if len(messages) > credit:
            self._give_back(messages[credit:])
            return
        # OASIS AMQP 1.0 Part 2 §2.6.7: "If set, the sender will (after sending all available
        # messages) advance the delivery-count as much as possible, consuming all
        # link-credit, and send the flow state to the receiver." (`drained` does both.)
        if looked and self._dry and link.drain_mode and not sink.detached and is_open(link):
            link.drained()
            sink.kick()
        self.pump()

    def _give_back(self, messages: list[StoredMessage]) -> None:
        self._returning = self._sink.spawn(self._return(messages))

    async def _return(self, messages: list[StoredMessage]) -> None:
        try:
            await self._sink.give_back(messages)
        except Exception as exc:  # they come back when their lock (or session's) ends
            log.warning("giving back %d messages failed: %s", len(messages), exc)
        finally:
            self._returning = None
        if self._back_later:
            later, self._back_later = self._back_later, []
            self._give_back(later)
            return
        self.wake()  # they may be next again

    # --- the end ---------------------------------------------------------------------------
    async def idle(self) -> None:
        """Wait until no fetch or give-back is under way (before the link's last store call)."""
        while True:
            pending = [t for t in (self._fetch, self._returning) if t is not None and not t.done()]
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)
