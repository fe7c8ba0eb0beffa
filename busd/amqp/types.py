"""AMQP 1.0 values: the Python types that stand for precise AMQP types, and the value codec.

Decoding maps AMQP to plain Python where the type is unambiguous: string -> str, binary ->
bytes (a real copy), every integer type -> int, float/double -> float, uuid -> uuid.UUID,
list -> list, map -> dict, null -> None, char -> str. Where the AMQP type matters to a peer it is
kept in a small wrapper: `Symbol` (str), `Timestamp` (int, ms since the epoch), `Array` (a list
that remembers its element type), `Described(descriptor, value)`, `AmqpDecimal` (kept as raw
bytes; busd never does arithmetic on them).

Encoding is the reverse, with wrappers choosing the precise type: `UByte`, `UShort`, `UInt`,
`ULong`, `Byte`, `Short`, `Int`, `Long`, `Float`, `Timestamp`, `Symbol`, `Array`, `Described`.
A plain int becomes a `long`, a str a `string`, bytes a `binary`, float a `double`, dict a
`map`, list a `list`. char, decimal32 and decimal64 are never emitted: the SDK's decoder has no
entry for them (spec §1.6).

Decoders raise raw IndexError/struct.error on truncated input; the public entry points turn
those into `CodecError`, so callers only ever see `CodecError`.
"""

from __future__ import annotations

import struct
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, NamedTuple

__all__ = [
    "CodecError",
    "Symbol",
    "UByte",
    "UShort",
    "UInt",
    "ULong",
    "Byte",
    "Short",
    "Int",
    "Long",
    "Float",
    "Timestamp",
    "Array",
    "Described",
    "AmqpDecimal",
    "decode_value",
    "encode_value",
    "skip_value",
]


class CodecError(ValueError):
    """Bytes that are not valid AMQP, or a value that cannot be encoded."""


class Symbol(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class _TypedInt(int):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int.__repr__(self)})"


class UByte(_TypedInt):
    __slots__ = ()


class UShort(_TypedInt):
    __slots__ = ()


class UInt(_TypedInt):
    __slots__ = ()


class ULong(_TypedInt):
    __slots__ = ()


class Byte(_TypedInt):
    __slots__ = ()


class Short(_TypedInt):
    __slots__ = ()


class Int(_TypedInt):
    __slots__ = ()


class Long(_TypedInt):
    __slots__ = ()


class Timestamp(_TypedInt):
    """Milliseconds since the Unix epoch (AMQP timestamps are signed 64-bit ms)."""

    __slots__ = ()

    @classmethod
    def from_datetime(cls, dt: datetime) -> "Timestamp":
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return cls((dt - _EPOCH) // _ONE_MS)


class Float(float):
    """A 32-bit AMQP float (a plain Python float is encoded as a double)."""

    __slots__ = ()


class Described(NamedTuple):
    """A described value. Descriptors are ints (ulong codes) or Symbols."""

    descriptor: Any
    value: Any


class AmqpDecimal(NamedTuple):
    """decimal32/64/128 kept as their raw big-endian bytes (width in bits: 32, 64 or 128)."""

    width: int
    raw: bytes


# Element type names of arrays, and the Python types that stand for them.
_TYPE_NAMES = frozenset(
    "null boolean ubyte ushort uint ulong byte short int long float double decimal128 char "
    "timestamp uuid binary string symbol list map array".split()
)
_TYPE_BY_CLASS: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    UByte: "ubyte",
    UShort: "ushort",
    UInt: "uint",
    ULong: "ulong",
    Byte: "byte",
    Short: "short",
    Int: "int",
    Long: "long",
    int: "long",
    Float: "float",
    float: "double",
    Timestamp: "timestamp",
    uuid.UUID: "uuid",
    bytes: "binary",
    str: "string",
    Symbol: "symbol",
    list: "list",
    dict: "map",
}


class Array(list):
    """An AMQP array: a list whose elements share one type.

    `element_type` is a type name ("uuid", "long", "timestamp", "string", "symbol", "uint", ...),
    or a wrapper class standing for one (`uuid.UUID`, `Long`, `Timestamp`, `str`, ...), or, for
    an array of described values, `Described(descriptor, element type name)`.
    """

    __slots__ = ("element_type",)

    def __init__(self, element_type: Any, items: Any = ()) -> None:
        super().__init__(items)
        self.element_type = _array_type_name(element_type)

    def __repr__(self) -> str:
        return f"Array({self.element_type!r}, {list.__repr__(self)})"


def _array_type_name(element_type: Any) -> Any:
    if isinstance(element_type, Described):
        return Described(element_type.descriptor, _array_type_name(element_type.value))
    if isinstance(element_type, type):
        if element_type is Array:
            return "array"
        try:
            return _TYPE_BY_CLASS[element_type]
        except KeyError:
            raise CodecError(f"no AMQP array element type for {element_type!r}") from None
    if element_type in _TYPE_NAMES:
        return element_type
    raise CodecError(f"unknown AMQP array element type {element_type!r}")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)

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
    items = []
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
    items = []
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
    0x40: "null", 0x41: "boolean", 0x42: "boolean", 0x56: "boolean",
    0x43: "uint", 0x52: "uint", 0x70: "uint", 0x44: "ulong", 0x53: "ulong", 0x80: "ulong",
    0x50: "ubyte", 0x60: "ushort", 0x51: "byte", 0x61: "short", 0x54: "int", 0x71: "int",
    0x55: "long", 0x81: "long", 0x72: "float", 0x82: "double", 0x73: "char",
    0x74: "decimal32", 0x84: "decimal64", 0x94: "decimal128", 0x83: "timestamp", 0x98: "uuid",
    0xA0: "binary", 0xB0: "binary", 0xA1: "string", 0xB1: "string", 0xA3: "symbol",
    0xB3: "symbol", 0x45: "list", 0xC0: "list", 0xD0: "list", 0xC1: "map", 0xD1: "map",
    0xE0: "array", 0xF0: "array",
}  # fmt: skip


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


# ---------------------------------------------------------------------------------------------
# Encoding into a bytearray.

_pBB = struct.Struct(">BB").pack
_pBb = struct.Struct(">Bb").pack
_pBH = struct.Struct(">BH").pack
_pBh = struct.Struct(">Bh").pack
_pBI = struct.Struct(">BI").pack
_pBi = struct.Struct(">Bi").pack
_pBQ = struct.Struct(">BQ").pack
_pBq = struct.Struct(">Bq").pack
_pBf = struct.Struct(">Bf").pack
_pBd = struct.Struct(">Bd").pack
_pBII = struct.Struct(">BII").pack
_pBBB = struct.Struct(">BBB").pack


def _e_null(out, v):
    out.append(0x40)


def _e_bool(out, v):
    out.append(0x41 if v else 0x42)


def _e_ubyte(out, v):
    out += _pBB(0x50, v)


def _e_ushort(out, v):
    out += _pBH(0x60, v)


def _e_uint(out, v):
    if v == 0:
        out.append(0x43)
    elif 0 < v < 256:
        out += _pBB(0x52, v)
    else:
        out += _pBI(0x70, v)


def _e_ulong(out, v):
    if v == 0:
        out.append(0x44)
    elif 0 < v < 256:
        out += _pBB(0x53, v)
    else:
        out += _pBQ(0x80, v)


def _e_byte(out, v):
    out += _pBb(0x51, v)


def _e_short(out, v):
    out += _pBh(0x61, v)


def _e_int(out, v):
    if -128 <= v <= 127:
        out += _pBb(0x54, v)
    else:
        out += _pBi(0x71, v)


def _e_long(out, v):
    if -128 <= v <= 127:
        out += _pBb(0x55, v)
    else:
        out += _pBq(0x81, v)


def _e_float(out, v):
    out += _pBf(0x72, v)


def _e_double(out, v):
    out += _pBd(0x82, v)


def _e_timestamp(out, v):
    out += _pBq(0x83, v)


def _e_datetime(out, v):
    out += _pBq(0x83, Timestamp.from_datetime(v))


def _e_uuid(out, v):
    out.append(0x98)
    out += v.bytes


def _e_variable(out, data, small, large):
    n = len(data)
    if n < 256:
        out += _pBB(small, n)
    else:
        out += _pBI(large, n)
    out += data


def _e_binary(out, v):
    _e_variable(out, v, 0xA0, 0xB0)


def _e_string(out, v):
    _e_variable(out, v.encode("utf-8"), 0xA1, 0xB1)


def _e_symbol(out, v):
    _e_variable(out, v.encode("utf-8"), 0xA3, 0xB3)


def _e_list(out, v):
    if not v:
        out.append(0x45)
        return
    body = bytearray()
    for item in v:
        encode_into(body, item)
    _compound_header(out, 0xC0, 0xD0, len(v), len(body))
    out += body


def _e_map(out, v):
    body = bytearray()
    for key, item in v.items():
        encode_into(body, key)
        encode_into(body, item)
    _compound_header(out, 0xC1, 0xD1, 2 * len(v), len(body))
    out += body


def _compound_header(out, small, large, count, size):
    if count < 256 and size < 255:
        out += _pBBB(small, size + 1, count)
    else:
        out += _pBII(large, size + 4, count)


def _e_described(out, v):
    out.append(0x00)
    d = v.descriptor
    if isinstance(d, str):
        _e_symbol(out, d)
    elif isinstance(d, int) and not isinstance(d, bool):
        _e_ulong(out, d)
    else:
        raise CodecError(f"a descriptor must be a ulong or a symbol, not {d!r}")
    encode_into(out, v.value)


def _e_decimal(out, v):
    # The SDK cannot decode decimal32/64 (spec §1.6); decimal128 it can.
    if v.width != 128 or len(v.raw) != 16:
        raise CodecError(f"decimal{v.width} is never emitted")
    out.append(0x94)
    out += v.raw


# Arrays: one constructor, then each element without its constructor.
_ARRAY_FIXED: dict[str, tuple[int, Callable[[Any], bytes]]] = {
    "boolean": (0x56, lambda v: b"\x01" if v else b"\x00"),
    "ubyte": (0x50, struct.Struct(">B").pack),
    "ushort": (0x60, struct.Struct(">H").pack),
    "uint": (0x70, struct.Struct(">I").pack),
    "ulong": (0x80, struct.Struct(">Q").pack),
    "byte": (0x51, struct.Struct(">b").pack),
    "short": (0x61, struct.Struct(">h").pack),
    "int": (0x71, struct.Struct(">i").pack),
    "long": (0x81, struct.Struct(">q").pack),
    "float": (0x72, struct.Struct(">f").pack),
    "double": (0x82, struct.Struct(">d").pack),
    "timestamp": (
        0x83,
        lambda v: struct.pack(">q", Timestamp.from_datetime(v) if isinstance(v, datetime) else v),
    ),
    "uuid": (0x98, lambda v: v.bytes),
    "null": (0x40, lambda v: b""),
    "decimal128": (0x94, lambda v: v.raw),
}
_ARRAY_VARIABLE = {
    "binary": (0xA0, 0xB0, bytes),
    "string": (0xA1, 0xB1, lambda v: v.encode("utf-8")),
    "symbol": (0xA3, 0xB3, lambda v: v.encode("utf-8")),
}


def _array_body(etype: Any, items: list) -> bytes:
    """Element constructor (with descriptor for described arrays) and the element bytes."""
    out = bytearray()
    if isinstance(etype, Described):
        _e_described(out, Described(etype.descriptor, None))
        out.pop()  # drop the null value: the element constructor follows instead
        etype = etype.value
    if etype in _ARRAY_FIXED:
        ctor, pack = _ARRAY_FIXED[etype]
        out.append(ctor)
        for item in items:
            out += pack(item)
    elif etype in _ARRAY_VARIABLE:
        small, large, to_bytes = _ARRAY_VARIABLE[etype]
        datas = [to_bytes(item) for item in items]
        if all(len(d) < 256 for d in datas):
            out.append(small)
            for d in datas:
                out.append(len(d))
                out += d
        else:
            out.append(large)
            for d in datas:
                out += struct.pack(">I", len(d))
                out += d
    elif etype in ("list", "map", "array"):
        ctor = {"list": 0xD0, "map": 0xD1, "array": 0xF0}[etype]
        out.append(ctor)
        for item in items:
            body = bytearray()
            if etype == "list":
                for x in item:
                    encode_into(body, x)
                count = len(item)
            elif etype == "map":
                for k, x in item.items():
                    encode_into(body, k)
                    encode_into(body, x)
                count = 2 * len(item)
            else:
                if not isinstance(item, Array):
                    raise CodecError("elements of an array of arrays must be Arrays")
                body += _array_body(item.element_type, item)
                count = len(item)
            out += struct.pack(">II", len(body) + 4, count)
            out += body
    else:
        raise CodecError(f"arrays of {etype} are not emitted")
    return bytes(out)


def _e_array(out, v):
    if not v:
        # An empty array is written as an empty list: the SDK decodes a conformant empty
        # array (e0 02 00 <ctor>) wrongly, leaving the constructor byte in the stream and
        # corrupting whatever follows; proton rejects the SDK's own form (e0 01 00). list0
        # decodes as an empty sequence in both.
        out.append(0x45)
        return
    body = _array_body(v.element_type, v)
    if len(v) < 256 and len(body) < 255:
        out += _pBBB(0xE0, len(body) + 1, len(v))
    else:
        out += _pBII(0xF0, len(body) + 4, len(v))
    out += body


_ENCODERS: dict[type, Callable[[bytearray, Any], None]] = {
    type(None): _e_null,
    bool: _e_bool,
    int: _e_long,
    UByte: _e_ubyte,
    UShort: _e_ushort,
    UInt: _e_uint,
    ULong: _e_ulong,
    Byte: _e_byte,
    Short: _e_short,
    Int: _e_int,
    Long: _e_long,
    Timestamp: _e_timestamp,
    float: _e_double,
    Float: _e_float,
    str: _e_string,
    Symbol: _e_symbol,
    bytes: _e_binary,
    bytearray: _e_binary,
    memoryview: lambda out, v: _e_binary(out, v.tobytes()),
    uuid.UUID: _e_uuid,
    datetime: _e_datetime,
    list: _e_list,
    tuple: _e_list,
    dict: _e_map,
    Array: _e_array,
    Described: _e_described,
    AmqpDecimal: _e_decimal,
}


# proton's own wrappers (e.g. in a `modified` outcome's annotations) keep their AMQP types;
# matched by name so that this module does not import proton.
_PROTON_ENCODERS = {
    "symbol": _e_symbol,
    "ulong": _e_ulong,
    "uint": _e_uint,
    "ushort": _e_ushort,
    "ubyte": _e_ubyte,
    "int32": _e_int,
    "short": _e_short,
    "byte": _e_byte,
    "timestamp": _e_timestamp,
    "float32": _e_float,
}


def encode_into(out: bytearray, v: Any) -> None:
    """Append the encoding of `v` to `out` (raw errors, see encode_value)."""
    f = _ENCODERS.get(type(v))
    if f is None:
        if type(v).__module__.startswith("proton"):
            f = _PROTON_ENCODERS.get(type(v).__name__)
            if f is not None:
                f(out, v)
                return
        for cls in type(v).__mro__[1:]:
            f = _ENCODERS.get(cls)
            if f is not None:
                break
        else:
            raise CodecError(f"cannot encode {type(v).__name__} as AMQP")
    f(out, v)


def encode_value(v: Any) -> bytes:
    """The AMQP encoding of `v` (see the module docstring for the type mapping)."""
    out = bytearray()
    try:
        encode_into(out, v)
    except CodecError:
        raise
    except (struct.error, OverflowError, UnicodeError, AttributeError, TypeError) as exc:
        raise CodecError(f"cannot encode {v!r}: {exc}") from None
    return bytes(out)
