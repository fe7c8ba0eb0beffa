"""AMQP 1.0 messages as busd handles them: what a sender's payload holds, the stored form
(the "blob"), and the payload delivered to a receiver.

The broker reads little of a message: header (ttl), two message-annotations (scheduled time,
partition key) and three properties (message-id, group-id, reply-to-group-id). Everything else
travels as the bytes the sender wrote. A blob is

    head (struct _BLOB_HEAD) | header fields | sender's annotation entries | bare message

where the header fields are the encoded durable/priority/ttl/first-acquirer (delivery-count is
appended per delivery), the annotation entries are the sender's message-annotations map body
with the broker-owned keys removed and every key a symbol, and the bare message is the
properties, application-properties, body and footer sections exactly as sent. The head also
records where application-properties sit in the bare message (or where they would go), so a
delivery that must patch them (dead-lettering, modified outcomes) need not search for them.

Delivering a message is then a few byte joins: a fresh header with the delivery-count, the
broker's annotations in front of the sender's, then the bare bytes (spec §4.2).

Value-level types and `CodecError` live in busd.amqp.types and are re-exported here.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

from busd.amqp.types import (
    RAW_ERRORS,
    AmqpDecimal,
    Array,
    Byte,
    CodecError,
    Described,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode_raw,
    decode_value,
    encode_into,
    encode_value,
    skip_raw,
    skip_value,
)

__all__ = [
    # values (from busd.amqp.types)
    "CodecError", "Symbol", "UByte", "UShort", "UInt", "ULong", "Byte", "Short", "Int", "Long",
    "Float", "Timestamp", "Array", "Described", "AmqpDecimal",
    "decode_value", "encode_value", "skip_value",
    # messages
    "HEADER", "DELIVERY_ANNOTATIONS", "MESSAGE_ANNOTATIONS", "PROPERTIES",
    "APPLICATION_PROPERTIES", "DATA", "AMQP_SEQUENCE", "AMQP_VALUE", "FOOTER",
    "PROPERTY_FIELDS", "HEADER_FIELDS",
    "split_sections", "IncomingMessage", "parse_incoming", "parse_transfer", "encode_delivery",
    "encode_properties_patch", "decode_properties_patch", "unpack_batch",
    "DecodedMessage", "decode_message", "encode_message",
]  # fmt: skip

# Section descriptor codes (AMQP 1.0 §3.2).
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SECTION_BY_SYMBOL = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
_SINGLETONS = (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES,
               APPLICATION_PROPERTIES, AMQP_VALUE, FOOTER)  # fmt: skip

HEADER_FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")
PROPERTY_FIELDS = (
    "message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
    "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
    "reply_to_group_id",
)  # fmt: skip

_u32 = struct.Struct(">I").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_pI = struct.Struct(">I").pack
_pq = struct.Struct(">q").pack
_pBI = struct.Struct(">BI").pack
_pBII = struct.Struct(">BII").pack


def _guarded(what: str, exc: BaseException) -> CodecError:
    return CodecError(f"malformed {what}: {exc}")


# ---------------------------------------------------------------------------------------------
# Sections


def _scan(buf: bytes) -> list[tuple[int, int, int, int]]:
    """(code, start, value start, end) of each section, in the order sent (raw errors)."""
    sections = []
    n = len(buf)
    pos = 0
    while pos < n:
        if buf[pos] != 0x00:
            raise CodecError(f"expected a message section at offset {pos}")
        d = buf[pos + 1]
        if d == 0x53:
            code = buf[pos + 2]
            vpos = pos + 3
        elif d == 0x80:
            code = _u64(buf, pos + 2)[0]
            vpos = pos + 10
        elif d == 0xA3 or d == 0xB3:
            name, vpos = decode_raw(buf, pos + 1)
            code = _SECTION_BY_SYMBOL.get(name, 0)
        else:
            raise CodecError(f"unsupported section descriptor constructor 0x{d:02x}")
        if not HEADER <= code <= FOOTER:
            raise CodecError(f"not a message section: descriptor {code!r} at offset {pos}")
        c = buf[vpos]
        if c == 0xC0 or c == 0xA0 or c == 0xC1:  # the usual section bodies, inlined
            end = vpos + 2 + buf[vpos + 1]
            if end > n:
                raise CodecError(f"section at offset {pos} runs past the end of the message")
        else:
            end = skip_raw(buf, vpos)
        sections.append((code, pos, vpos, end))
        pos = end
    return sections


def split_sections(payload: bytes) -> list[tuple[int, int, int]]:
    """(descriptor code, start, end) of every section of an encoded message, in wire order.

    Any order is accepted (the SDK writes delivery-annotations last, spec §4.1)."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        return [(code, start, end) for code, start, _, end in _scan(buf)]
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise _guarded("message", exc) from None


def _list_start(buf: bytes, vpos: int) -> tuple[int, int]:
    """(first element position, element count) of the list at vpos; null counts as empty."""
    c = buf[vpos]
    if c == 0xC0:
        return vpos + 3, buf[vpos + 2]
    if c == 0xD0:
        return vpos + 9, _u32(buf, vpos + 5)[0]
    if c == 0x45 or c == 0x40:
        return vpos + 1, 0
    raise CodecError(f"expected a list, found constructor 0x{c:02x}")


def _map_start(buf: bytes, vpos: int) -> tuple[int, int, int]:
    """(first entry position, element count, end) of the map at vpos; null counts as empty."""
    c = buf[vpos]
    if c == 0xC1:
        p, count, end = vpos + 3, buf[vpos + 2], vpos + 2 + buf[vpos + 1]
    elif c == 0xD1:
        p, count, end = vpos + 9, _u32(buf, vpos + 5)[0], vpos + 5 + _u32(buf, vpos + 1)[0]
    elif c == 0x40:
        return vpos + 1, 0, vpos + 1
    else:
        raise CodecError(f"expected a map, found constructor 0x{c:02x}")
    if count & 1:
        raise CodecError("map with an odd element count")
    return p, count, end


def _symbol_bytes(name: bytes) -> bytes:
    n = len(name)
    return (bytes((0xA3, n)) if n < 256 else _pBI(0xB3, n)) + name


def _map_header(count: int, size: int) -> bytes:
    if count < 256 and size < 255:
        return bytes((0xC1, size + 1, count))
    return _pBII(0xD1, size + 4, count)


# ---------------------------------------------------------------------------------------------
# Incoming messages and the stored form

# Annotations the broker owns: whatever a sender puts there is dropped (spec §4.1: a re-sent
# received message carries them back, some re-encoded with other types).
_BROKER_OWNED = frozenset(
    (
        b"x-opt-sequence-number",
        b"x-opt-enqueued-time",
        b"x-opt-locked-until",
        b"x-opt-message-state",
        b"x-opt-enqueue-sequence-number",
        b"x-opt-deadletter-source",
        b"x-opt-lock-token",
    )
)
_K_SCHEDULED = b"x-opt-scheduled-enqueue-time"
_K_PARTITION = b"x-opt-partition-key"

# version, flags, header-field bytes, annotation pairs, annotation bytes,
# application-properties start and end within the bare message.
_BLOB_HEAD = struct.Struct(">BBBIIII")
_BLOB_VERSION = 1
_HAS_APP_PROPERTIES = 0x01


class IncomingMessage:
    """What the broker needs from a message a client sent, and its stored form."""

    __slots__ = (
        "message_id",  # str | None: canonical text of properties.message-id (duplicate detection)
        "session_id",  # str | None: properties.group-id
        "reply_to_session_id",  # str | None: properties.reply-to-group-id
        "partition_key",  # str | None: annotation x-opt-partition-key
        "scheduled_ms",  # int | None: annotation x-opt-scheduled-enqueue-time, ms
        "ttl_ms",  # int | None: header.ttl
        "durable",  # bool | None: header.durable
        "priority",  # int | None: header.priority
        "blob",  # bytes: the stored form, input of encode_delivery
        "size",  # int: len(payload) as sent
    )

    def __init__(
        self, message_id, session_id, reply_to_session_id, partition_key, scheduled_ms,
        ttl_ms, durable, priority, blob, size,
    ) -> None:  # fmt: skip
        self.message_id = message_id
        self.session_id = session_id
        self.reply_to_session_id = reply_to_session_id
        self.partition_key = partition_key
        self.scheduled_ms = scheduled_ms
        self.ttl_ms = ttl_ms
        self.durable = durable
        self.priority = priority
        self.blob = blob
        self.size = size

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__ if n != "blob")
        return f"IncomingMessage({shown}, blob=<{len(self.blob)} bytes>)"


def parse_incoming(payload: bytes) -> IncomingMessage:
    """Read what the broker needs from a message a client sent and build its stored form.

    Delivery-annotations are dropped (they are per hop). A message without body is valid."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        return _parse_incoming(buf, _scan(buf))
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise _guarded("message", exc) from None


# Bit of each section that may appear once (indexed by code - HEADER); data and
# amqp-sequence sections may repeat.
_ONCE_BIT = (1, 2, 4, 8, 16, 0, 0, 128, 256)


def _parse_incoming(buf: bytes, sections: list) -> IncomingMessage:
    seen = 0
    durable = priority = ttl = None
    message_id = session_id = reply_session = None
    partition_key = scheduled = None
    ann, ann_pairs = b"", 0
    # The bare message (sections from properties on, in wire order), its length so far, and
    # where application-properties are in it (or would be inserted: after properties).
    bare_parts = []
    contiguous = True
    bare_len = 0
    flags = ap_start = ap_end = 0
    for code, start, vpos, end in sections:
        bit = _ONCE_BIT[code - HEADER]
        if seen & bit:
            raise CodecError(f"duplicate message section 0x{code:02x}")
        seen |= bit
        if code >= PROPERTIES:
            if bare_parts and bare_parts[-1][1] != start:
                contiguous = False
            bare_parts.append((start, end))
            size = end - start
            if code == PROPERTIES:
                message_id, session_id, reply_session = _read_properties(buf, vpos, end)
                if not flags:
                    ap_start = ap_end = bare_len + size
            elif code == APPLICATION_PROPERTIES:
                _check_application_properties(buf, vpos, end)
                flags = _HAS_APP_PROPERTIES
                ap_start, ap_end = bare_len, bare_len + size
            elif code == DATA and buf[vpos] != 0xA0 and buf[vpos] != 0xB0:
                raise CodecError("a data section must hold binary")
            bare_len += size
        elif code == HEADER:
            durable, priority, ttl = _read_header(buf, vpos, end)
        elif code == MESSAGE_ANNOTATIONS:
            ann, ann_pairs, scheduled, partition_key = _read_annotations(buf, vpos, end)
        # DELIVERY_ANNOTATIONS: dropped.

    if not bare_parts:
        bare = b""
    elif contiguous:
        bare = buf[bare_parts[0][0] : bare_parts[-1][1]]
    else:
        bare = b"".join([buf[start:end] for start, end in bare_parts])

    if durable is None and priority is None:
        header_fields = _NULL_HEADER if ttl is None else _TTL_ONLY_HEADER % _pI(ttl)
    else:
        header_fields = (
            (b"\x40" if durable is None else b"\x41" if durable else b"\x42")
            + (b"\x40" if priority is None else bytes((0x50, priority)))
            + (b"\x40" if ttl is None else _pBI(0x70, ttl))
            + b"\x40"  # first-acquirer: not carried over
        )
    head = _BLOB_HEAD.pack(
        _BLOB_VERSION, flags, len(header_fields), ann_pairs, len(ann), ap_start, ap_end
    )
    return IncomingMessage(
        message_id, session_id, reply_session, partition_key, scheduled, ttl, durable,
        priority, b"".join((head, header_fields, ann, bare)), len(buf),
    )  # fmt: skip


_NULL_HEADER = b"\x40\x40\x40\x40"
_TTL_ONLY_HEADER = b"\x40\x40\x70%b\x40"


def _read_header(buf: bytes, vpos: int, end: int):
    p, count = _list_start(buf, vpos)
    fields = [None, None, None]
    for i in range(count if count < 3 else 3):
        if buf[p] == 0x40:
            p += 1
        else:
            fields[i], p = decode_raw(buf, p, 1)
    if p > end:
        raise CodecError("header fields run past the header")
    durable, priority, ttl = fields
    if durable is not None and not isinstance(durable, bool):
        raise CodecError("header.durable must be a boolean")
    if priority is not None and (type(priority) is not int or not 0 <= priority <= 255):
        raise CodecError("header.priority must be a ubyte")
    if ttl is not None and (type(ttl) is not int or not 0 <= ttl <= 0xFFFFFFFF):
        raise CodecError("header.ttl must be a uint")
    return durable, priority, ttl


def _read_properties(buf: bytes, vpos: int, end: int):
    p, count = _list_start(buf, vpos)
    message_id = group_id = reply_group_id = None
    i = 0
    for i in range(count if count < 13 else 13):
        if buf[p] == 0x40:  # most fields are null
            p += 1
        elif i == 0:
            v, p = decode_raw(buf, p, 1)
            message_id = _message_id_text(v)
        elif i == 10:
            group_id, p = decode_raw(buf, p, 1)
        elif i == 12:
            reply_group_id, p = decode_raw(buf, p, 1)
        else:
            p = skip_raw(buf, p)
    if p > end:
        raise CodecError("properties run past the properties section")
    if group_id is not None:
        group_id = _text(group_id, "group-id")
    if reply_group_id is not None:
        reply_group_id = _text(reply_group_id, "reply-to-group-id")
    return message_id, group_id, reply_group_id


def _check_application_properties(buf: bytes, vpos: int, end: int) -> None:
    """Check the map's shape (string keys, entries within bounds) now, so that patching it at
    delivery time (dead-lettering) cannot fail on a message already stored."""
    p, count, map_end = _map_start(buf, vpos)
    if map_end > end:
        raise CodecError("application-properties run past their section")
    for _ in range(count >> 1):
        kc = buf[p]
        if kc != 0xA1 and kc != 0xB1 and kc != 0xA3 and kc != 0xB3:
            raise CodecError("application-property keys must be strings")
        p = skip_raw(buf, skip_raw(buf, p))
    if p != map_end:
        raise CodecError("application-properties do not match their map size")


def _message_id_text(v: Any) -> str | None:
    """The canonical text of a message-id (string, uuid, ulong or binary), as Service Bus
    compares them for duplicate detection."""
    if v is None:
        return None
    if isinstance(v, str):
        return str(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise CodecError(f"message-id of unsupported type {type(v).__name__}")


def _text(v: Any, field: str) -> str:
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str(v)
    raise CodecError(f"{field} must be a string")


def _read_annotations(buf: bytes, vpos: int, end: int):
    """(kept entries, kept pair count, scheduled ms, partition key) of message-annotations."""
    p, count, map_end = _map_start(buf, vpos)
    if map_end > end:
        raise CodecError("message-annotations run past their section")
    first = p
    kept = []
    pristine = True  # every entry kept as sent: the map body can be sliced as a whole
    scheduled = partition_key = None
    for _ in range(count >> 1):
        kc = buf[p]
        if kc == 0xA3 or kc == 0xA1:
            ks = p + 2
            ke = ks + buf[p + 1]
        elif kc == 0xB3 or kc == 0xB1:
            ks = p + 5
            ke = ks + _u32(buf, p + 1)[0]
        elif kc == 0x53 or kc == 0x80 or kc == 0x44:  # ulong keys are allowed, kept as they are
            ks = -1
            ke = skip_raw(buf, p)
        else:
            raise CodecError("message-annotation keys must be symbols or ulongs")
        ve = skip_raw(buf, ke)
        if ve > map_end:
            raise CodecError("message-annotations run past their map")
        if ks >= 0:
            name = buf[ks:ke]
            if name in _BROKER_OWNED:
                pristine = False
                p = ve
                continue
            if name == _K_SCHEDULED:
                v = decode_raw(buf, ke, 1)[0]
                if v is not None:
                    if type(v) is not Timestamp and type(v) is not int:
                        raise CodecError("x-opt-scheduled-enqueue-time must be a timestamp")
                    scheduled = int(v)
            elif name == _K_PARTITION:
                partition_key = decode_raw(buf, ke, 1)[0]
                if partition_key is not None:
                    partition_key = _text(partition_key, "x-opt-partition-key")
            if kc != 0xA3:  # annotation keys go out as symbols (spec §4.2)
                pristine = False
                kept.append(_symbol_bytes(name) + buf[ke:ve])
                p = ve
                continue
        kept.append(buf[p:ve])
        p = ve
    if p != map_end:
        raise CodecError("message-annotations do not match their map size")
    ann = buf[first:p] if pristine else b"".join(kept)
    return ann, len(kept), scheduled, partition_key


# ---------------------------------------------------------------------------------------------
# Deliveries

_HEADER_OPEN = b"\x00\x53\x70\xc0"
_ANNOTATIONS_OPEN = b"\x00\x53\x72"
_APP_PROPERTIES_OPEN = b"\x00\x53\x74"
_K_SEQ = _symbol_bytes(b"x-opt-sequence-number") + b"\x81"  # long
_K_ENQ = _symbol_bytes(b"x-opt-enqueued-time") + b"\x83"  # timestamp
_K_LOCKED = _symbol_bytes(b"x-opt-locked-until") + b"\x83"  # timestamp
_K_STATE = _symbol_bytes(b"x-opt-message-state") + b"\x71"  # int
_SEQ_ENQ = struct.Struct(f">{len(_K_SEQ)}sq{len(_K_ENQ)}sq")
_K_DL_REASON = encode_value("DeadLetterReason")
_K_DL_DESCRIPTION = encode_value("DeadLetterErrorDescription")


def encode_delivery(
    blob: bytes,
    *,
    seq: int,
    enqueued_ms: int,
    delivery_count: int,
    locked_until_ms: int | None = None,
    message_state: int | None = None,
    dead_letter_reason: str | None = None,
    dead_letter_description: str | None = None,
    properties_patch: bytes | dict | None = None,
) -> bytes:
    """The payload of a stored message as delivered to a receiver (spec §4.2).

    Header: all five fields, the sender's durable/priority/ttl and an explicit delivery-count.
    Message-annotations: x-opt-sequence-number (long), x-opt-enqueued-time (timestamp),
    x-opt-locked-until (timestamp) and x-opt-message-state (int) when given, then the sender's.
    Then the bare message as sent, except that dead-letter reason/description and a
    properties patch (from encode_properties_patch) are merged into application-properties."""
    try:
        _, flags, header_len, ann_pairs, ann_len, ap_start, ap_end = _BLOB_HEAD.unpack_from(blob)
    except (struct.error, TypeError):
        raise CodecError("not a stored message") from None
    p = _BLOB_HEAD.size
    header_fields = blob[p : p + header_len]
    p += header_len
    bare_start = p + ann_len
    if bare_start > len(blob) or blob[0] != _BLOB_VERSION:
        raise CodecError("not a stored message")

    try:
        if delivery_count == 0:
            count = b"\x43"
        elif 0 < delivery_count < 256:
            count = bytes((0x52, delivery_count))
        else:
            count = _pBI(0x70, delivery_count)
        broker = _SEQ_ENQ.pack(_K_SEQ, seq, _K_ENQ, enqueued_ms)
        pairs = ann_pairs + 2
        if locked_until_ms is not None:
            broker += _K_LOCKED + _pq(locked_until_ms)
            pairs += 1
        if message_state is not None:
            broker += _K_STATE + struct.pack(">i", message_state)
            pairs += 1
    except struct.error as exc:
        raise CodecError(f"delivery field out of range: {exc}") from None

    if dead_letter_reason is None and dead_letter_description is None and not properties_patch:
        bare = blob[bare_start:]
    else:
        bare = _patch_application_properties(
            blob[bare_start:],
            flags & _HAS_APP_PROPERTIES,
            ap_start,
            ap_end,
            properties_patch,
            dead_letter_reason,
            dead_letter_description,
        )
    return b"".join(
        (
            _HEADER_OPEN,
            bytes((header_len + len(count) + 1, 5)),
            header_fields,
            count,
            _ANNOTATIONS_OPEN,
            _map_header(2 * pairs, len(broker) + ann_len),
            broker,
            blob[p:bare_start],
            bare,
        )
    )


def _patch_application_properties(
    bare, present, ap_start, ap_end, patch, reason, description
) -> bytes:
    updates = _patch_entries(patch) if patch else {}
    if reason is not None:
        updates["DeadLetterReason"] = _K_DL_REASON + encode_value(str(reason))
    if description is not None:
        updates["DeadLetterErrorDescription"] = _K_DL_DESCRIPTION + encode_value(str(description))
    entries = []
    if present:
        try:
            section = bare[ap_start:ap_end]
            ((_, _, vpos, _),) = _scan(section)
            p, count, end = _map_start(section, vpos)
            for _ in range(count >> 1):
                key, ke = decode_raw(section, p, 1)
                ve = skip_raw(section, ke)
                raw = section[p:ve]
                if isinstance(key, str) and key in updates:
                    raw = updates.pop(key)
                entries.append(raw)
                p = ve
        except CodecError:
            raise
        except RAW_ERRORS as exc:
            raise _guarded("stored application-properties", exc) from None
    entries.extend(updates.values())
    body = b"".join(entries)
    section = _APP_PROPERTIES_OPEN + _map_header(2 * len(entries), len(body)) + body
    return b"".join((bare[:ap_start], section, bare[ap_end:]))


def encode_properties_patch(changes: dict[str, Any]) -> bytes:
    """Application-property changes in the opaque form the store keeps.

    The form is a run of encoded key/value pairs, so two patches concatenate into one:
    `old + new` applies both, the later value winning for a key set twice."""
    out = bytearray()
    try:
        for key, value in changes.items():
            if not isinstance(key, str):
                raise CodecError(f"application-property keys are strings, not {key!r}")
            encode_into(out, str(key))
            encode_into(out, value)
    except CodecError:
        raise
    except (struct.error, OverflowError, UnicodeError, AttributeError, TypeError) as exc:
        raise CodecError(f"cannot encode properties patch: {exc}") from None
    return bytes(out)


def _patch_entries(patch: bytes | dict) -> dict[str, bytes]:
    if isinstance(patch, dict):
        patch = encode_properties_patch(patch)
    entries: dict[str, bytes] = {}
    p = 0
    try:
        while p < len(patch):
            key, ke = decode_raw(patch, p, 1)
            if not isinstance(key, str):
                raise CodecError("properties patch key is not a string")
            ve = skip_raw(patch, ke)
            entries[str(key)] = patch[p:ve]
            p = ve
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise _guarded("properties patch", exc) from None
    return entries


def decode_properties_patch(patch: bytes) -> dict[str, Any]:
    """The changes held by a patch from encode_properties_patch (later keys win)."""
    buf = patch if type(patch) is bytes else bytes(patch)
    return {k: decode_value(raw, skip_value(raw))[0] for k, raw in _patch_entries(buf).items()}


# ---------------------------------------------------------------------------------------------
# Batches (spec §3.5)


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
        parts = _batch_parts(buf, _scan(buf))
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise _guarded("message", exc) from None
    return None if parts is None else [part for part, _ in parts]


def parse_transfer(payload: bytes) -> list[IncomingMessage]:
    """`parse_incoming` of each message a transfer carries: the inner messages of a batch
    envelope (see unpack_batch), else the payload itself. Scans the payload once."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        sections = _scan(buf)
        parts = _batch_parts(buf, sections)
        if parts is None:
            return [_parse_incoming(buf, sections)]
        return [_parse_incoming(part, part_sections) for part, part_sections in parts]
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise _guarded("message", exc) from None


def _batch_parts(buf: bytes, sections: list) -> list[tuple[bytes, list]] | None:
    """(inner message, its sections) for a batch envelope, None for a single message."""
    inner = []
    envelope_id = None
    for code, start, vpos, end in sections:
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
            parts.append((part, _scan(part)))
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
    p, count = _list_start(buf, vpos)
    if count == 0 or buf[p] == 0x40:
        return None
    return buf[p : skip_raw(buf, p)]


# ---------------------------------------------------------------------------------------------
# Whole messages, for request/response traffic ($cbs, $management): small and not hot.


class DecodedMessage(NamedTuple):
    header: dict[str, Any] | None  # by HEADER_FIELDS name; None when the section is absent
    delivery_annotations: dict
    message_annotations: dict
    properties: dict[str, Any]  # all PROPERTY_FIELDS names, None when absent
    application_properties: dict
    body: Any  # amqp-value: the value; data: list of bytes; amqp-sequence: list of lists
    body_type: str | None  # "value", "data", "sequence", or None without body
    footer: dict


def decode_message(payload: bytes) -> DecodedMessage:
    """Every section of a message, decoded."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        return _decode_message(buf)
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise _guarded("message", exc) from None


def _decode_message(buf: bytes) -> DecodedMessage:
    header = None
    maps = {DELIVERY_ANNOTATIONS: {}, MESSAGE_ANNOTATIONS: {}, APPLICATION_PROPERTIES: {},
            FOOTER: {}}  # fmt: skip
    properties = dict.fromkeys(PROPERTY_FIELDS)
    body, body_type = None, None
    seen = set()
    for code, _, vpos, end in _scan(buf):
        if code in _SINGLETONS:
            if code in seen:
                raise CodecError(f"duplicate message section 0x{code:02x}")
            seen.add(code)
        value, _ = decode_raw(buf, vpos, 1)
        if code == HEADER or code == PROPERTIES:
            if value is None:
                value = []
            if not isinstance(value, list):
                raise CodecError("header and properties sections must be lists")
            names = HEADER_FIELDS if code == HEADER else PROPERTY_FIELDS
            fields = dict(zip(names, value))
            if code == HEADER:
                header = dict.fromkeys(HEADER_FIELDS)
                header.update(fields)
            else:
                properties.update(fields)
        elif code in maps:
            if value is not None and not isinstance(value, dict):
                raise CodecError(f"section 0x{code:02x} must be a map")
            maps[code] = value or {}
        elif code == DATA:
            if not isinstance(value, bytes):
                raise CodecError("a data section must hold binary")
            body = body if body_type == "data" else []
            body.append(value)
            body_type = "data"
        elif code == AMQP_SEQUENCE:
            body = body if body_type == "sequence" else []
            body.append(value)
            body_type = "sequence"
        else:  # AMQP_VALUE
            body, body_type = value, "value"
    return DecodedMessage(
        header=header,
        delivery_annotations=maps[DELIVERY_ANNOTATIONS],
        message_annotations=maps[MESSAGE_ANNOTATIONS],
        properties=properties,
        application_properties=maps[APPLICATION_PROPERTIES],
        body=body,
        body_type=body_type,
        footer=maps[FOOTER],
    )


_ABSENT: Any = object()


def _message_id_value(v: Any) -> Any:
    # message-id/correlation-id are string, uuid, ulong or binary: a plain int means ulong.
    if type(v) is int:
        return ULong(v)
    if type(v) is Symbol:
        return str(v)
    return v


def _timestamp_value(v: Any) -> Any:
    return Timestamp(v) if type(v) is int else v


_PROPERTY_TYPES = {
    "message_id": _message_id_value,
    "user_id": lambda v: v.encode("utf-8") if isinstance(v, str) else v,
    "to": lambda v: str(v),
    "subject": lambda v: str(v),
    "reply_to": lambda v: str(v),
    "correlation_id": _message_id_value,
    "content_type": Symbol,
    "content_encoding": Symbol,
    "absolute_expiry_time": _timestamp_value,
    "creation_time": _timestamp_value,
    "group_id": lambda v: str(v),
    "group_sequence": UInt,
    "reply_to_group_id": lambda v: str(v),
}
_HEADER_TYPES = {
    "durable": bool,
    "priority": UByte,
    "ttl": UInt,
    "first_acquirer": bool,
    "delivery_count": UInt,
}


def encode_message(
    *,
    header: dict[str, Any] | None = None,
    message_annotations: dict | None = None,
    properties: dict[str, Any] | None = None,
    application_properties: dict[str, Any] | None = None,
    value: Any = _ABSENT,
    data: bytes | list[bytes] | None = None,
) -> bytes:
    """Encode a message from its parts (sections in the standard order).

    `properties` and `header` are dicts by PROPERTY_FIELDS / HEADER_FIELDS name; each field
    gets its AMQP type (a plain int message-id/correlation-id becomes a ulong, content-type a
    symbol, times timestamps; a uuid stays a uuid). Annotation keys become symbols,
    application-property keys strings; values keep the types their wrappers give them (e.g.
    `Int(200)`; a plain int is a long). `value` is an amqp-value body (None included);
    `data` one or more data sections."""
    out = bytearray()
    try:
        if header is not None:
            fields = [None] * 5
            for name, v in header.items():
                if name not in _HEADER_TYPES:
                    raise CodecError(f"unknown header field {name!r}")
                if v is not None:
                    fields[HEADER_FIELDS.index(name)] = _HEADER_TYPES[name](v)
            out += b"\x00\x53\x70"
            encode_into(out, fields)
        if message_annotations:
            out += _ANNOTATIONS_OPEN
            encode_into(
                out,
                {Symbol(k) if type(k) is str else k: v for k, v in message_annotations.items()},
            )
        if properties:
            fields = [None] * 13
            for name, v in properties.items():
                if name not in _PROPERTY_TYPES:
                    raise CodecError(f"unknown message property {name!r}")
                if v is not None:
                    fields[PROPERTY_FIELDS.index(name)] = _PROPERTY_TYPES[name](v)
            while fields and fields[-1] is None:
                fields.pop()
            out += b"\x00\x53\x73"
            encode_into(out, fields)
        if application_properties:
            out += _APP_PROPERTIES_OPEN
            encode_into(
                out,
                {str(k) if isinstance(k, str) else k: v for k, v in application_properties.items()},
            )
        if data is not None:
            for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                out += b"\x00\x53\x75"
                encode_into(out, bytes(chunk))
        if value is not _ABSENT:
            out += b"\x00\x53\x77"
            encode_into(out, value)
    except CodecError:
        raise
    except (struct.error, OverflowError, UnicodeError, AttributeError, TypeError, ValueError) as exc:
        raise CodecError(f"cannot encode message: {exc}") from None
    return bytes(out)
