"""AMQP 1.0 values: the Python types that stand for precise AMQP types.

Where the AMQP type of a value matters to a peer it is kept in a small wrapper: `Symbol` (str),
`Timestamp` (int, ms since the epoch), `Array` (a list that remembers its element type),
`Described(descriptor, value)`, `AmqpDecimal` (kept as raw bytes; busd never does arithmetic on
them), and for encoding the integer and float widths `UByte`, `UShort`, `UInt`, `ULong`,
`Byte`, `Short`, `Int`, `Long`, `Float`. Everything else is plain Python (see
busd.amqp.decoding and busd.amqp.encoding for the mapping each way).

`CodecError` is the one error the AMQP codec raises, for bad bytes and for unencodable values.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

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
    def from_datetime(cls, dt: datetime) -> Timestamp:
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
