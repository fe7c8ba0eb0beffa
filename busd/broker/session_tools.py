"""Operator tools for one session: dead-letter it whole, resubmit it, read and write its
state on a condition (docs/design.md §2.7, §2.9). The admin API (busd.observability.admin)
and the `$management` node (busd.broker.links.management) share the checks made here."""

from __future__ import annotations

from typing import Any

from busd.errors import BusdError, Condition
from busd.storage.api import Store
from busd.storage.specs import QueueSpec

# The reason an operator's dead-lettering gives when it names none.
DEFAULT_REASON = "SessionDeadLettered"


def session_queue(spec: QueueSpec) -> QueueSpec:
    """`spec`, which must be an entity with sessions (not its dead-letter sub-queue)."""
    if not spec.requires_session or spec.dlq:
        raise BusdError(
            Condition.NOT_ALLOWED,
            f"'{spec.path}' has no sessions: its messages are not kept in sessions.",
        )
    return spec


def dead_letter_reason(reason: Any, description: Any) -> tuple[str, str | None]:
    """The reason and description of a dead-lettered session, checked."""
    if reason is None or reason == "":
        reason = DEFAULT_REASON
    if not isinstance(reason, str) or (
        description is not None and not isinstance(description, str)
    ):
        raise BusdError(
            Condition.ARGUMENT_ERROR, "The dead-letter reason and description must be strings."
        )
    return reason, description or None


async def dead_letter(
    store: Store, spec: QueueSpec, session_id: str, reason: Any, description: Any
) -> int:
    """Dead-letter every message of the session and its state; how many messages moved."""
    why, text = dead_letter_reason(reason, description)
    return await store.dead_letter_session(session_queue(spec), session_id, why, text)


async def resubmit(store: Store, spec: QueueSpec, session_id: str) -> tuple[int, int]:
    """Bring the session's dead letters back into it: (moved, left locked)."""
    return await store.resubmit_session(session_queue(spec), session_id)


def check_state_size(spec: QueueSpec, state: bytes | None) -> None:
    if state is not None and len(state) > spec.max_message_size:
        raise BusdError(
            Condition.MESSAGE_SIZE_EXCEEDED,
            f"The session state of {len(state)} bytes exceeds the limit of "
            f"{spec.max_message_size} bytes.",
        )
