"""Delivery-ids a client numbers out of order or twice on one session (docs/wire.md §5.2):
the transfers are taken, busd's dispositions name the client's own ids, and a stream broken
beyond what a racing client does still ends the connection as before."""

from __future__ import annotations

import struct

import pytest
from proton import Message

from busd.amqp.frames import ID_TOLERANCE, DeliveryIds
from tests.protocol.harness import ProtocolClient

pytestmark = pytest.mark.timeout(30)

_HEAD = struct.Struct(">IBBH")


def rewrite_transfer_ids(data: bytes, new_ids: list[int]) -> bytes:
    """The client's bytes with the delivery-id of each transfer frame replaced by the next of
    `new_ids` (consumed), written as a uint (0x70), as a racing client would number them."""
    out, pos = [], 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            out.append(data[pos : pos + 8])
            pos += 8
            continue
        size, doff, kind, channel = _HEAD.unpack_from(data, pos)
        frame = data[pos : pos + size]
        body = 4 * doff
        if kind == 0 and frame[body : body + 3] == b"\x00\x53\x14" and new_ids:
            assert frame[body + 3] == 0xC0  # proton's list8
            count = frame[body + 5]
            p = body + 6
            p += {0x43: 1, 0x52: 2, 0x70: 5}[frame[p]]  # handle
            id_end = p + {0x43: 1, 0x52: 2, 0x70: 5}[frame[p]]
            fields = (
                frame[body + 6 : p]
                + b"\x70"
                + struct.pack(">I", new_ids.pop(0))
                + frame[id_end : body + 2 + 3 + frame[body + 4]]
            )
            performative = b"\x00\x53\x14\xc0" + bytes((len(fields) + 1, count)) + fields
            rest = frame[body + 5 + frame[body + 4] :]
            frame = (
                _HEAD.pack(body + len(performative) + len(rest), doff, kind, channel)
                + frame[8:body]
                + performative
                + rest
            )
        out.append(frame)
        pos += size
    return b"".join(out)


def tamper(client: ProtocolClient, new_ids: list[int]) -> None:
    real = client.proto.data_received
    client.proto.data_received = lambda data: real(rewrite_transfer_ids(data, new_ids))


def wire_ids(frames) -> list[tuple[int, int]]:
    """(first, last) of busd's dispositions about the client's transfers, in order."""
    found = []
    for f in frames:
        first = int(f.text.split("first=")[1].split(",")[0], 16)
        last = int(f.text.split("last=")[1].split(",")[0], 16) if "last=" in f.text else first
        found.append((first, last))
    return found


async def received_bodies(client: ProtocolClient, entity: str, count: int) -> list[str]:
    receiver = await client.attach_receiver(entity, receive_and_delete=True, credit=count)
    items = await receiver.wait_for(count)
    await client.detach(receiver)
    return [i.message.body for i in items]


async def test_transfers_numbered_out_of_order_and_twice_are_taken(client):
    sender = await client.attach_sender("plain")
    await client.send(sender, Message(body="first"))  # fixes the session's starting id
    base = int(
        [f for f in client.frames if not f.incoming and f.performative == "transfer"][-1]
        .text.split("delivery-id=")[1]
        .split(",")[0],
        16,
    )
    mark = len(client.frames)
    # swapped, then twice the same: what the SDK's two threads produce
    tamper(client, [base + 2, base + 1, base + 3, base + 3])
    deliveries = [client.transfer(sender, Message(body=f"m{i}")) for i in range(4)]
    await client.wait(
        lambda: len(client.dispositions(mark, by_sender=False)) >= 3 or sender.closed_by_broker,
        "the dispositions",
    )
    await client.settle_down()
    assert not sender.closed_by_broker and not client.sock.closed
    answered = wire_ids(client.dispositions(mark, by_sender=False))
    ids = sorted(i for first, last in answered for i in range(first, last + 1))
    # every disposition names an id the client used; base+3 answers both of its transfers
    assert set(ids) == {base + 1, base + 2, base + 3}
    assert deliveries
    assert sorted(await received_bodies(client, "plain", 5)) == ["first", "m0", "m1", "m2", "m3"]


async def test_an_id_far_off_still_ends_the_connection(client):
    sender = await client.attach_sender("plain")
    await client.send(sender, Message(body="first"))
    base = int(
        [f for f in client.frames if not f.incoming and f.performative == "transfer"][-1]
        .text.split("delivery-id=")[1]
        .split(",")[0],
        16,
    )
    tamper(client, [base + 1 + ID_TOLERANCE + 1])
    client.transfer(sender, Message(body="corrupt"))
    await client.wait(lambda: client.sock.closed, "the connection's end")
    (close,) = (
        client.frames_of("close")
        if hasattr(client, "frames_of")
        else [f for f in client.frames if f.incoming and f.performative == "close"]
    )
    assert "amqp:session:invalid-field" in close.text and "sequencing error" in close.text


def test_the_stream_may_arrive_in_any_split():
    """The same bytes fed whole and one byte at a time come out the same."""
    transfer = bytes.fromhex("0053 14 c0 0c 05 43 70 00000007 a0 01 74 43 42".replace(" ", ""))
    begin = bytes.fromhex("0053 11 c0 0b 04 40 43 70 00000064 70 00000064".replace(" ", ""))

    def frame(performative: bytes, payload: bytes = b"", channel: int = 0) -> bytes:
        return (
            _HEAD.pack(8 + len(performative) + len(payload), 2, 0, channel) + performative + payload
        )

    stream = (
        b"AMQP\x00\x01\x00\x00"
        + frame(begin)
        + frame(transfer, b"\x00\x53\x77\xa1\x01x" * 50)
        + frame(transfer.replace(b"\x70\x00\x00\x00\x07", b"\x70\x00\x00\x00\x09"))
        + frame(transfer.replace(b"\x70\x00\x00\x00\x07", b"\x70\x00\x00\x00\x08"))
    )
    whole = DeliveryIds().incoming(stream)
    split = DeliveryIds()
    pieces = b"".join(split.incoming(stream[i : i + 1]) for i in range(len(stream)))
    assert pieces == whole
    assert whole != stream  # 9 then 8 after 7: renumbered 8 then 9
    # the third and fourth transfers (ids 9, 8) are now 8 and 9: busd writes the smallest uint
    assert whole.index(b"\x43\x52\x08") < whole.index(b"\x43\x52\x09")
