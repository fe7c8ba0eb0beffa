"""Whole messages, decoded and encoded section by section, for request/response traffic
($cbs, $management): small and not hot.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from busd.amqp.decoding import RAW_ERRORS, decode_raw, malformed
from busd.amqp.encoding import encode_into
from busd.amqp.sections import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    ANNOTATIONS_OPEN,
    APP_PROPERTIES_OPEN,
    APPLICATION_PROPERTIES,
    DATA,
    DELIVERY_ANNOTATIONS,
    FOOTER,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    scan_sections,
)
from busd.amqp.types import CodecError, Symbol, Timestamp, UByte, UInt, ULong

__all__ = [
    "HEADER_FIELDS",
    "PROPERTY_FIELDS",
    "DecodedMessage",
    "decode_message",
    "encode_message",
]

HEADER_FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")
PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)

# Sections that may appear once in a message; data and amqp-sequence sections may repeat.
_SINGLETONS = (
    HEADER,
    DELIVERY_ANNOTATIONS,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    APPLICATION_PROPERTIES,
    AMQP_VALUE,
    FOOTER,
)


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
        raise malformed("message", exc) from None


def _decode_message(buf: bytes) -> DecodedMessage:
    header = None
    maps: dict[int, dict] = {
        DELIVERY_ANNOTATIONS: {},
        MESSAGE_ANNOTATIONS: {},
        APPLICATION_PROPERTIES: {},
        FOOTER: {},
    }
    properties = dict.fromkeys(PROPERTY_FIELDS)
    body: Any = None
    body_type: str | None = None
    seen = set()
    for code, _, vpos, _end in scan_sections(buf):
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


_PROPERTY_TYPES: dict[str, Callable[[Any], Any]] = {
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
_HEADER_TYPES: dict[str, Callable[[Any], Any]] = {
    "durable": bool,
    "priority": UByte,
    "ttl": UInt,
    "first_acquirer": bool,
    "delivery_count": UInt,
}


def _fields(
    given: dict[str, Any], names: tuple[str, ...], types: dict[str, Callable[[Any], Any]], what: str
) -> list[Any]:
    """A section's fields in `names` order, from `given` by name, each made its AMQP type."""
    fields: list[Any] = [None] * len(names)
    for name, v in given.items():
        if name not in types:
            raise CodecError(f"unknown {what} {name!r}")
        if v is not None:
            fields[names.index(name)] = types[name](v)
    return fields


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
            out += b"\x00\x53\x70"
            encode_into(out, _fields(header, HEADER_FIELDS, _HEADER_TYPES, "header field"))
        if message_annotations:
            out += ANNOTATIONS_OPEN
            encode_into(
                out,
                {Symbol(k) if type(k) is str else k: v for k, v in message_annotations.items()},
            )
        if properties:
            fields = _fields(properties, PROPERTY_FIELDS, _PROPERTY_TYPES, "message property")
            while fields and fields[-1] is None:
                fields.pop()
            out += b"\x00\x53\x73"
            encode_into(out, fields)
        if application_properties:
            out += APP_PROPERTIES_OPEN
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
    except (
        struct.error,
        OverflowError,
        UnicodeError,
        AttributeError,
        TypeError,
        ValueError,
    ) as exc:
        raise CodecError(f"cannot encode message: {exc}") from None
    return bytes(out)
