"""The sections of an encoded AMQP 1.0 message: their descriptor codes, and where each one
starts and ends, found without decoding them.

`scan_sections` is the one pass every incoming message goes through (it is on the send path);
the small helpers after it locate the fields of a list or the entries of a map inside a
section, and build the few headers the message modules write themselves.
"""

from __future__ import annotations

import struct

from busd.amqp.decoding import RAW_ERRORS, decode_raw, malformed, skip_raw
from busd.amqp.types import CodecError

__all__ = [
    "HEADER",
    "DELIVERY_ANNOTATIONS",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "APPLICATION_PROPERTIES",
    "DATA",
    "AMQP_SEQUENCE",
    "AMQP_VALUE",
    "FOOTER",
    "split_sections",
]

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

# Section openers (descriptor as a smallulong) that the message modules write themselves.
ANNOTATIONS_OPEN = b"\x00\x53\x72"
APP_PROPERTIES_OPEN = b"\x00\x53\x74"

_u32 = struct.Struct(">I").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_pBI = struct.Struct(">BI").pack
_pBII = struct.Struct(">BII").pack


def scan_sections(buf: bytes) -> list[tuple[int, int, int, int]]:
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

    Any order is accepted (the SDK writes delivery-annotations last, docs/wire.md §5.3)."""
    buf = payload if type(payload) is bytes else bytes(payload)
    try:
        return [(code, start, end) for code, start, _, end in scan_sections(buf)]
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise malformed("message", exc) from None


def list_start(buf: bytes, vpos: int) -> tuple[int, int]:
    """(first element position, element count) of the list at vpos; null counts as empty."""
    c = buf[vpos]
    if c == 0xC0:
        return vpos + 3, buf[vpos + 2]
    if c == 0xD0:
        return vpos + 9, _u32(buf, vpos + 5)[0]
    if c == 0x45 or c == 0x40:
        return vpos + 1, 0
    raise CodecError(f"expected a list, found constructor 0x{c:02x}")


def map_start(buf: bytes, vpos: int) -> tuple[int, int, int]:
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


def symbol_bytes(name: bytes) -> bytes:
    n = len(name)
    return (bytes((0xA3, n)) if n < 256 else _pBI(0xB3, n)) + name


def map_header(count: int, size: int) -> bytes:
    if count < 256 and size < 255:
        return bytes((0xC1, size + 1, count))
    return _pBII(0xD1, size + 4, count)
