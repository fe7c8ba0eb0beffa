"""Batch envelopes (docs/wire.md §5.2): telling a batch from a single message, and finding the
messages inside one. busd.amqp.incoming parses each of them like a message sent alone.
"""

from __future__ import annotations

from busd.amqp.decoding import RAW_ERRORS, malformed, skip_raw
from busd.amqp.sections import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    DATA,
    FOOTER,
    HEADER,
    PROPERTIES,
    list_start,
    scan_sections,
)
from busd.amqp.types import CodecError

__all__ = ["unpack_batch"]


def unpack_batch(payload: bytes) -> list[bytes] | None:
    """The inner messages of a batch envelope, or None when the payload is one message.

    proton-python cannot show a delivery's message-format (0x80013700 for a batch), so this
    looks at the content: a batch has one or more data sections, no other body, and each data
    section is itself a complete encoded message starting with a section descriptor
    `00 53 70..78`. When envelope and first inner message both carry a message-id they must be
    equal (the SDK and .NET copy the first message's id onto the envelope).

    False positive, rare: a single message whose binary body is itself a complete encoded AMQP
    message, and whose own message-id is absent or equal to the embedded one, is unpacked."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        parts = batch_parts(buf, scan_sections(buf))
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise malformed("message", exc) from None
    return None if parts is None else [part for part, _ in parts]


def batch_parts(buf: bytes, sections: list) -> list[tuple[bytes, list]] | None:
    """(inner message, its sections) for a batch envelope, None for a single message."""
    inner = []
    envelope_id = None
    for code, _start, vpos, end in sections:
        if code == DATA:
            c = buf[vpos]
            p = vpos + 2 if c == 0xA0 else vpos + 5 if c == 0xB0 else -1
            if p < 0 or end - p < 3 or buf[p] != 0 or buf[p + 1] != 0x53:
                return None
            if not HEADER <= buf[p + 2] <= FOOTER:
                return None
            inner.append(buf[p:end])
        elif code == AMQP_VALUE or code == AMQP_SEQUENCE:
            return None
        elif code == PROPERTIES:
            envelope_id = _first_field(buf, vpos)
    if not inner:
        return None
    parts = []
    for part in inner:
        try:
            parts.append((part, scan_sections(part)))
        except (CodecError, *RAW_ERRORS):
            return None
    if envelope_id is not None:
        first, first_sections = parts[0]
        for code, _, vpos, _ in first_sections:
            if code == PROPERTIES:
                first_id = _first_field(first, vpos)
                if first_id is not None and first_id != envelope_id:
                    return None
    return parts


def _first_field(buf: bytes, vpos: int) -> bytes | None:
    """The raw encoding of the first field of the list at vpos; None when absent or null."""
    p, count = list_start(buf, vpos)
    if count == 0 or buf[p] == 0x40:
        return None
    return buf[p : skip_raw(buf, p)]
