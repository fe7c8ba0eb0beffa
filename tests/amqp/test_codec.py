"""The AMQP codec against the two decoders that matter: proton (busd's engine) and the SDK's
pyamqp (what clients send and can read). Messages here are built by the SDK itself."""

from __future__ import annotations

import datetime
import random
import struct
import uuid

import proton
import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusReceivedMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp._decode import _DECODE_BY_CONSTRUCTOR, decode_payload
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._pyamqp.message import Message as PyamqpMessage
from azure.servicebus._pyamqp.message import Properties as PyamqpProperties
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.amqp import AmqpAnnotatedMessage

from busd.amqp import codec
from busd.amqp.codec import (
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

UTC = datetime.UTC
U1 = uuid.UUID("7996a2e5-7e5f-479d-bcc6-22f11100456c")
U2 = uuid.UUID("44c44ec9-21cd-463a-9327-2f7b9e778bcc")


# --- helpers -----------------------------------------------------------------------------------


def sdk_bytes(message) -> bytes:
    """The payload the SDK puts on the wire for one message."""
    outgoing = transform_outbound_messages(
        message, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    return bytes(PyamqpTransport.encode_message(outgoing))


def sdk_batch(*messages) -> bytes:
    batch = ServiceBusMessageBatch(amqp_transport=PyamqpTransport)
    for message in messages:
        batch._add(message)
    return bytes(encode_payload(bytearray(), batch._message))


def pyamqp_value(data: bytes):
    rest, value = _DECODE_BY_CONSTRUCTOR[data[0]](memoryview(data)[1:])
    assert len(rest) == 0, "pyamqp left bytes unread"
    return value


def proton_value(data: bytes):
    d = proton.Data()
    assert d.decode(data) == len(data)
    d.rewind()
    d.next()
    return norm(d.get_object())  # now: proton's binaries are views into its buffer


def proton_bytes(value) -> bytes:
    d = proton.Data()
    d.put_object(value)
    return d.encode()


def norm(v):
    """Compare values across decoders: arrays as lists, described as pairs, text as str."""
    if isinstance(v, (Described, proton.Described)):
        return ["described", norm(v.descriptor), norm(v.value)]
    if isinstance(v, AmqpDecimal):
        return ["decimal", v.raw]
    if isinstance(v, proton.decimal128):
        return ["decimal", bytes(v)]
    if isinstance(v, proton.Array):
        return [norm(x) for x in v.elements]
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {norm(k): norm(x) for k, x in v.items()}
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    return v


def text_as_bytes(v):
    """pyamqp decodes string and symbol to bytes."""
    v = norm(v)
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, list):
        return [text_as_bytes(x) for x in v]
    if isinstance(v, dict):
        return {text_as_bytes(k): text_as_bytes(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(text_as_bytes(x) for x in v)
    return v


# --- values ------------------------------------------------------------------------------------

ROUND_TRIPS = [
    (None, "40"),
    (True, "41"),
    (False, "42"),
    (UByte(200), "50c8"),
    (UShort(65000), "60fde8"),
    (UInt(0), "43"),
    (UInt(7), "5207"),
    (UInt(70000), "7000011170"),
    (ULong(0), "44"),
    (ULong(9), "5309"),
    (ULong(2**40), "800000010000000000"),
    (Byte(-5), "51fb"),
    (Short(-300), "61fed4"),
    (Int(-5), "54fb"),
    (Int(100000), "71000186a0"),
    (Long(3), "5503"),
    (7, "5507"),
    (-(2**62), "81c000000000000000"),
    (Float(1.5), "723fc00000"),
    (1.5, "823ff8000000000000"),
    (Timestamp(1_700_000_000_000), "830000018bcfe56800"),
    (U1, "98" + U1.hex),
    (b"", "a000"),
    (b"\x00\xff", "a00200ff"),
    (b"x" * 300, None),
    ("", "a100"),
    ("héllo", "a106" + "héllo".encode().hex()),
    ("s" * 300, None),
    (Symbol("com.microsoft:session-filter"), None),
    (Symbol("y" * 256), None),
    ([], "45"),
    ([1, "a", None], "c0070355 01a101 6140".replace(" ", "")),
    (list(range(300)), None),
    ({}, "c10100"),
    ({"k": "v"}, "c10702a1016ba10176"),
    ({Symbol(f"k{i}"): i for i in range(200)}, None),
    ({"nested": [{"a": [1, [2, {"b": b"c"}]]}]}, None),
    (Array("uuid", [U1, U2]), None),
    (Array("long", [1, -1, 2**40]), None),
    (Array("timestamp", [Timestamp(1), Timestamp(2)]), None),
    (Array("string", ["a", "bb"]), None),
    (Array("string", ["a", "b" * 300]), None),
    (Array("symbol", [Symbol("a")]), None),
    (Array("uint", [0, 1, 2**32 - 1]), None),
    (Array("int", [-1, 5]), None),
    (Array("ulong", [1]), None),
    (Array("boolean", [True, False]), None),
    (Array("binary", [b"1", b""]), None),
    (Array("double", [0.5]), None),
    (Array("float", [0.5]), None),
    (Array("ubyte", [1, 255]), None),
    (Array("ushort", [1]), None),
    (Array("byte", [-1]), None),
    (Array("short", [-1]), None),
    (Array("list", [[1, "a"], []]), None),
    (Array("map", [{"a": 1}, {}]), None),
    (Array("array", [Array("long", [1, 2]), Array("long", [3])]), None),
    (Array(Described(ULong(0x24), "list"), [[], [1]]), None),
    (Array("long", list(range(100))), None),
    (Described(0x70, [True, None]), "005370c003024140"),
    (Described(Symbol("com.microsoft:x"), "v"), None),
    (Described(0x1234, None), "0080000000000000123440"),
    (AmqpDecimal(128, bytes(range(16))), "94" + bytes(range(16)).hex()),
]


@pytest.mark.parametrize("value, wire", ROUND_TRIPS, ids=lambda v: repr(v)[:40])
def test_value_round_trips(value, wire):
    data = codec.encode_value(value)
    if wire is not None:
        assert data.hex() == wire
    decoded, end = codec.decode_value(data)
    assert end == len(data)
    assert decoded == value
    assert type(decoded) is type(value) or type(value) in (
        UByte,
        UShort,
        UInt,
        ULong,
        Byte,
        Short,
        Int,
        Long,
        Float,
        tuple,
    )
    if isinstance(value, (Symbol, Timestamp, Array, Described, AmqpDecimal, uuid.UUID, bytes)):
        assert type(decoded) is type(value)
    if isinstance(value, Array):
        assert decoded.element_type == value.element_type
    # Re-encoding what was decoded gives the same bytes whenever the type survives decoding.
    if type(decoded) is type(value):
        assert codec.encode_value(decoded) == data
    assert codec.skip_value(data) == len(data)


@pytest.mark.parametrize("value, wire", ROUND_TRIPS, ids=lambda v: repr(v)[:40])
def test_values_decode_the_same_in_proton(value, wire):
    data = codec.encode_value(value)
    assert norm(proton_value(data)) == norm(value)


# pyamqp maps decimals and arrays of described values to classes of its own: not compared.
PYAMQP_COMPARABLE = [
    (value, wire)
    for value, wire in ROUND_TRIPS
    if not isinstance(value, AmqpDecimal)
    and not (isinstance(value, Array) and isinstance(value.element_type, Described))
]


@pytest.mark.parametrize("value, wire", PYAMQP_COMPARABLE, ids=lambda v: repr(v)[:40])
def test_values_decode_the_same_in_pyamqp(value, wire):
    data = codec.encode_value(value)
    if isinstance(value, Described):  # pyamqp drops the descriptors it does not know
        value = value.value
    assert text_as_bytes(pyamqp_value(data)) == text_as_bytes(value)


PROTON_VALUES = [
    proton.ubyte(3),
    proton.ushort(4),
    proton.uint(5),
    proton.uint(100000),
    proton.ulong(6),
    proton.ulong(2**63),
    proton.byte(-1),
    proton.short(-2),
    proton.int32(-3),
    -(2**40),
    proton.float32(0.25),
    0.125,
    proton.timestamp(1234567890123),
    U1,
    b"bin",
    "text",
    proton.symbol("sym"),
    proton.char("é"),
    [1, [2, "x"]],
    {proton.symbol("a"): [None, True]},
    proton.Array(proton.UNDESCRIBED, proton.Data.UUID, U1, U2),
    proton.Array(proton.UNDESCRIBED, proton.Data.TIMESTAMP, 1, 2),
    proton.Array(proton.UNDESCRIBED, proton.Data.STRING, "a", "b"),
    proton.Array(proton.UNDESCRIBED, proton.Data.LONG, 7, 8),
    proton.Array(proton.symbol("d"), proton.Data.INT, 1, 2),
    proton.Described(proton.ulong(0x77), "v"),
    proton.Described(proton.symbol("x:y"), {1: 2}),
]


@pytest.mark.parametrize("value", PROTON_VALUES, ids=lambda v: repr(v)[:40])
def test_decodes_what_proton_encodes(value):
    data = proton_bytes(value)
    decoded, end = codec.decode_value(data)
    assert end == len(data)
    assert norm(decoded) == norm(value)
    if isinstance(value, proton.Array):
        assert isinstance(decoded, Array)
        assert (
            decoded.element_type
            if value.descriptor is proton.UNDESCRIBED
            else decoded.element_type.descriptor
        ) == {
            proton.Data.UUID: "uuid",
            proton.Data.TIMESTAMP: "timestamp",
            proton.Data.STRING: "string",
            proton.Data.LONG: "long",
        }.get(value.type, value.descriptor)
        # and back: proton reads our re-encoding as the same array
        assert norm(proton_value(codec.encode_value(decoded))) == norm(value)


def test_decimals_are_kept_as_raw_bytes():
    for value, width in (
        (proton.decimal32(7), 32),
        (proton.decimal64(8), 64),
        (proton.decimal128(b"\x01" * 16), 128),
    ):
        decoded, _ = codec.decode_value(proton_bytes(value))
        assert isinstance(decoded, AmqpDecimal) and decoded.width == width
    # the SDK cannot decode decimal32/64 or char: never emitted
    with pytest.raises(CodecError):
        codec.encode_value(AmqpDecimal(32, b"\0\0\0\1"))
    with pytest.raises(CodecError):
        codec.encode_value(AmqpDecimal(64, bytes(8)))
    assert codec.encode_value("é")[0] == 0xA1  # a one-character str is a string, not a char


def test_plain_python_types_map_to_amqp_types():
    assert codec.encode_value(5)[0] == 0x55  # int -> long
    assert codec.encode_value(2**40)[0] == 0x81
    assert codec.encode_value("x")[0] == 0xA1
    assert codec.encode_value(b"x")[0] == 0xA0
    assert codec.encode_value(bytearray(b"x"))[0] == 0xA0
    assert codec.encode_value(1.0)[0] == 0x82
    assert codec.encode_value(U1)[0] == 0x98
    assert codec.encode_value((1, 2))[0] == 0xC0
    dt = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    assert codec.decode_value(codec.encode_value(dt))[0] == int(dt.timestamp() * 1000)
    assert Timestamp.from_datetime(dt) == int(dt.timestamp() * 1000)
    # proton's wrappers keep their types
    assert codec.encode_value(proton.symbol("s"))[0] == 0xA3
    assert codec.encode_value(proton.uint(300))[0] == 0x70
    assert codec.encode_value(proton.timestamp(5))[0] == 0x83
    assert codec.encode_value(proton.int32(5))[0] == 0x54
    with pytest.raises(CodecError):
        codec.encode_value(object())
    with pytest.raises(CodecError):
        codec.encode_value(UInt(-1))
    with pytest.raises(CodecError):
        codec.encode_value(2**64)
    with pytest.raises(CodecError):
        Array("no-such-type", [])


def test_empty_array_is_written_as_an_empty_list():
    # pyamqp mis-decodes a conformant empty array (leaves its constructor in the stream);
    # proton rejects pyamqp's own form. list0 reads as empty in both.
    data = codec.encode_message(value={"sessions-ids": Array(str, []), "skip": Int(0)})
    body = decode_payload(memoryview(data)).value
    assert body == {b"sessions-ids": [], b"skip": 0}
    assert proton.Message().decode(data) is None
    # all three empty forms decode
    assert codec.decode_value(bytes.fromhex("e00100"))[0] == []
    assert codec.decode_value(bytes.fromhex("e0020081"))[0] == []
    assert codec.decode_value(bytes.fromhex("f0000000050000000081"))[0] == []


def test_binary_values_are_real_bytes():
    payload = bytearray(codec.encode_value({"k": b"abc"}))
    value, _ = codec.decode_value(memoryview(payload))
    payload[:] = bytes(len(payload))
    assert type(value["k"]) is bytes and value["k"] == b"abc"


# --- sections ----------------------------------------------------------------------------------


def test_split_sections_accepts_delivery_annotations_last():
    message = AmqpAnnotatedMessage(
        data_body=b"body",
        delivery_annotations={"x-opt-da": "v"},
        annotations={"x-opt-partition-key": "p"},
        properties={"message_id": "m1", "group_id": "g"},
        application_properties={"k": 1},
        footer={"f": 1},
    )
    payload = sdk_bytes(message)
    codes = [code for code, _, _ in codec.split_sections(payload)]
    assert codes == [0x72, 0x73, 0x74, 0x75, 0x78, 0x71]
    incoming = codec.parse_incoming(payload)
    assert incoming.message_id == "m1" and incoming.session_id == "g"
    assert incoming.partition_key == "p"
    delivered = codec.encode_delivery(incoming.blob, seq=1, enqueued_ms=2, delivery_count=0)
    decoded = decode_payload(memoryview(delivered))
    assert decoded.delivery_annotations == {b"x-opt-da": b"v"}  # passed on, as Service Bus does
    assert decoded.footer == {b"f": 1}
    assert decoded.data == [b"body"]


def test_delivery_annotations_lead_with_the_lock_token_and_drop_a_forged_one():
    message = AmqpAnnotatedMessage(
        data_body=b"body",
        delivery_annotations={"x-opt-lock-token": "forged", "hop": 7},
        application_properties={"k": "v"},
    )
    incoming = codec.parse_incoming(sdk_bytes(message))
    token = uuid.uuid4()
    delivered = codec.encode_delivery(
        incoming.blob,
        seq=1,
        enqueued_ms=2,
        delivery_count=0,
        lock_token=token.bytes,
        dead_letter_reason="why",
    )
    decoded = decode_payload(memoryview(delivered))
    assert decoded.delivery_annotations == {b"x-opt-lock-token": token, b"hop": 7}
    assert list(decoded.delivery_annotations)[0] == b"x-opt-lock-token"
    assert decoded.application_properties == {b"k": b"v", b"DeadLetterReason": b"why"}
    # proton reads the same
    pm = proton.Message()
    pm.decode(delivered)
    assert pm.instructions == {Symbol("x-opt-lock-token"): token, Symbol("hop"): 7}
    # a message without delivery annotations gets the lock token alone, or an empty map
    plain = codec.parse_incoming(sdk_bytes(AmqpAnnotatedMessage(data_body=b"b"))).blob
    locked = codec.encode_delivery(
        plain, seq=1, enqueued_ms=2, delivery_count=0, lock_token=token.bytes
    )
    assert decode_payload(memoryview(locked)).delivery_annotations == {b"x-opt-lock-token": token}
    unlocked = codec.encode_delivery(plain, seq=1, enqueued_ms=2, delivery_count=0)
    assert decode_payload(memoryview(unlocked)).delivery_annotations == {}
    with pytest.raises(CodecError):
        codec.encode_delivery(plain, seq=1, enqueued_ms=2, delivery_count=0, lock_token=b"x")


def test_partition_key_and_group_ids_as_utf8_binary_are_read_as_text():
    payload = codec.encode_value(
        Described(ULong(0x72), {Symbol("x-opt-partition-key"): b"p\xc3\xa9"})
    ) + codec.encode_value(
        Described(
            ULong(0x73),
            ["m", None, None, None, None, None, None, None, None, None, b"g", None, b"r"],
        )
    )
    incoming = codec.parse_incoming(payload)
    assert (incoming.partition_key, incoming.session_id, incoming.reply_to_session_id) == (
        "p\u00e9",
        "g",
        "r",
    )
    bad = codec.encode_value(Described(ULong(0x72), {Symbol("x-opt-partition-key"): b"\xff"}))
    with pytest.raises(CodecError, match="UTF-8"):
        codec.parse_incoming(bad)


def test_decimal_application_properties_are_stored_in_the_form_the_sdk_reads():
    from decimal import Decimal

    message = ServiceBusMessage(
        b"x", application_properties={"a": Decimal("1.5"), "b": "text", "c": Decimal("-0.05")}
    )
    payload = sdk_bytes(message)
    incoming = codec.parse_incoming(payload)
    delivered = codec.encode_delivery(
        incoming.blob, seq=1, enqueued_ms=2, delivery_count=0, dead_letter_reason="r"
    )
    decoded = decode_payload(memoryview(delivered))
    assert decoded.application_properties == {
        b"a": Decimal("1.5"),
        b"b": b"text",
        b"c": Decimal("-0.05"),
        b"DeadLetterReason": b"r",
    }
    # canonical bytes are kept as they are: the second pass changes nothing
    again = codec.parse_incoming(
        codec.encode_delivery(incoming.blob, seq=1, enqueued_ms=2, delivery_count=0)
    )
    assert again.blob[-40:] == incoming.blob[-40:]
    # decimal32 and decimal64 (which the SDK cannot read at all) become decimal128
    for raw, value in (
        (bytes.fromhex("743200000f"), Decimal("1.5")),
        (bytes.fromhex("843180000000000019"), Decimal("0.25")),
    ):
        entry = b"\xa1\x01d" + raw
        section = b"\x00\x53\x74\xc1" + bytes((len(entry) + 1, 2)) + entry
        got = codec.parse_incoming(section)
        out = codec.encode_delivery(got.blob, seq=1, enqueued_ms=2, delivery_count=0)
        assert decode_payload(memoryview(out)).application_properties == {b"d": value}


def test_symbolic_section_descriptors_are_understood():
    payload = codec.encode_value(
        Described(Symbol("amqp:properties:list"), ["id-1"])
    ) + codec.encode_value(Described(Symbol("amqp:data:binary"), b"hi"))
    assert [c for c, _, _ in codec.split_sections(payload)] == [0x73, 0x75]
    assert codec.parse_incoming(payload).message_id == "id-1"


# --- incoming messages from the SDK ------------------------------------------------------------


def test_parse_sdk_session_message():
    scheduled = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    payload = sdk_bytes(
        ServiceBusMessage(
            "hello",
            session_id="s1",
            reply_to_session_id="r1",
            message_id="m-1",
            application_properties={"k": "v", "n": 5},
            time_to_live=datetime.timedelta(seconds=30),
            scheduled_enqueue_time_utc=scheduled,
            partition_key="s1",
        )
    )
    incoming = codec.parse_incoming(payload)
    assert incoming.session_id == "s1"
    assert incoming.reply_to_session_id == "r1"
    assert incoming.message_id == "m-1"
    assert incoming.ttl_ms == 30000
    assert incoming.scheduled_ms == int(scheduled.timestamp() * 1000)
    assert incoming.partition_key == "s1"
    assert incoming.size == len(payload)
    # the bare message (properties onwards) is stored byte for byte
    bare_start = [start for code, start, _ in codec.split_sections(payload) if code == 0x73][0]
    assert incoming.blob.endswith(payload[bare_start:])


@pytest.mark.parametrize(
    "message_id, expected",
    [("abc", "abc"), (U1, str(U1)), (12345, "12345"), (b"\x01\xff", "01ff")],
)
def test_message_id_canonical_text(message_id, expected):
    message = AmqpAnnotatedMessage(data_body=b"x", properties={"message_id": message_id})
    assert codec.parse_incoming(sdk_bytes(message)).message_id == expected


def test_message_without_body_or_header():
    payload = sdk_bytes(ServiceBusMessage(None, session_id="s"))
    assert [c for c, _, _ in codec.split_sections(payload)] == [0x73]
    incoming = codec.parse_incoming(payload)
    assert incoming.session_id == "s" and incoming.ttl_ms is None
    decoded = decode_payload(
        memoryview(codec.encode_delivery(incoming.blob, seq=1, enqueued_ms=1, delivery_count=0))
    )
    assert decoded.data is None and decoded.value is None
    assert decoded.properties.group_id == b"s"
    assert codec.parse_incoming(b"").blob  # even an empty payload has a stored form


def test_header_fields_are_kept():
    payload = sdk_bytes(
        AmqpAnnotatedMessage(
            data_body=b"x", header={"durable": True, "priority": 7, "time_to_live": 5000}
        )
    )
    incoming = codec.parse_incoming(payload)
    assert (incoming.durable, incoming.priority, incoming.ttl_ms) == (True, 7, 5000)
    header = decode_payload(
        memoryview(codec.encode_delivery(incoming.blob, seq=1, enqueued_ms=1, delivery_count=2))
    ).header
    assert (header.durable, header.priority, header.ttl, header.delivery_count) == (
        True,
        7,
        5000,
        2,
    )


def test_broker_owned_annotations_are_replaced():
    # A received message sent again carries the broker's annotations back (docs/wire.md §5.3).
    payload = sdk_bytes(
        AmqpAnnotatedMessage(
            data_body=b"x",
            annotations={
                "x-opt-sequence-number": 99,
                "x-opt-enqueued-time": 5,
                "x-opt-locked-until": 6,
                "x-opt-message-state": 1,
                "x-opt-enqueue-sequence-number": 3,
                "x-opt-deadletter-source": "q",
                "x-opt-lock-token": U1,
                "custom": "kept",
            },
        )
    )
    incoming = codec.parse_incoming(payload)
    delivered = codec.encode_delivery(incoming.blob, seq=1, enqueued_ms=1000, delivery_count=0)
    annotations = codec.decode_message(delivered).message_annotations
    assert annotations == {
        "x-opt-sequence-number": 1,
        "x-opt-enqueued-time": 1000,
        "custom": "kept",
    }
    assert all(type(k) is Symbol for k in annotations)


def test_annotation_keys_sent_as_strings_become_symbols():
    payload = codec.encode_message(properties={"message_id": "m"}, data=b"x")
    payload = b"\x00\x53\x72" + codec.encode_value({"x-opt-partition-key": "pk", "a": 1}) + payload
    incoming = codec.parse_incoming(payload)
    assert incoming.partition_key == "pk"
    delivered = codec.encode_delivery(incoming.blob, seq=1, enqueued_ms=1, delivery_count=0)
    annotations = codec.decode_message(delivered).message_annotations
    assert annotations["a"] == 1 and all(type(k) is Symbol for k in annotations)


# --- deliveries --------------------------------------------------------------------------------


def received(payload: bytes) -> ServiceBusReceivedMessage:
    return ServiceBusReceivedMessage(decode_payload(memoryview(payload)), receiver=None)


def test_delivery_decodes_in_the_sdk():
    payload = sdk_bytes(
        ServiceBusMessage("hello", session_id="s1", application_properties={"k": "v"})
    )
    incoming = codec.parse_incoming(payload)
    delivered = codec.encode_delivery(
        incoming.blob,
        seq=42,
        enqueued_ms=1_700_000_000_123,
        delivery_count=0,
        locked_until_ms=1_700_000_060_000,
    )
    raw = decode_payload(memoryview(delivered))
    assert raw.header.delivery_count == 0  # explicit, not absent
    assert delivered.startswith(bytes.fromhex("005370c006054040404043"))
    assert raw.message_annotations[b"x-opt-sequence-number"] == 42
    message = received(delivered)
    assert message.sequence_number == 42
    assert message.delivery_count == 0
    assert message.enqueued_time_utc == datetime.datetime.fromtimestamp(1_700_000_000.123, UTC)
    assert message.locked_until_utc == datetime.datetime.fromtimestamp(1_700_000_060, UTC)
    assert message.session_id == "s1"
    assert message.application_properties == {b"k": b"v"}
    assert b"".join(message.body) == b"hello"
    # the bare message goes out exactly as it came in
    bare_start = [s for c, s, _ in codec.split_sections(payload) if c == 0x73][0]
    assert delivered.endswith(payload[bare_start:])
    # proton reads it too
    pm = proton.Message()
    pm.decode(delivered)
    assert pm.annotations[proton.symbol("x-opt-sequence-number")] == 42
    assert pm.group_id == "s1" and bytes(pm.body) == b"hello"


def test_delivery_message_state_and_large_counts():
    incoming = codec.parse_incoming(sdk_bytes(ServiceBusMessage(b"x")))
    delivered = codec.encode_delivery(
        incoming.blob, seq=2**40, enqueued_ms=1, delivery_count=70000, message_state=2
    )
    message = received(delivered)
    assert message.sequence_number == 2**40
    assert message.delivery_count == 70000
    assert message.state == 2
    assert decode_payload(memoryview(delivered)).message_annotations[b"x-opt-message-state"] == 2


def test_dead_letter_reason_and_patch_are_merged_into_application_properties():
    payload = sdk_bytes(
        ServiceBusMessage("b", session_id="s", application_properties={"keep": 1, "over": "a"})
    )
    incoming = codec.parse_incoming(payload)
    patch = codec.encode_properties_patch({"over": "b", "new": Int(3)})
    delivered = codec.encode_delivery(
        incoming.blob,
        seq=1,
        enqueued_ms=1,
        delivery_count=1,
        dead_letter_reason="TooMany",
        dead_letter_description="tried 10 times",
        properties_patch=patch,
    )
    message = received(delivered)
    assert message.dead_letter_reason == "TooMany"
    assert message.dead_letter_error_description == "tried 10 times"
    app = codec.decode_message(delivered).application_properties
    assert app == {
        "keep": 1,
        "over": "b",
        "new": 3,
        "DeadLetterReason": "TooMany",
        "DeadLetterErrorDescription": "tried 10 times",
    }
    # untouched entries keep their wire type: "keep" was sent as a 32-bit int (0x54)
    section = [(s, e) for c, s, e in codec.split_sections(delivered) if c == 0x74][0]
    assert b"\xa1\x04keep\x54\x01" in delivered[section[0] : section[1]]
    assert message.body is not None and b"".join(message.body) == b"b"


def test_patch_creates_application_properties_right_after_properties():
    incoming = codec.parse_incoming(sdk_bytes(ServiceBusMessage("b", session_id="s")))
    delivered = codec.encode_delivery(
        incoming.blob, seq=1, enqueued_ms=1, delivery_count=0, dead_letter_reason="r"
    )
    sections = [c for c, _, _ in codec.split_sections(delivered)]
    assert sections == [0x70, 0x71, 0x72, 0x73, 0x74, 0x75]
    assert received(delivered).dead_letter_reason == "r"
    # without properties, the new section opens the bare message
    incoming = codec.parse_incoming(codec.encode_message(data=b"z"))
    delivered = codec.encode_delivery(
        incoming.blob, seq=1, enqueued_ms=1, delivery_count=0, properties_patch={"a": 1}
    )
    assert [c for c, _, _ in codec.split_sections(delivered)] == [0x70, 0x71, 0x72, 0x74, 0x75]


def test_properties_patches_concatenate():
    first = codec.encode_properties_patch({"a": 1, "b": "x"})
    second = codec.encode_properties_patch({"b": "y", "c": U1})
    assert codec.decode_properties_patch(first + second) == {"a": 1, "b": "y", "c": U1}
    assert codec.encode_properties_patch({}) == b""
    with pytest.raises(CodecError):
        codec.encode_properties_patch({1: "x"})
    with pytest.raises(CodecError):
        codec.decode_properties_patch(b"\xa1\x05ab")


def test_large_annotations_and_application_properties_use_32_bit_maps():
    app = {f"key-{i}": "v" * 20 for i in range(40)}
    payload = sdk_bytes(
        ServiceBusMessage(b"x" * 1000, application_properties=app, partition_key="p" * 100)
    )
    incoming = codec.parse_incoming(payload)
    delivered = codec.encode_delivery(
        incoming.blob,
        seq=1,
        enqueued_ms=1,
        delivery_count=0,
        locked_until_ms=5,
        dead_letter_reason="r" * 300,
    )
    message = received(delivered)
    assert message.partition_key == "p" * 100
    assert message.dead_letter_reason == "r" * 300
    assert len(message.application_properties) == 41
    assert b"".join(message.body) == b"x" * 1000


def test_encode_delivery_rejects_what_is_not_a_blob():
    with pytest.raises(CodecError):
        codec.encode_delivery(b"\x01\x00", seq=1, enqueued_ms=1, delivery_count=0)
    with pytest.raises(CodecError):
        codec.encode_delivery(b"\x07" + bytes(40), seq=1, enqueued_ms=1, delivery_count=0)
    blob = codec.parse_incoming(sdk_bytes(ServiceBusMessage("x"))).blob
    with pytest.raises(CodecError):
        codec.encode_delivery(blob, seq=2**63, enqueued_ms=1, delivery_count=0)


# --- batches -----------------------------------------------------------------------------------


def test_sdk_batch_is_unpacked():
    first = ServiceBusMessage("a", session_id="s1", message_id="first", partition_key="s1")
    second = ServiceBusMessage(
        b"b" * 300, session_id="s1", message_id="second", time_to_live=datetime.timedelta(seconds=9)
    )
    payload = sdk_batch(first, second)
    inner = codec.unpack_batch(payload)
    assert inner is not None and len(inner) == 2
    a, b = (codec.parse_incoming(part) for part in inner)
    assert (a.message_id, a.session_id, a.partition_key) == ("first", "s1", "s1")
    assert (b.message_id, b.session_id, b.ttl_ms) == ("second", "s1", 9000)
    assert inner[1] == sdk_bytes(second) or codec.decode_message(inner[1]).body == [b"b" * 300]
    delivered = received(codec.encode_delivery(b.blob, seq=2, enqueued_ms=1, delivery_count=0))
    assert b"".join(delivered.body) == b"b" * 300


def test_parse_transfer_handles_batches_and_single_messages():
    batch = sdk_batch(
        ServiceBusMessage("a", session_id="s", message_id="1"),
        ServiceBusMessage("b", session_id="t", message_id="2"),
    )
    messages = codec.parse_transfer(batch)
    assert [(m.message_id, m.session_id) for m in messages] == [("1", "s"), ("2", "t")]
    assert [m.blob for m in messages] == [
        codec.parse_incoming(part).blob for part in codec.unpack_batch(batch)
    ]
    single = sdk_bytes(ServiceBusMessage("c", session_id="u", message_id="3"))
    (message,) = codec.parse_transfer(single)
    assert message.blob == codec.parse_incoming(single).blob and message.size == len(single)
    with pytest.raises(CodecError):
        codec.parse_transfer(single[:-1])


def test_single_messages_are_not_batches():
    for message in (
        ServiceBusMessage("hello"),
        ServiceBusMessage(None),
        ServiceBusMessage(b"\x00\x53\x75\xa0\x01"),  # looks like a section but is cut short
        AmqpAnnotatedMessage(value_body={"a": 1}),
        AmqpAnnotatedMessage(sequence_body=[1, 2]),
    ):
        assert codec.unpack_batch(sdk_bytes(message)) is None


def test_batch_false_positive_is_limited_by_message_id():
    embedded = sdk_bytes(ServiceBusMessage("inner", message_id="inner-id"))
    # The documented false positive: a body that is itself an encoded message, with no
    # message-id of its own (or the same one), is taken for a batch.
    bare = codec.encode_message(data=embedded)
    assert codec.unpack_batch(bare) == [embedded]
    # An SDK message always has its own message-id, which differs: not a batch.
    assert codec.unpack_batch(sdk_bytes(ServiceBusMessage(embedded))) is None


# --- request/response messages -----------------------------------------------------------------


def test_decode_management_request_built_by_pyamqp():
    request = PyamqpMessage(
        value={
            "lock-tokens": {
                "TYPE": "ARRAY",
                "VALUE": [{"TYPE": "UUID", "VALUE": U1}, {"TYPE": "UUID", "VALUE": U2}],
            }
        },
        properties=PyamqpProperties(message_id=U1, reply_to=b"q/$management"),
        application_properties={
            "operation": "com.microsoft:renew-lock",
            "com.microsoft:server-timeout": {"TYPE": "UINT", "VALUE": 60000},
        },
    )
    payload = bytes(encode_payload(bytearray(), request))
    decoded = codec.decode_message(payload)
    assert decoded.properties["message_id"] == U1
    assert decoded.properties["reply_to"] == "q/$management"
    assert decoded.application_properties == {
        "operation": "com.microsoft:renew-lock",
        "com.microsoft:server-timeout": 60000,
    }
    assert decoded.body_type == "value"
    assert decoded.body == {"lock-tokens": [U1, U2]}
    assert decoded.body["lock-tokens"].element_type == "uuid"


def test_encode_management_response_reads_in_pyamqp_and_proton():
    payload = codec.encode_message(
        properties={"correlation_id": U1},
        application_properties={
            "statusCode": Int(200),
            "statusDescription": "OK",
            "errorCondition": Symbol("com.microsoft:x"),
        },
        value={
            "expirations": Array(Timestamp, [Timestamp(5), Timestamp(6)]),
            "sequence-numbers": Array(Long, [1, 2]),
        },
    )
    message = decode_payload(memoryview(payload))
    assert message.properties.correlation_id == U1  # a uuid, matched with ==
    assert message.application_properties[b"statusCode"] == 200
    assert message.value == {b"expirations": [5, 6], b"sequence-numbers": [1, 2]}
    pm = proton.Message()
    pm.decode(payload)
    assert pm.correlation_id == U1
    assert pm.properties["statusCode"] == 200
    assert pm.body["expirations"].type == proton.Data.TIMESTAMP


def test_encode_message_types_property_fields():
    payload = codec.encode_message(
        header={"durable": True, "ttl": 5, "delivery_count": 0},
        message_annotations={"x-opt-a": 1},
        properties={
            "message_id": 17,
            "user_id": "u",
            "to": "t",
            "subject": "s",
            "reply_to": "r",
            "correlation_id": b"c",
            "content_type": "text/plain",
            "content_encoding": "gzip",
            "absolute_expiry_time": 10,
            "creation_time": 9,
            "group_id": "g",
            "group_sequence": 3,
            "reply_to_group_id": "rg",
        },
        data=[b"a", b"b"],
    )
    decoded = codec.decode_message(payload)
    assert decoded.header == {
        "durable": True,
        "priority": None,
        "ttl": 5,
        "first_acquirer": None,
        "delivery_count": 0,
    }
    assert type(decoded.message_annotations and list(decoded.message_annotations)[0]) is Symbol
    p = decoded.properties
    assert p["message_id"] == 17 and p["user_id"] == b"u" and p["correlation_id"] == b"c"
    assert type(p["content_type"]) is Symbol and type(p["creation_time"]) is Timestamp
    assert p["group_sequence"] == 3 and p["reply_to_group_id"] == "rg"
    assert decoded.body == [b"a", b"b"] and decoded.body_type == "data"
    raw = decode_payload(memoryview(payload))
    assert raw.properties.message_id == 17 and raw.header.delivery_count == 0
    assert codec.encode_message(value=None).endswith(b"\x00\x53\x77\x40")
    with pytest.raises(CodecError):
        codec.encode_message(properties={"nope": 1})


def test_cbs_put_token_round_trip():
    payload = codec.encode_message(
        properties={"message_id": "cbs-1", "reply_to": "cbs"},
        application_properties={"operation": "put-token", "type": "jwt", "name": "sb://x/q"},
        value="SharedAccessSignature sr=...",
    )
    decoded = codec.decode_message(payload)
    assert decoded.body == "SharedAccessSignature sr=..."
    reply = codec.encode_message(
        properties={"correlation_id": decoded.properties["message_id"]},
        application_properties={"status-code": Int(202)},
    )
    assert decode_payload(memoryview(reply)).properties.correlation_id == b"cbs-1"


# --- malformed input ---------------------------------------------------------------------------

MALFORMED_VALUES = [
    "",  # nothing
    "ff",  # invalid constructor
    "a1",  # string without length
    "a10561",  # string shorter than declared
    "b0ffffffff00",  # huge binary length
    "d0ffffff00ffffffff",  # huge list size
    "d000000004ffffffff",  # list count larger than its bytes
    "f0000000050fffffff40",  # array of 268M nulls: zero bytes each
    "c1030141",  # map with odd count
    "c102024140",  # map size too small for its entries
    "c0020141 41",  # list size does not cover its element
    "5602",  # boolean byte 2
    "a102ffff",  # invalid utf-8
    "98" + "00" * 15,  # short uuid
    "83000000",  # short timestamp
    "00",  # described without descriptor
    "0053",  # described without value
    "e00301 ff",  # array with invalid element constructor
    "c0" + "0201" * 1 + "c0" * 2000,  # deep nesting
    "45" + "00" * 2000 + "45",  # very deep descriptors
]


@pytest.mark.parametrize("hexdata", MALFORMED_VALUES)
def test_malformed_values_raise_codec_error(hexdata):
    data = bytes.fromhex(hexdata.replace(" ", ""))
    with pytest.raises(CodecError):
        value, end = codec.decode_value(data)
        if end != len(data):
            raise CodecError("trailing bytes")


def test_deep_nesting_raises_codec_error():
    nested = b"\x45"
    for _ in range(200):
        nested = b"\xd0" + struct.pack(">II", len(nested) + 4, 1) + nested
    with pytest.raises(CodecError):
        codec.decode_value(nested)
    with pytest.raises(CodecError):
        codec.decode_value(b"\x00" * 5000 + b"\x40")
    with pytest.raises(CodecError):
        codec.parse_incoming(b"\x00\x53\x75" + b"\x00" * 5000)


def test_malformed_messages_raise_codec_error():
    good = sdk_bytes(
        ServiceBusMessage(
            "hello",
            session_id="s1",
            application_properties={"k": "v"},
            time_to_live=datetime.timedelta(seconds=3),
            scheduled_enqueue_time_utc=datetime.datetime(2030, 1, 1, tzinfo=UTC),
        )
    )
    boundaries = {end for _, _, end in codec.split_sections(good)}
    for cut in range(1, len(good)):
        if cut in boundaries:
            continue
        for parse in (
            codec.parse_incoming,
            codec.split_sections,
            codec.decode_message,
            codec.unpack_batch,
            codec.parse_transfer,
        ):
            with pytest.raises(CodecError):
                parse(good[:cut])
    bad = [
        b"\x01\x53\x70\x45",  # not a described section
        b"\x00\x53\x10\x45",  # not a message section code
        b"\x00\x53\x70\x45\x00\x53\x70\x45",  # two headers
        b"\x00\x53\x75\x41",  # data that is not binary
        b"\x00\x53\x70\xc0\x03\x01\x50\x01",  # durable that is a ubyte
        b"\x00\x53\x73\xc0\x03\x01\x41",  # message-id that is a boolean
        b"\x00\x53\x72\xc1\x03\x02\x41\x41",  # annotation key that is a boolean
        b"\x00\x53\x72\xc1\x05\x02\xa3\x01\x61",  # annotation without value
        b"\x00\x53\x73\xc0\x0d\x0b" + b"\x40" * 10 + b"\x55\x01",  # group-id that is a long
        b"\x00\x54\x70\x45",  # descriptor that is an int
        b"\x00\x53\x73\xc0\xff\x0d",  # properties longer than the payload
    ]
    for payload in bad:
        with pytest.raises(CodecError):
            codec.parse_incoming(payload)


def test_random_corruption_only_ever_raises_codec_error():
    rng = random.Random(20240601)
    seeds = [
        sdk_bytes(
            ServiceBusMessage(
                "hello",
                session_id="s1",
                application_properties={"k": 1},
                partition_key="s1",
                time_to_live=datetime.timedelta(seconds=3),
            )
        ),
        sdk_batch(ServiceBusMessage("a", session_id="s"), ServiceBusMessage("b", session_id="s")),
        codec.encode_message(
            properties={"message_id": U1}, value={"lock-tokens": Array("uuid", [U1])}
        ),
    ]
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            op = rng.random()
            if op < 0.6:
                data[i] = rng.randrange(256)
            elif op < 0.8:
                del data[i]
            else:
                data.insert(i, rng.randrange(256))
        data = bytes(data)
        for fn in (
            codec.parse_incoming,
            codec.decode_message,
            codec.unpack_batch,
            codec.parse_transfer,
            codec.split_sections,
            codec.decode_value,
        ):
            try:
                result = fn(data)
            except CodecError:
                continue
            if fn is codec.parse_incoming:
                # whatever parses can be delivered; decoding the result raises CodecError at most
                delivered = codec.encode_delivery(
                    result.blob, seq=1, enqueued_ms=1, delivery_count=0, dead_letter_reason="r"
                )
                try:
                    codec.decode_message(delivered)
                except CodecError:
                    pass
