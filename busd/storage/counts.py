"""What the store counts of an entity (`EntityCounts`) and what a sweep did (`SweepResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SweepResult:
    expired_message_locks: int = 0
    expired_session_locks: list[str] = field(default_factory=list)
    expired_messages: int = 0
    activated_scheduled: int = 0
    expired_idle_sessions: int = 0  # removed by SessionIdleTimeToLive


@dataclass(slots=True)
class EntityCounts:
    active: int = 0  # available to receive now
    locked: int = 0
    scheduled: int = 0
    deferred: int = 0
    dead_letter: int = 0
    sessions: int = 0  # sessions with messages or state
    locked_sessions: int = 0
    free_sessions: int = 0  # with available messages and no holder
    oldest_enqueued_ms: int | None = None  # of its lowest-numbered message (not scheduled)
    # Monotonic totals of what happened to the entity, counted by the store inside each
    # transition (so exact across processes and paths), by event: sent, duplicates, received,
    # completed, abandoned, released, deferred, deadlettered (moved into the dead-letter
    # sub-queue, any reason), expired, lockexpired, sessionlockexpired, sessionexpired (idle
    # sessions removed), resubmitted, purged.
    # An event that never happened is absent.
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def active_message_count(self) -> int:
        """The management API's ActiveMessageCount (docs/management.md §4): available plus
        locked, as Service Bus counts a locked message active until it is settled. Every view
        of "active" (the ATOM answer, the admin API, the dashboard) reads this one."""
        return self.active + self.locked

    @property
    def message_count(self) -> int:
        """The management API's MessageCount: every message in every state."""
        return self.active_message_count + self.deferred + self.scheduled + self.dead_letter
