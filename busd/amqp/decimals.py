"""Decimal application properties in the one form every Service Bus client reads
(docs/wire.md §5.3).

AMQP's decimal types are IEEE 754-2008 decimals [1.6.17-19], and that is how the Python SDK
writes a `Decimal` (decimal128, binary integer significand). Service Bus does not pass those
bytes on: it reads the value and writes it again the way .NET writes a `System.Decimal` -
biased exponent split as `sign | E >> 9` and `(E & 0x7F) << 1` over the first two bytes, the
96-bit significand in the last twelve - and that is the layout the SDKs' decoders expect; the
Python SDK cannot read its own encoding back, nor decimal32/decimal64 at all.

`canonical(code, raw)` gives the bytes busd stores instead (constructor 0x94 and 16 bytes), or
None when the value is already in that form or has none (NaN, infinities, more than 28
decimal places, a significand of 96 bits or more): those are kept as sent.
"""

from __future__ import annotations

DECIMAL32, DECIMAL64, DECIMAL128 = 0x74, 0x84, 0x94
WIDTH = {DECIMAL32: 4, DECIMAL64: 8, DECIMAL128: 16}

# (exponent bits, bias, digits) of each IEEE 754-2008 decimal interchange format
_FORMAT = {DECIMAL32: (8, 101, 7), DECIMAL64: (10, 398, 16), DECIMAL128: (14, 6176, 34)}
_NET_BIAS = 6176
_NET_MAX_SCALE = 28  # System.Decimal: at most 28 digits after the point
_NET_MAX_SIGNIFICAND = 1 << 96


def canonical(code: int, raw: bytes) -> bytes | None:
    """`raw`: the value's bytes after its constructor `code` (0x74, 0x84 or 0x94)."""
    if code == DECIMAL128 and _is_net_form(raw):
        return None
    value = _ieee(code, raw)
    if value is None:
        return None
    sign, significand, exponent = value
    if exponent > 0:  # System.Decimal has no positive exponent: scale 0, digits written out
        significand *= 10**exponent
        exponent = 0
    while exponent < -_NET_MAX_SCALE and significand % 10 == 0:
        significand //= 10
        exponent += 1
    if exponent < -_NET_MAX_SCALE or significand >= _NET_MAX_SIGNIFICAND:
        return None
    biased = _NET_BIAS + exponent
    return bytes(
        (DECIMAL128, (sign << 7) | (biased >> 9), (biased & 0x7F) << 1, 0, 0)
    ) + significand.to_bytes(12, "big")


def _is_net_form(raw: bytes) -> bool:
    b0, b1 = raw[0], raw[1]
    if b0 & 0x7F != _NET_BIAS >> 9 or b1 & 1 or raw[2] or raw[3]:
        return False
    biased = ((b0 & 0x7F) << 9) | (b1 >> 1)
    return _NET_BIAS - _NET_MAX_SCALE <= biased <= _NET_BIAS


def _ieee(code: int, raw: bytes) -> tuple[int, int, int] | None:
    """(sign, significand, exponent) of an IEEE 754-2008 decimal with a binary integer
    significand; None for NaN and the infinities."""
    bits = int.from_bytes(raw, "big")
    width = len(raw) * 8
    exponent_bits, bias, digits = _FORMAT[code]
    tail = width - 1 - exponent_bits  # significand bits of the common form
    sign = bits >> (width - 1)
    if (bits >> (width - 3)) & 0b11 == 0b11:
        if (bits >> (width - 5)) & 0b11 == 0b11:
            return None  # infinity or NaN
        exponent = (bits >> (tail - 2)) & ((1 << exponent_bits) - 1)
        significand = (0b100 << (tail - 2)) | (bits & ((1 << (tail - 2)) - 1))
    else:
        exponent = (bits >> tail) & ((1 << exponent_bits) - 1)
        significand = bits & ((1 << tail) - 1)
    if significand >= 10**digits:
        significand = 0  # a non-canonical significand is zero [IEEE 754-2008 3.5.2]
    return sign, significand, exponent - bias
