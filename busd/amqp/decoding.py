"""AMQP 1.0 value decoding, and skipping a value without decoding it.

Decoding maps AMQP to plain Python where the type is unambiguous: string -> str, binary ->
bytes (a real copy), every integer type -> int, float/double -> float, uuid -> uuid.UUID,
list -> list, map -> dict, null -> None, char -> str. Where the AMQP type matters to a peer it is
kept in a wrapper from busd.amqp.types: symbol -> `Symbol`, timestamp -> `Timestamp`, array ->
`Array`, described -> `Described`, decimal32/64/128 -> `AmqpDecimal`.

Decoders raise raw IndexError/struct.error on truncated input; the public entry points turn
those into `CodecError`, so callers only ever see `CodecError`. `decode_raw`, `skip_raw` and
`RAW_ERRORS` are for the message modules of this package, which convert errors themselves.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

from busd.amqp.types import AmqpDecimal, Array, CodecError, Described, Symbol, Timestamp

__all__ = ["decode_value", "skip_value"]

# Limits against hostile sizes: nesting depth, and element count of zero-width arrays (an
# array of nulls or booleans-as-0x41 costs no bytes per element, so its count is unbounded).
MAX_DEPTH = 64
MAX_ZERO_WIDTH_COUNT = 65536

_u16 = struct.Struct(">H").unpack_from
_i16 = struct.Struct(">h").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_i64 = struct.Struct(">q").unpack_from
_f32 = struct.Struct(">f").unpack_from
_f64 = struct.Struct(">d").unpack_from
_u32u32 = struct.Struct(">II").unpack_from

# Raw exceptions a decoder may raise on bad bytes; public entry points convert them.
RAW_ERRORS = (IndexError, struct.error, ValueError, OverflowError, RecursionError)


def malformed(what: str, exc: BaseException) -> CodecError:
    """The CodecError for one of RAW_ERRORS raised while reading `what`."""
    return CodecError(f"malformed {what}: {exc}")


# ---------------------------------------------------------------------------------------------
# Skipping: the end of a value without decoding it.

# Width after the constructor: >= 0 fixed, -1 one-byte size, -2 four-byte size, -3 described.
_WIDTH = [-9] * 256
for _c in range(0x40, 0x46):
    _WIDTH[_c] = 0
for _c in range(0x50, 0x57):
    _WIDTH[_c] = 1
for _c in (0x60, 0x61):
    _WIDTH[_c] = 2
for _c in range(0x70, 0x75):
    _WIDTH[_c] = 4
for _c in range(0x80, 0x85):
    _WIDTH[_c] = 8
for _c in (0x94, 0x98):
    _WIDTH[_c] = 16
for _c in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0):
    _WIDTH[_c] = -1
for _c in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0):
    _WIDTH[_c] = -2
_WIDTH[0x00] = -3


def skip_raw(buf: bytes, pos: int) -> int:
    """Position just after the value whose constructor is at `pos` (raw errors)."""
    c = buf[pos]
    w = _WIDTH[c]
    if w >= 0:
        end = pos + 1 + w
    elif w == -1:
        end = pos + 2 + buf[pos + 1]
    elif w == -2:
        end = pos + 5 + _u32(buf, pos + 1)[0]
    elif w == -3:
        end = skip_raw(buf, skip_raw(buf, pos + 1))
    else:
        raise CodecError(f"invalid constructor 0x{c:02x} at {pos}")
    if end > len(buf):
        raise CodecError(f"value at {pos} runs past the end of the data")
    return end


def skip_value(buf: bytes, pos: int = 0) -> int:
    try:
        return skip_raw(buf, pos)
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise CodecError(f"malformed AMQP value at {pos}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Decoding. Each function takes the position just after the constructor.


def _d_null(buf, p, depth):
    return None, p


def _d_true(buf, p, depth):
    return True, p


def _d_false(buf, p, depth):
    return False, p


def _d_zero(buf, p, depth):
    return 0, p


def _d_list0(buf, p, depth):
    return [], p


def _d_u8(buf, p, depth):
    return buf[p], p + 1


def _d_i8(buf, p, depth):
    v = buf[p]
    return (v - 256 if v > 127 else v), p + 1


def _d_bool(buf, p, depth):
    v = buf[p]
    if v > 1:
        raise CodecError(f"invalid boolean byte 0x{v:02x}")
    return v == 1, p + 1


def _d_u16(buf, p, depth):
    return _u16(buf, p)[0], p + 2


def _d_i16(buf, p, depth):
    return _i16(buf, p)[0], p + 2


def _d_u32(buf, p, depth):
    return _u32(buf, p)[0], p + 4


def _d_i32(buf, p, depth):
    return _i32(buf, p)[0], p + 4


def _d_f32(buf, p, depth):
    return _f32(buf, p)[0], p + 4


def _d_char(buf, p, depth):
    return chr(_u32(buf, p)[0]), p + 4


def _d_dec32(buf, p, depth):
    return AmqpDecimal(32, _take(buf, p, 4)), p + 4


def _d_u64(buf, p, depth):
    return _u64(buf, p)[0], p + 8


def _d_i64(buf, p, depth):
    return _i64(buf, p)[0], p + 8


def _d_f64(buf, p, depth):
    return _f64(buf, p)[0], p + 8


def _d_timestamp(buf, p, depth):
    return Timestamp(_i64(buf, p)[0]), p + 8


def _d_dec64(buf, p, depth):
    return AmqpDecimal(64, _take(buf, p, 8)), p + 8


def _d_dec128(buf, p, depth):
    return AmqpDecimal(128, _take(buf, p, 16)), p + 16


def _d_uuid(buf, p, depth):
    return uuid.UUID(bytes=_take(buf, p, 16)), p + 16


def _take(buf, p, n):
    e = p + n
    if e > len(buf):
        raise CodecError("value runs past the end of the data")
    return buf[p:e]


def _d_bin8(buf, p, depth):
    e = p + 1 + buf[p]
    if e > len(buf):
        raise CodecError("binary runs past the end of the data")
    return buf[p + 1 : e], e


def _d_bin32(buf, p, depth):
    e = p + 4 + _u32(buf, p)[0]
    if e > len(buf):
        raise CodecError("binary runs past the end of the data")
    return buf[p + 4 : e], e


def _d_str8(buf, p, depth):
    e = p + 1 + buf[p]
    if e > len(buf):
        raise CodecError("string runs past the end of the data")
    return buf[p + 1 : e].decode("utf-8"), e


def _d_str32(buf, p, depth):
    e = p + 4 + _u32(buf, p)[0]
    if e > len(buf):
        raise CodecError("string runs past the end of the data")
    return buf[p + 4 : e].decode("utf-8"), e


def _d_sym8(buf, p, depth):
    e = p + 1 + buf[p]
    if e > len(buf):
        raise CodecError("symbol runs past the end of the data")
    return Symbol(buf[p + 1 : e].decode("utf-8")), e


def _d_sym32(buf, p, depth):
    e = p + 4 + _u32(buf, p)[0]
    if e > len(buf):
        raise CodecError("symbol runs past the end of the data")
    return Symbol(buf[p + 4 : e].decode("utf-8")), e


def _compound_bounds(buf, p, wide):
    """(first element position, element count, end) of a list/map/array body."""
    if wide:
        size, count = _u32u32(buf, p)
        if size < 4:
            raise CodecError("compound size smaller than its count field")
        start, end = p + 8, p + 4 + size
    else:
        size, count = buf[p], buf[p + 1]
        if size < 1:
            raise CodecError("compound size smaller than its count field")
        start, end = p + 2, p + 1 + size
    if end > len(buf):
        raise CodecError("compound value runs past the end of the data")
    return start, count, end


def _d_list(buf, p, depth, wide=False):
    if depth >= MAX_DEPTH:
        raise CodecError("AMQP value nested too deeply")
    p, count, end = _compound_bounds(buf, p, wide)
    if count > end - p:  # every element takes at least its constructor byte
        raise CodecError(f"list count {count} exceeds its size")
    items: list[Any] = []
    append = items.append
    depth += 1
    for _ in range(count):
        f = _DECODERS[buf[p]]
        if f is None:
            raise CodecError(f"invalid constructor 0x{buf[p]:02x} at {p}")
        v, p = f(buf, p + 1, depth)
        append(v)
    if p != end:
        raise CodecError("list elements do not match the list size")
    return items, end


def _d_list32(buf, p, depth):
    return _d_list(buf, p, depth, True)


def _d_map(buf, p, depth, wide=False):
    if depth >= MAX_DEPTH:
        raise CodecError("AMQP value nested too deeply")
    p, count, end = _compound_bounds(buf, p, wide)
    if count & 1:
        raise CodecError(f"map with an odd element count {count}")
    if count > end - p:
        raise CodecError(f"map count {count} exceeds its size")
    result = {}
    depth += 1
    for _ in range(count >> 1):
        f = _DECODERS[buf[p]]
        if f is None:
            raise CodecError(f"invalid constructor 0x{buf[p]:02x} at {p}")
        k, p = f(buf, p + 1, depth)
        f = _DECODERS[buf[p]]
        if f is None:
            raise CodecError(f"invalid constructor 0x{buf[p]:02x} at {p}")
        v, p = f(buf, p + 1, depth)
        try:
            result[k] = v
        except TypeError:  # an unhashable key (a list or map): keep it usable anyway
            try:
                result[_freeze(k)] = v
            except TypeError:
                raise CodecError("unusable map key") from None
    if p != end:
        raise CodecError("map entries do not match the map size")
    return result, end


def _freeze(v):
    if isinstance(v, Described):
        return Described(_freeze(v.descriptor), _freeze(v.value))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple((_freeze(k), _freeze(x)) for k, x in v.items())
    return v


def _d_map32(buf, p, depth):
    return _d_map(buf, p, depth, True)


def _d_array(buf, p, depth, wide=False):
    if depth >= MAX_DEPTH:
        raise CodecError("AMQP value nested too deeply")
    p, count, end = _compound_bounds(buf, p, wide)
    if p == end:
        # An empty array without element constructor: not valid AMQP, but it is what the SDK
        # writes for an empty array.
        if count:
            raise CodecError("array without element constructor")
        return Array("null"), end
    ctor = buf[p]
    p += 1
    descriptor = None
    if ctor == 0x00:
        f = _DECODERS[buf[p]]
        if f is None or buf[p] == 0x00:
            raise CodecError("invalid array descriptor")
        descriptor, p = f(buf, p + 1, depth + 1)
        ctor = buf[p]
        p += 1
    f = _DECODERS[ctor]
    if f is None or ctor == 0x00:
        raise CodecError(f"invalid array element constructor 0x{ctor:02x}")
    limit = MAX_ZERO_WIDTH_COUNT if _WIDTH[ctor] == 0 else end - p
    if count > limit:
        raise CodecError(f"array count {count} exceeds its size")
    items: list[Any] = []
    append = items.append
    depth += 1
    for _ in range(count):
        v, p = f(buf, p, depth)
        append(v)
    if p != end:
        raise CodecError("array elements do not match the array size")
    name = _NAME_BY_CTOR[ctor]
    return Array(name if descriptor is None else Described(descriptor, name), items), end


def _d_array32(buf, p, depth):
    return _d_array(buf, p, depth, True)


def _d_described(buf, p, depth):
    if depth >= MAX_DEPTH:
        raise CodecError("AMQP value nested too deeply")
    depth += 1
    f = _DECODERS[buf[p]]
    if f is None:
        raise CodecError(f"invalid descriptor constructor 0x{buf[p]:02x}")
    descriptor, p = f(buf, p + 1, depth)
    f = _DECODERS[buf[p]]
    if f is None:
        raise CodecError(f"invalid constructor 0x{buf[p]:02x} at {p}")
    value, p = f(buf, p + 1, depth)
    return Described(descriptor, value), p


_DECODERS: list[Callable | None] = [None] * 256
for _c, _f in {
    0x00: _d_described,
    0x40: _d_null,
    0x41: _d_true,
    0x42: _d_false,
    0x43: _d_zero,
    0x44: _d_zero,
    0x45: _d_list0,
    0x50: _d_u8,
    0x51: _d_i8,
    0x52: _d_u8,
    0x53: _d_u8,
    0x54: _d_i8,
    0x55: _d_i8,
    0x56: _d_bool,
    0x60: _d_u16,
    0x61: _d_i16,
    0x70: _d_u32,
    0x71: _d_i32,
    0x72: _d_f32,
    0x73: _d_char,
    0x74: _d_dec32,
    0x80: _d_u64,
    0x81: _d_i64,
    0x82: _d_f64,
    0x83: _d_timestamp,
    0x84: _d_dec64,
    0x94: _d_dec128,
    0x98: _d_uuid,
    0xA0: _d_bin8,
    0xA1: _d_str8,
    0xA3: _d_sym8,
    0xB0: _d_bin32,
    0xB1: _d_str32,
    0xB3: _d_sym32,
    0xC0: _d_list,
    0xC1: _d_map,
    0xD0: _d_list32,
    0xD1: _d_map32,
    0xE0: _d_array,
    0xF0: _d_array32,
}.items():
    _DECODERS[_c] = _f

_NAME_BY_CTOR = {
    0x40: "null",
    0x41: "boolean",
    0x42: "boolean",
    0x56: "boolean",
    0x43: "uint",
    0x52: "uint",
    0x70: "uint",
    0x44: "ulong",
    0x53: "ulong",
    0x80: "ulong",
    0x50: "ubyte",
    0x60: "ushort",
    0x51: "byte",
    0x61: "short",
    0x54: "int",
    0x71: "int",
    0x55: "long",
    0x81: "long",
    0x72: "float",
    0x82: "double",
    0x73: "char",
    0x74: "decimal32",
    0x84: "decimal64",
    0x94: "decimal128",
    0x83: "timestamp",
    0x98: "uuid",
    0xA0: "binary",
    0xB0: "binary",
    0xA1: "string",
    0xB1: "string",
    0xA3: "symbol",
    0xB3: "symbol",
    0x45: "list",
    0xC0: "list",
    0xD0: "list",
    0xC1: "map",
    0xD1: "map",
    0xE0: "array",
    0xF0: "array",
}


def decode_raw(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
    """decode_value without error conversion, for callers that convert errors themselves."""
    f = _DECODERS[buf[pos]]
    if f is None:
        raise CodecError(f"invalid constructor 0x{buf[pos]:02x} at {pos}")
    return f(buf, pos + 1, depth)


def decode_value(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode the AMQP value at `pos`; return it and the position just after it."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    try:
        return decode_raw(buf, pos)
    except CodecError:
        raise
    except RAW_ERRORS as exc:
        raise CodecError(f"malformed AMQP value at {pos}: {exc}") from None
