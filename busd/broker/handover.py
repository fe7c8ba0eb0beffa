"""Handing a sent message straight to the receiver holding its session (docs/design.md §3.5).

At a steady rate a session's holder is usually waiting, with credit, when the next message of
its session is sent. Filed available, that message costs a wake-up and a receive of the
holder's own; offered, the send's store call locks it for the holder and returns it, and it
goes out on the holder's link as its own receive would have sent it. Only a receiver of this
process can be offered (this process delivers what was handed over), only one with nothing
under way, and the store hands over only what is next in its session's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from busd.errors import BusdError, store_unavailable
from busd.storage.api import HandOver, NewMessage, QueueSpec, StoredMessage


class Holder(Protocol):
    """A session receiver that can be offered its session's messages (busd.broker.sessions)."""

    def offer(self, wanted: int) -> HandOver | None:
        """Take part in a send with up to `wanted` messages of the session: the offer, or None
        when the receiver cannot take any now. An offer holds back the receiver's own store
        calls until `handed_over`."""

    def handed_over(self, offer: HandOver, taken: list[StoredMessage]) -> None:
        """The send is done: deliver what the store handed over (`taken`)."""

    def lost(self, error: BusdError) -> None:
        """The send failed and may have handed messages over unseen: let the session go."""


class HandOvers:
    """This process's session holders that can be offered, by (queue path, session id)."""

    def __init__(self) -> None:
        self._holders: dict[tuple[str, str], Holder] = {}

    def holding(self, queue: str, session_id: str, holder: Holder) -> None:
        self._holders[(queue, session_id)] = holder

    def released(self, queue: str, session_id: str, holder: Holder) -> None:
        key = (queue, session_id)
        if self._holders.get(key) is holder:
            del self._holders[key]

    def offers(self, queue: QueueSpec, messages: list[NewMessage]) -> list[tuple[Holder, HandOver]]:
        """The offers to send with `messages`: one per session of theirs held here that can
        take some now."""
        if not self._holders or not queue.requires_session:
            return []
        wanted: dict[str, int] = {}
        for m in messages:
            if m.session_id is not None and m.scheduled_ms is None:
                wanted[m.session_id] = wanted.get(m.session_id, 0) + 1
        made = []
        for session_id, count in wanted.items():
            holder = self._holders.get((queue.name, session_id))
            if holder is not None and (offer := holder.offer(count)) is not None:
                made.append((holder, offer))
        return made


def hand_over(
    made: Sequence[tuple[Holder, HandOver]],
    handed: Sequence[list[StoredMessage]],
    failure: BaseException | None,
) -> None:
    """After the send: each holder delivers what it was handed (`handed`, per offer). A send
    that failed otherwise than by a refusal may have run: its holders let their sessions go,
    so that nothing handed over unseen is overtaken by the session's next messages."""
    for (holder, offer), taken in zip(made, handed):
        holder.handed_over(offer, taken)
        if failure is not None and not isinstance(failure, BusdError):
            holder.lost(store_unavailable())
