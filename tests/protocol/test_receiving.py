"""Client receiver links: credit, drain, the delivered message and its delivery tag
(docs/wire.md §6.1–§6.4), against busd's protocol in memory."""

from __future__ import annotations

import time
import uuid

import pytest
from proton import Message, symbol

from tests.protocol.harness import (
    ENQUEUED_TIME,
    LOCKED_UNTIL,
    SEQUENCE_NUMBER,
    ProtocolClient,
    token_of_tag,
    uuid_array,
)

pytestmark = pytest.mark.timeout(30)

HEADER = b"\x00\x53\x70"  # header section descriptor [3.2.1]


async def test_receiver_gets_at_most_its_credit(client: ProtocolClient):
    await client.send_to("plain", *(Message(body=f"m{i}") for i in range(5)))
    receiver = await client.attach_receiver("plain", credit=2)
    await receiver.wait_for(2)
    await client.settle_down(0.15)  # time for more to arrive, were busd to send them
    assert [r.message.body for r in receiver.received] == ["m0", "m1"]
    assert len(receiver.frames("transfer")) == 2
    receiver.flow(3)
    await receiver.wait_for(5)
    await client.settle_down(0.05)
    assert [r.message.body for r in receiver.received] == [f"m{i}" for i in range(5)]


async def test_credit_left_waits_for_a_message_sent_later(connect, client):
    receiver = await client.attach_receiver("plain", credit=3)
    await client.settle_down(0.05)
    assert receiver.received == []
    # Sent on another connection: the waiting link is woken by the store (design §3.5).
    producer = await connect()
    await producer.authorize("plain")
    await producer.send_to("plain", Message(body="late"))
    (got,) = await receiver.wait_for(1)
    assert got.message.body == "late"
    assert receiver.link.credit == 2  # the rest stays granted (docs/wire.md §6.2)


async def test_drain_sends_what_there_is_then_a_drained_flow(client):
    await client.send_to("plain", Message(body="a"), Message(body="b"))
    receiver = await client.attach_receiver("plain")
    receiver.drain(5)
    await client.wait(lambda: not receiver.link.draining(), "the drained flow")
    assert [r.message.body for r in receiver.received] == ["a", "b"]
    # docs/wire.md §6.2: the delivery-count advanced by the unused credit, credit 0.
    drained = receiver.frames("flow")[-1]
    assert drained.has("delivery-count=0x5,", "link-credit=0x0,", "drain=true")
    assert receiver.link.credit == 0
    # Drain on an empty queue answers at once.
    receiver.drain(4)
    await client.wait(lambda: not receiver.link.draining(), "the second drained flow")
    assert len(receiver.received) == 2
    assert receiver.frames("flow")[-1].has("delivery-count=0x9,", "link-credit=0x0,")


async def test_peek_lock_delivery_annotations_and_header(client):
    before_ms = time.time() * 1000
    await client.send_to(
        "plain", Message(body="one", annotations={"x-user": "kept"}), Message(body="two")
    )
    receiver = await client.attach_receiver("plain", credit=2)
    first, second = await receiver.wait_for(2)
    after_ms = time.time() * 1000
    for item in (first, second):
        annotations = item.annotations
        assert not item.delivery.settled  # peek-lock: sent unsettled (docs/wire.md §6.1)
        # docs/wire.md §6.3: long, timestamp, timestamp
        assert type(annotations[SEQUENCE_NUMBER]) is int
        enqueued = annotations[ENQUEUED_TIME]
        assert type(enqueued).__name__ == "timestamp"
        assert before_ms - 2000 <= enqueued <= after_ms + 2000
        locked_until = annotations[LOCKED_UNTIL]
        assert type(locked_until).__name__ == "timestamp"
        assert locked_until > after_ms  # a 60 s lock
        assert locked_until <= after_ms + 60_000 + 2000
        assert item.message.delivery_count == 0
        # The header carries all five fields, delivery-count 0 written (list8, count 5).
        start = item.payload.index(HEADER)
        assert item.payload[start + 3] == 0xC0 and item.payload[start + 5] == 5
    assert second.annotations[SEQUENCE_NUMBER] == first.annotations[SEQUENCE_NUMBER] + 1
    assert first.annotations[symbol("x-user")] == "kept"
    assert first.message.body == "one"


async def test_delivery_tag_is_the_lock_token_in_dotnet_guid_order(client):
    await client.send_to("plain", Message(body="tagged"))
    receiver = await client.attach_receiver("plain", credit=1)
    (item,) = await receiver.wait_for(1)
    tag = item.tag
    assert len(tag) == 16
    token = token_of_tag(tag)  # docs/wire.md §6.4: uuid.UUID(bytes_le=tag)
    # In $management the token travels in RFC order: renewing it proves it is the live lock.
    renewed = await client.request("plain", "renew-lock", {"lock-tokens": uuid_array([token])})
    assert renewed.properties["statusCode"] == 200
    (expiration,) = renewed.body["expirations"].elements
    assert expiration > time.time() * 1000
    # The same 16 bytes read in RFC order name no lock (unless symmetric in layout).
    as_rfc = uuid.UUID(bytes=tag)
    if as_rfc != token:
        refused = await client.request("plain", "renew-lock", {"lock-tokens": uuid_array([as_rfc])})
        assert refused.properties["statusCode"] == 410
        assert refused.properties["errorCondition"] == "com.microsoft:message-lock-lost"


async def test_receive_and_delete_deliveries_are_settled_without_lock(client):
    await client.send_to("plain", Message(body="x"), Message(body="y"))
    receiver = await client.attach_receiver("plain", receive_and_delete=True, credit=5)
    items = await receiver.wait_for(2)
    assert [i.message.body for i in items] == ["x", "y"]
    for item in items:
        assert item.delivery.settled  # sent settled (docs/wire.md §6.1)
        assert LOCKED_UNTIL not in item.annotations
        assert SEQUENCE_NUMBER in item.annotations
        assert item.tag == b"\x00"  # one byte: a tag proton-j can take (docs/wire.md §6.4)
    # Deleted when taken: a peek finds nothing.
    peeked = await client.request("plain", "peek-message", {"message-count": 10})
    assert peeked.properties["statusCode"] == 204


@pytest.mark.parametrize("entity", ["plain", "sessions"])
@pytest.mark.parametrize("credit", [5, 2**31 - 1, 2**31, 2**32 - 1])
async def test_any_credit_delivers_what_is_waiting(
    client: ProtocolClient, credit: int, entity: str
):
    """Link credit is an AMQP uint [2.7.4]: any amount up to 2^32-1 delivers, to a queue
    receiver and a session receiver, and a drain on it is answered (docs/wire.md §6.2)."""
    session = "big-credit" if entity == "sessions" else None
    await client.send_to(entity, *(Message(body=f"m{i}", group_id=session) for i in range(300)))
    receiver = await client.attach_receiver(entity, session=session, wait=False)
    receiver.flow(credit - 2**32 if credit >= 2**31 else credit)  # proton takes an int
    expected = min(credit, 300)
    await receiver.wait_for(expected, timeout=10)
    await client.settle_down(0.05)
    assert receiver.frames("flow", incoming=False)[0].has(f"link-credit={credit:#x}")
    assert [r.message.body for r in receiver.received] == [f"m{i}" for i in range(expected)]
    if credit == expected:
        return
    # A message sent later still arrives on the credit left, and a drain ends it.
    await client.send_to(entity, Message(body="later", group_id=session))
    await receiver.wait_for(expected + 1)
    assert receiver.received[-1].message.body == "later"
    receiver.drain(0)
    await client.wait(
        lambda: any(f.has("drain=true", "link-credit=0x0,") for f in receiver.frames("flow")),
        "the drained flow",
    )
