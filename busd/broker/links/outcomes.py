"""Outcome rules (docs/wire.md §7): which settlement a client's outcome asks for, and which
outcome answers a settlement done.

One table for every way an outcome arrives: a plain disposition on a receiver link
(`of_disposition`, read raw on the per-message path) and an outcome inside a
`transactional-state` (`of_described`, busd.broker.links.staging). Both end in `settlement_for`:

    accepted                                     -> complete
    rejected (DeadLetterReason, ...Description)  -> dead-letter
    released, or settled with no outcome         -> release
    modified, undeliverable-here                 -> defer
    modified, without undeliverable-here         -> abandon (delivery-failed or not: the
                                                    Java SDK abandons with neither flag)

A modified outcome's message-annotations are the application properties to change.
"""

from __future__ import annotations

from typing import Any

from proton import Described, symbol

from busd.amqp import codec, engine
from busd.storage.messages import Outcome, Settlement

# The outcomes' descriptor codes (OASIS AMQP 1.0 Part 3 §3.4), which are proton's PN_* states.
ACCEPTED = engine.ACCEPTED
REJECTED = engine.REJECTED
RELEASED = engine.RELEASED
MODIFIED = engine.MODIFIED
_CODES = {
    "amqp:accepted:list": ACCEPTED,
    "amqp:rejected:list": REJECTED,
    "amqp:released:list": RELEASED,
    "amqp:modified:list": MODIFIED,
}
_DEAD_LETTER_REASON = ("DeadLetterReason", symbol("DeadLetterReason"))
_DEAD_LETTER_DESCRIPTION = ("DeadLetterErrorDescription", symbol("DeadLetterErrorDescription"))


def settlement_for(
    code: int,
    *,
    undeliverable: bool = False,
    properties_patch: bytes | None = None,
    info: Any = None,
    description: str | None = None,
) -> Settlement | None:
    """The settlement (its token still to set) the outcome `code` asks for; None for a code
    that is no outcome. `undeliverable`/`properties_patch` are a modified
    outcome's; `info` (its error's info map) and `description` (its error's) a rejected
    one's."""
    if code == ACCEPTED:
        return Settlement(token=b"", outcome=Outcome.COMPLETE)
    if code == MODIFIED:
        outcome = Outcome.DEFER if undeliverable else Outcome.ABANDON
        return Settlement(token=b"", outcome=outcome, properties_patch=properties_patch)
    if code == REJECTED:
        if not isinstance(info, dict):
            info = {}
        reason = _text(_field(info, _DEAD_LETTER_REASON))
        detail = _text(_field(info, _DEAD_LETTER_DESCRIPTION))
        return Settlement(
            token=b"",
            outcome=Outcome.DEAD_LETTER,
            dead_letter_reason=reason,
            dead_letter_description=detail if detail is not None else description,
        )
    if code == RELEASED:
        return Settlement(token=b"", outcome=Outcome.RELEASE)
    return None


def _field(info: dict, names: tuple[str, Any]) -> Any:
    text, sym = names
    return info.get(sym, info.get(text))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def of_disposition(delivery) -> Settlement | None:
    """The settlement a client asked for with its disposition of a raw delivery; None while
    it asks for none (docs/wire.md §7.1)."""
    state = engine.remote_state(delivery)
    if state == MODIFIED:
        _, undeliverable = engine.remote_modified(delivery)
        patch: Any = engine.wrap(delivery).remote.annotations  # properties to modify, if any
        return settlement_for(
            MODIFIED,
            undeliverable=undeliverable,
            properties_patch=codec.encode_properties_patch(patch) if patch else None,
        )
    if state == REJECTED:
        cond = engine.wrap(delivery).remote.condition
        return settlement_for(
            REJECTED,
            info=cond.info if cond is not None else None,
            description=cond.description if cond is not None else None,
        )
    if state in (ACCEPTED, RELEASED):
        return settlement_for(state)
    if engine.remote_settled(delivery):  # settled without an outcome: released
        return settlement_for(RELEASED)
    return None


def of_described(outcome: Any) -> Settlement | None:
    """The settlement an outcome inside a `transactional-state` asks for (a described list,
    numeric or symbolic descriptor); None when it is no outcome."""
    if not isinstance(outcome, Described):
        return None
    descriptor = outcome.descriptor
    code = _CODES.get(descriptor, 0) if isinstance(descriptor, str) else descriptor
    if not isinstance(code, int):
        return None
    fields = outcome.value if isinstance(outcome.value, list) else []
    fields = fields + [None] * (3 - len(fields))
    if code == MODIFIED:
        _, undeliverable, annotations = fields[:3]  # delivery-failed: abandon either way
        return settlement_for(
            MODIFIED,
            undeliverable=bool(undeliverable),
            properties_patch=_lenient_patch(annotations),
        )
    if code == REJECTED:
        error = fields[0]
        cond = error.value if isinstance(error, Described) and isinstance(error.value, list) else []
        cond = cond + [None] * (3 - len(cond))
        return settlement_for(REJECTED, info=cond[2], description=_text(cond[1]))
    return settlement_for(code)


def _lenient_patch(annotations: Any) -> bytes | None:
    """A transactional modified outcome's annotations as a properties patch: read from a
    proton list, so keys become text and binaries bytes; one that cannot be encoded changes
    nothing."""
    if not isinstance(annotations, dict) or not annotations:
        return None
    try:
        return codec.encode_properties_patch(
            {str(k): bytes(v) if isinstance(v, memoryview) else v for k, v in annotations.items()}
        )
    except codec.CodecError:
        return None


def echo(delivery, outcome: Outcome) -> None:
    """Settle a raw delivery with the outcome that tells the client its settlement was done
    (docs/wire.md §7.2)."""
    if outcome == Outcome.COMPLETE:
        engine.settle(delivery, engine.ACCEPTED)
    elif outcome in (Outcome.ABANDON, Outcome.DEFER):
        engine.settle_modified(delivery, undeliverable=outcome == Outcome.DEFER)
    elif outcome == Outcome.DEAD_LETTER:
        engine.settle(delivery, engine.REJECTED)  # without error: success
    else:
        engine.settle(delivery, engine.RELEASED)
