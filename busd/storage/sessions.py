"""Sessions as the store answers them: a lock taken (`SessionLock`) and the session inspector's
pages (`SessionDetail`, `SessionPage`, `SESSION_SORTS`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from busd.storage.messages import StoredMessage


@dataclass(slots=True)
class SessionLock:
    session_id: str
    locked_until_ms: int
    # the first messages, taken in the same step as the lock (accept_session's `count`)
    messages: list[StoredMessage] = field(default_factory=list)


# The session inspector's sorts: each is a sorted index of the store (lua/sessionPage.lua).
SESSION_SORTS = ("id", "locked", "waiting", "updated")


@dataclass(slots=True)
class SessionDetail:
    """One session as the inspector shows it (docs/management.md §7)."""

    session_id: str
    holder: str | None  # the holding receiver's id, `<process id>:<n>`; None when not held
    locked_until_ms: int | None
    client: str | None  # the holder's client container id and address, '\0'-separated
    state_size: int
    state_preview: bytes | None  # the state's first bytes
    active: int  # available messages
    in_flight: int  # delivered, not settled
    deferred: int
    scheduled: int
    oldest_enqueued_ms: int | None  # of the session's lowest-numbered message
    last_activity_ms: int  # accepted, a message settled, its lock ended; 0 unknown
    state_updated_ms: int  # 0 never set
    cursor: str = ""  # what continues a listing after this session

    @property
    def active_message_count(self) -> int:
        """The session's share of the management API's ActiveMessageCount (available plus in
        flight), as EntityCounts.active_message_count counts the entity's: what every view
        calls its "active"."""
        return self.active + self.in_flight

    @property
    def message_count(self) -> int:
        return self.active_message_count + self.deferred + self.scheduled


@dataclass(slots=True)
class SessionPage:
    sessions: list[SessionDetail]
    next: str | None  # the cursor of the next page; None on the last one
    total: int  # sessions in the sort's index
