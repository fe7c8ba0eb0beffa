"""Stored messages as delivered to a receiver, and the application-property changes a
delivery merges in (dead-lettering, `modified` outcomes, $management updates); and a stored
message rewritten with such changes (a rule action's copy on a subscription).

Delivering a message is a few byte joins: a fresh header with the delivery-count, the lock token
in front of the sender's delivery-annotations, the broker's message-annotations in front of the
sender's, then the bare bytes of the blob built by busd.amqp.incoming (docs/wire.md §6.3). A
delivery that patches application-properties re-reads that one map only, decoding its keys and
copying its values as they are.
"""

from __future__ import annotations

import struct
from typing import Any

from busd.amqp.decoding import (
    RAW_ERRORS,
    decode_raw,
    decode_value,
    malformed,
    skip_raw,
    skip_value,
)
from busd.amqp.encoding import encode_into, encode_value
from busd.amqp.incoming import (
    BLOB_HEAD,
    BLOB_VERSION,
    DA_HEAD,
    HAS_APP_PROPERTIES,
    HAS_DELIVERY_ANNOTATIONS,
)
from busd.amqp.messages import PROPERTY_FIELDS, encode_message
from busd.amqp.sections import (
    ANNOTATIONS_OPEN,
    APP_PROPERTIES_OPEN,
    PROPERTIES,
    map_header,
    map_start,
    scan_sections,
    symbol_bytes,
)
from busd.amqp.types import CodecError

__all__ = [
    "encode_delivery",
    "encode_properties_patch",
    "decode_properties_patch",
    "rewrite_blob",
]

_pq = struct.Struct(">q").pack
_pBI = struct.Struct(">BI").pack
# Bound here once: calling a method of an imported name (BLOB_HEAD.unpack_from(...)) compiles
# to a plain attribute load that builds a bound method on every delivery.
_unpack_blob_head = BLOB_HEAD.unpack_from
_BLOB_HEAD_SIZE = BLOB_HEAD.size

_unpack_da_head = DA_HEAD.unpack_from
_DA_HEAD_SIZE = DA_HEAD.size

_HEADER_OPEN = b"\x00\x53\x70\xc0"
_DELIVERY_ANNOTATIONS_OPEN = b"\x00\x53\x71"
_K_LOCK_TOKEN = symbol_bytes(b"x-opt-lock-token") + b"\x98"  # uuid
_K_SEQ = symbol_bytes(b"x-opt-sequence-number") + b"\x81"  # long
_K_ENQ = symbol_bytes(b"x-opt-enqueued-time") + b"\x83"  # timestamp
_K_LOCKED = symbol_bytes(b"x-opt-locked-until") + b"\x83"  # timestamp
_K_STATE = symbol_bytes(b"x-opt-message-state") + b"\x71"  # int
_K_ENQ_SEQ = symbol_bytes(b"x-opt-enqueue-sequence-number") + b"\x81"  # long
_K_DL_SOURCE = symbol_bytes(b"x-opt-deadletter-source")
# delivery-annotations holding the lock token alone, up to the token's 16 bytes
_LOCK_ONLY = _DELIVERY_ANNOTATIONS_OPEN + map_header(2, len(_K_LOCK_TOKEN) + 16) + _K_LOCK_TOKEN
# delivery-annotations with neither: Service Bus still sends the (empty) section, and the SDKs
# read it as {} where a message without the section reads None
_EMPTY_DELIVERY_ANNOTATIONS = _DELIVERY_ANNOTATIONS_OPEN + map_header(0, 0)
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
    lock_token: bytes | None = None,
    message_state: int | None = None,
    dead_letter_reason: str | None = None,
    dead_letter_description: str | None = None,
    properties_patch: bytes | dict | None = None,
    enqueue_seq: int | None = None,
    dead_letter_source: str | None = None,
) -> bytes:
    """The payload of a stored message as delivered to a receiver (docs/wire.md §6.3).

    Header: all five fields, the sender's durable/priority/ttl and an explicit delivery-count.
    Delivery-annotations: x-opt-lock-token (uuid, the 16 bytes of `lock_token`) when given,
    then the sender's; an empty map when there is neither. Message-annotations:
    x-opt-sequence-number (long), x-opt-enqueued-time (timestamp), x-opt-locked-until
    (timestamp) and x-opt-message-state (int) when given, for a forwarded message
    x-opt-enqueue-sequence-number (long) and x-opt-deadletter-source (string) when given, then
    the sender's.
    Then the bare message as sent, except that dead-letter reason/description and a
    properties patch (from encode_properties_patch) are merged into application-properties."""
    try:
        _, flags, header_len, ann_pairs, ann_len, ap_start, ap_end = _unpack_blob_head(blob)
    except (struct.error, TypeError):
        raise CodecError("not a stored message") from None
    p = _BLOB_HEAD_SIZE
    if lock_token is None:
        token = b""
    elif len(lock_token) != 16:
        raise CodecError("a lock token is 16 bytes")
    else:
        token = lock_token
    if flags & HAS_DELIVERY_ANNOTATIONS:
        try:
            da_pairs, da_len = _unpack_da_head(blob, p)
        except struct.error:
            raise CodecError("not a stored message") from None
        p += _DA_HEAD_SIZE
        da = blob[p : p + da_len]
        p += da_len
        if token:
            da = _K_LOCK_TOKEN + token + da
            da_pairs += 1
            token = b""
        delivery_ann = _DELIVERY_ANNOTATIONS_OPEN + map_header(2 * da_pairs, len(da)) + da
    elif token:
        delivery_ann = _LOCK_ONLY
    else:
        delivery_ann = _EMPTY_DELIVERY_ANNOTATIONS
    header_fields = blob[p : p + header_len]
    p += header_len
    bare_start = p + ann_len
    if bare_start > len(blob) or blob[0] != BLOB_VERSION:
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
        if enqueue_seq is not None:
            broker += _K_ENQ_SEQ + _pq(enqueue_seq)
            pairs += 1
        if dead_letter_source is not None:
            broker += _K_DL_SOURCE + encode_value(dead_letter_source)
            pairs += 1
    except struct.error as exc:
        raise CodecError(f"delivery field out of range: {exc}") from None

    if dead_letter_reason is None and dead_letter_description is None and not properties_patch:
        bare = blob[bare_start:]
    else:
        bare = _patch_application_properties(
            blob[bare_start:],
            flags & HAS_APP_PROPERTIES,
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
            delivery_ann,
            token,
            ANNOTATIONS_OPEN,
            map_header(2 * pairs, len(broker) + ann_len),
            broker,
            blob[p:bare_start],
            bare,
        )
    )


def _patch_application_properties(
    bare, present, ap_start, ap_end, patch, reason, description, remove=frozenset()
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
            ((_, _, vpos, _),) = scan_sections(section)
            p, count, end = map_start(section, vpos)
            for _ in range(count >> 1):
                key, ke = decode_raw(section, p, 1)
                ve = skip_raw(section, ke)
                raw = section[p:ve]
                p = ve
                if isinstance(key, str) and key in updates:
                    raw = updates.pop(key)
                elif remove and key in remove:
                    continue
                entries.append(raw)
        except CodecError:
            raise
        except RAW_ERRORS as exc:
            raise malformed("stored application-properties", exc) from None
    entries.extend(updates.values())
    body = b"".join(entries)
    section = APP_PROPERTIES_OPEN + map_header(2 * len(entries), len(body)) + body
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
        raise malformed("properties patch", exc) from None
    return entries


def decode_properties_patch(patch: bytes) -> dict[str, Any]:
    """The changes held by a patch from encode_properties_patch (later keys win)."""
    buf = patch if type(patch) is bytes else bytes(patch)
    return {k: decode_value(raw, skip_value(raw))[0] for k, raw in _patch_entries(buf).items()}


_KEEP: Any = object()


def rewrite_blob(
    blob: bytes,
    *,
    properties_patch: bytes | dict | None = None,
    remove: frozenset[str] | set[str] = frozenset(),
    properties: dict[str, Any] | None = None,
    ttl_ms: Any = _KEEP,
) -> bytes:
    """A stored message with changes made to its bare message, as a new blob.

    `properties_patch` sets application-properties (the form of encode_properties_patch, or a
    dict) and `remove` deletes them (keys match exactly); `properties` replaces message
    properties by PROPERTY_FIELDS name (None clears one); `ttl_ms` replaces header.ttl
    (None clears it). The rest is kept byte for byte."""
    try:
        _, flags, header_len, ann_pairs, ann_len, ap_start, ap_end = _unpack_blob_head(blob)
    except (struct.error, TypeError):
        raise CodecError("not a stored message") from None
    p = _BLOB_HEAD_SIZE
    delivery_ann = b""  # kept as stored, with its DA_HEAD
    if flags & HAS_DELIVERY_ANNOTATIONS:
        try:
            da_len = _unpack_da_head(blob, p)[1]
        except struct.error:
            raise CodecError("not a stored message") from None
        delivery_ann = blob[p : p + _DA_HEAD_SIZE + da_len]
        p += len(delivery_ann)
    bare_start = p + header_len + ann_len
    if bare_start > len(blob) or blob[0] != BLOB_VERSION:
        raise CodecError("not a stored message")
    header_fields = blob[p : p + header_len]
    annotations = blob[p + header_len : bare_start]
    bare = blob[bare_start:]
    try:
        if ttl_ms is not _KEEP:
            fields, q = [], p
            while q < p + header_len:
                v, q = decode_raw(blob, q, 1)
                fields.append(v)
            durable, priority = (fields + [None, None])[:2]
            header_fields = (
                (b"\x40" if durable is None else b"\x41" if durable else b"\x42")
                + (b"\x40" if priority is None else bytes((0x50, priority)))
                + (b"\x40" if ttl_ms is None else _pBI(0x70, ttl_ms))
                + b"\x40"
            )
        if properties:
            start = end = 0  # no properties section: it goes first
            current: dict[str, Any] = {}
            for code, s_start, vpos, s_end in scan_sections(bare):
                if code == PROPERTIES:
                    values = decode_raw(bare, vpos, 1)[0] or []
                    current = dict(zip(PROPERTY_FIELDS, values))
                    start, end = s_start, s_end
                    break
            for name in properties:
                if name not in PROPERTY_FIELDS:
                    raise CodecError(f"unknown message property {name!r}")
            current.update(properties)
            section = encode_message(properties=current) or b"\x00\x53\x73\x45"
            bare = b"".join((bare[:start], section, bare[end:]))
            if ap_start >= end:
                delta = len(section) - (end - start)
                ap_start += delta
                ap_end += delta
        if properties_patch or remove:
            before = len(bare)
            bare = _patch_application_properties(
                bare,
                flags & HAS_APP_PROPERTIES,
                ap_start,
                ap_end,
                properties_patch,
                None,
                None,
                frozenset(remove),
            )
            ap_end += len(bare) - before
            flags |= HAS_APP_PROPERTIES
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise malformed("stored message", exc) from None
    head = BLOB_HEAD.pack(
        BLOB_VERSION, flags, len(header_fields), ann_pairs, len(annotations), ap_start, ap_end
    )
    return b"".join((head, delivery_ann, header_fields, annotations, bare))
