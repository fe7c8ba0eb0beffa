"""Messages a client sends: what the broker reads from them, and their stored form (the
"blob"), built in one pass over the sender's bytes.

The broker reads little of a message: header (ttl), two message-annotations (scheduled time,
partition key) and three properties (message-id, group-id, reply-to-group-id). Everything else
travels as the bytes the sender wrote. A blob is

    head (struct BLOB_HEAD) | [delivery annotations] | header fields | sender's annotation entries
    | bare message

where the delivery annotations (only when the HAS_DELIVERY_ANNOTATIONS flag is set) are the
sender's delivery-annotations map body, broker-owned keys removed, after its pair count and byte
length (struct DA_HEAD), the header fields are the encoded durable/priority/ttl/first-acquirer
(delivery-count is appended per delivery), the annotation entries are the sender's
message-annotations map body with the broker-owned keys removed and every key a symbol, and the
bare message is the
properties, application-properties, body and footer sections exactly as sent (except decimal
application properties, put in the form the SDKs read: busd.amqp.decimals). The head also
records where application-properties sit in the bare message (or where they would go), so a
delivery that must patch them (dead-lettering, modified outcomes) need not search for them.
busd.amqp.delivery reads blobs back.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from busd.amqp import decimals
from busd.amqp.batches import batch_parts
from busd.amqp.decoding import RAW_ERRORS, decode_raw, malformed, skip_raw
from busd.amqp.sections import (
    APP_PROPERTIES_OPEN,
    APPLICATION_PROPERTIES,
    DATA,
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    list_start,
    map_header,
    map_start,
    scan_sections,
    symbol_bytes,
)
from busd.amqp.types import CodecError, Timestamp

__all__ = ["IncomingMessage", "parse_incoming", "parse_transfer"]

# Annotations the broker owns: whatever a sender puts there is dropped (docs/wire.md §5.3: a
# re-sent received message carries them back, some re-encoded with other types).
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
# Delivery annotations are per hop: the sender's are passed on, except the key the broker
# itself sets on each delivery (docs/wire.md §6.3).
_BROKER_OWNED_DELIVERY = frozenset((b"x-opt-lock-token",))
_K_SCHEDULED = b"x-opt-scheduled-enqueue-time"
_K_PARTITION = b"x-opt-partition-key"

# version, flags, header-field bytes, annotation pairs, annotation bytes,
# application-properties start and end within the bare message.
BLOB_HEAD = struct.Struct(">BBBIIII")
BLOB_VERSION = 1
HAS_APP_PROPERTIES = 0x01
HAS_DELIVERY_ANNOTATIONS = 0x02
DA_HEAD = struct.Struct(">II")  # delivery-annotation pairs, bytes

_u32 = struct.Struct(">I").unpack_from
_pI = struct.Struct(">I").pack
_pBI = struct.Struct(">BI").pack


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
        self,
        message_id,
        session_id,
        reply_to_session_id,
        partition_key,
        scheduled_ms,
        ttl_ms,
        durable,
        priority,
        blob,
        size,
    ) -> None:
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

    A message without body is valid."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        return _parse_incoming(buf, scan_sections(buf))
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise malformed("message", exc) from None


def parse_transfer(payload: bytes) -> list[IncomingMessage]:
    """`parse_incoming` of each message a transfer carries: the inner messages of a batch
    envelope (see unpack_batch), else the payload itself. Scans the payload once."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        sections = scan_sections(buf)
        parts = batch_parts(buf, sections)
        if parts is None:
            return [_parse_incoming(buf, sections)]
        return [_parse_incoming(part, part_sections) for part, part_sections in parts]
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise malformed("message", exc) from None


# Bit of each section that may appear once (indexed by code - HEADER); data and
# amqp-sequence sections may repeat.
_ONCE_BIT = (1, 2, 4, 8, 16, 0, 0, 128, 256)


def _parse_incoming(buf: bytes, sections: list) -> IncomingMessage:
    seen = 0
    durable = priority = ttl = None
    message_id = session_id = reply_session = None
    partition_key = scheduled = None
    ann, ann_pairs = b"", 0
    delivery_ann = None
    new_app_properties = None  # the section re-encoded (decimals), when it had to be
    ap_section_len = 0  # its length as sent
    # The bare message (sections from properties on, in wire order), its length so far, and
    # where application-properties are in it (or would be inserted: after properties).
    bare_parts: list[tuple[int, int]] = []  # (start, end) in the payload
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
                if not flags & HAS_APP_PROPERTIES:
                    ap_start = ap_end = bare_len + size
            elif code == APPLICATION_PROPERTIES:
                new_app_properties = _check_application_properties(buf, vpos, end)
                if new_app_properties is not None:
                    contiguous = False
                    ap_section_len = size
                    size = len(new_app_properties)
                flags |= HAS_APP_PROPERTIES
                ap_start, ap_end = bare_len, bare_len + size
            elif code == DATA and buf[vpos] != 0xA0 and buf[vpos] != 0xB0:
                raise CodecError("a data section must hold binary")
            bare_len += size
        elif code == HEADER:
            durable, priority, ttl = _read_header(buf, vpos, end)
        elif code == MESSAGE_ANNOTATIONS:
            ann, ann_pairs, scheduled, partition_key = _read_annotations(buf, vpos, end)
        elif code == DELIVERY_ANNOTATIONS:
            entries, pairs, _, _ = _read_annotations(buf, vpos, end, _BROKER_OWNED_DELIVERY)
            if pairs:
                flags |= HAS_DELIVERY_ANNOTATIONS
                delivery_ann = DA_HEAD.pack(pairs, len(entries)) + entries

    if not bare_parts:
        bare = b""
    elif contiguous:
        bare = buf[bare_parts[0][0] : bare_parts[-1][1]]
    else:
        bare = b"".join([buf[start:end] for start, end in bare_parts])
        if new_app_properties is not None:  # the section's bytes as re-encoded
            bare = bare[:ap_start] + new_app_properties + bare[ap_start + ap_section_len :]

    if durable is None and priority is None:
        header_fields = _NULL_HEADER if ttl is None else _TTL_ONLY_HEADER % _pI(ttl)
    else:
        header_fields = (
            (b"\x40" if durable is None else b"\x41" if durable else b"\x42")
            + (b"\x40" if priority is None else bytes((0x50, priority)))
            + (b"\x40" if ttl is None else _pBI(0x70, ttl))
            + b"\x40"  # first-acquirer: not carried over
        )
    head = BLOB_HEAD.pack(
        BLOB_VERSION, flags, len(header_fields), ann_pairs, len(ann), ap_start, ap_end
    )
    if delivery_ann is not None:
        head += delivery_ann
    return IncomingMessage(
        message_id,
        session_id,
        reply_session,
        partition_key,
        scheduled,
        ttl,
        durable,
        priority,
        b"".join((head, header_fields, ann, bare)),
        len(buf),
    )


_NULL_HEADER = b"\x40\x40\x40\x40"
_TTL_ONLY_HEADER = b"\x40\x40\x70%b\x40"


def _read_header(buf: bytes, vpos: int, end: int):
    p, count = list_start(buf, vpos)
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
    p, count = list_start(buf, vpos)
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


def _check_application_properties(buf: bytes, vpos: int, end: int) -> bytes | None:
    """Check the map's shape (string keys, entries within bounds) now, so that patching it at
    delivery time (dead-lettering) cannot fail on a message already stored. Returns the section
    re-encoded when a decimal value is not in the form the SDKs read (busd.amqp.decimals),
    else None: the section is stored as sent."""
    p, count, map_end = map_start(buf, vpos)
    if map_end > end:
        raise CodecError("application-properties run past their section")
    first = p
    changed: list[tuple[int, int, bytes]] | None = None  # (value start, end, new bytes)
    for _ in range(count >> 1):
        kc = buf[p]
        if kc != 0xA1 and kc != 0xB1 and kc != 0xA3 and kc != 0xB3:
            raise CodecError("application-property keys must be strings")
        v = skip_raw(buf, p)
        p = skip_raw(buf, v)
        vc = buf[v]
        if (vc == 0x94 or vc == 0x84 or vc == 0x74) and p <= map_end:
            new = decimals.canonical(vc, buf[v + 1 : p])
            if new is not None:
                changed = changed or []
                changed.append((v, p, new))
    if p != map_end:
        raise CodecError("application-properties do not match their map size")
    if changed is None:
        return None
    parts: list[bytes] = []
    at = first
    for start, stop, new in changed:
        parts += (buf[at:start], new)
        at = stop
    parts.append(buf[at:map_end])
    body = b"".join(parts)
    return APP_PROPERTIES_OPEN + map_header(count, len(body)) + body


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
    """A string field's text. Binary holding UTF-8 is read as that text, as Service Bus does:
    the SDK copies a received message's partition key as binary when it is sent again."""
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise CodecError(f"{field} must be a string or UTF-8 binary") from None
    raise CodecError(f"{field} must be a string")


def _read_annotations(buf: bytes, vpos: int, end: int, owned=_BROKER_OWNED):
    """(kept entries, kept pair count, scheduled ms, partition key) of message-annotations, or
    of delivery-annotations with `owned` their broker-owned keys."""
    p, count, map_end = map_start(buf, vpos)
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
            if name in owned:
                pristine = False
                p = ve
                continue
            if owned is _BROKER_OWNED_DELIVERY:
                pass  # scheduled time and partition key are message annotations only
            elif name == _K_SCHEDULED:
                v = decode_raw(buf, ke, 1)[0]
                if v is not None:
                    if type(v) is not Timestamp and type(v) is not int:
                        raise CodecError("x-opt-scheduled-enqueue-time must be a timestamp")
                    scheduled = int(v)
            elif name == _K_PARTITION:
                partition_key = decode_raw(buf, ke, 1)[0]
                if partition_key is not None:
                    partition_key = _text(partition_key, "x-opt-partition-key")
            if kc != 0xA3:  # annotation keys go out as symbols (docs/wire.md §6.3)
                pristine = False
                kept.append(symbol_bytes(name) + buf[ke:ve])
                p = ve
                continue
        kept.append(buf[p:ve])
        p = ve
    if p != map_end:
        raise CodecError("message-annotations do not match their map size")
    ann = buf[first:p] if pristine else b"".join(kept)
    return ann, len(kept), scheduled, partition_key
