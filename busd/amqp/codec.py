"""The AMQP 1.0 codec as the rest of busd uses it: one import for values and messages.

Each part lives in a module of its own and is re-exported here unchanged:

    busd.amqp.types      the Python types standing for precise AMQP types, and CodecError
    busd.amqp.decoding   decoding and skipping AMQP values
    busd.amqp.encoding   encoding AMQP values
    busd.amqp.sections   section descriptor codes and finding a message's sections
    busd.amqp.incoming   what the broker reads from a sent message, and its stored form (blob)
    busd.amqp.batches    batch envelopes and their inner messages
    busd.amqp.delivery   a stored message as delivered, and application-property patches
    busd.amqp.messages   whole messages decoded and encoded, for $cbs and $management

Callers only ever see `CodecError` for bad bytes or values that cannot be encoded.

busd has its own codec instead of proton's `Message` for fidelity (the bare message is handed
on byte for byte, with the sender's exact AMQP types) and for speed (a sent message is scanned
once for the few fields the broker needs, never decoded and encoded whole): docs/design.md §3.2.
"""

from __future__ import annotations

from busd.amqp.batches import unpack_batch
from busd.amqp.decoding import decode_value, skip_value
from busd.amqp.delivery import decode_properties_patch, encode_delivery, encode_properties_patch
from busd.amqp.encoding import encode_value
from busd.amqp.incoming import IncomingMessage, parse_incoming, parse_transfer
from busd.amqp.messages import (
    HEADER_FIELDS,
    PROPERTY_FIELDS,
    DecodedMessage,
    decode_message,
    encode_message,
)
from busd.amqp.sections import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    DELIVERY_ANNOTATIONS,
    FOOTER,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    split_sections,
)
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

__all__ = [
    # values
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
    # messages
    "HEADER",
    "DELIVERY_ANNOTATIONS",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "APPLICATION_PROPERTIES",
    "DATA",
    "AMQP_SEQUENCE",
    "AMQP_VALUE",
    "FOOTER",
    "PROPERTY_FIELDS",
    "HEADER_FIELDS",
    "split_sections",
    "IncomingMessage",
    "parse_incoming",
    "parse_transfer",
    "encode_delivery",
    "encode_properties_patch",
    "decode_properties_patch",
    "unpack_batch",
    "DecodedMessage",
    "decode_message",
    "encode_message",
]
