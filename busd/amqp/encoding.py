"""AMQP 1.0 value encoding.

Wrappers from busd.amqp.types choose the precise type: `UByte`, `UShort`, `UInt`, `ULong`,
`Byte`, `Short`, `Int`, `Long`, `Float`, `Timestamp`, `Symbol`, `Array`, `Described`,
`AmqpDecimal` (decimal128 only). A plain int becomes a `long`, a str a `string`, bytes a
`binary`, float a `double`, dict a `map`, list a `list`, a datetime a `timestamp`. char,
decimal32 and decimal64 are never emitted: the SDK's decoder has no entry for them (docs/wire.md
§1.6).

`encode_into` appends to a bytearray and lets raw errors through, for the message modules of
this package; `encode_value` turns them into `CodecError`.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from busd.amqp.types import (
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
)

__all__ = ["encode_value"]


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
    # The SDK cannot decode decimal32/64 (docs/wire.md §1.6); decimal128 it can.
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
