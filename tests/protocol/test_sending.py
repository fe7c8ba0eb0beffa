"""Client sender links: credit and the outcome of each transfer (docs/wire.md §5), against
busd's protocol in memory. What was accepted is checked by receiving it back."""

from __future__ import annotations

import re

import pytest
from proton import Delivery, Message

from tests.protocol.harness import SEQUENCE_NUMBER, TRACKING_ID, ProtocolClient

pytestmark = pytest.mark.timeout(30)


def assert_rejected(delivery: Delivery, condition: str) -> None:
    """docs/wire.md §5.4: settled, rejected, with the three-field error of §9.4."""
    assert delivery.settled
    assert delivery.remote_state == Delivery.REJECTED
    cond = delivery.remote.condition
    assert cond is not None and cond.name == condition
    assert cond.description
    assert cond.info == {TRACKING_ID: "busd"}


async def drain_all(client: ProtocolClient, entity: str, credit: int = 50) -> list:
    """Everything receivable on `entity`, taken in receive-and-delete mode: one drain."""
    receiver = await client.attach_receiver(entity, receive_and_delete=True)
    receiver.drain(credit)
    await client.wait(lambda: not receiver.link.draining(), f"the drain of {entity}")
    await client.detach(receiver)
    return receiver.received


async def test_good_transfer_is_accepted_settled_and_stored(client):
    sender = await client.attach_sender("plain")
    message = Message(id="m-1", body="hello", properties={"k": "v"}, subject="greeting")
    mark = len(client.frames)
    (delivery,) = await client.send(sender, message)
    assert delivery.settled and delivery.remote_state == Delivery.ACCEPTED
    # One disposition, role=receiver, settled, accepted (docs/wire.md §5.4).
    (disposition,) = client.dispositions(mark, by_sender=False)
    assert disposition.has("role=true", "settled=true", "@accepted(36)")
    (got,) = await drain_all(client, "plain")
    assert got.message.body == "hello"
    assert got.message.id == "m-1"
    assert got.message.subject == "greeting"
    assert got.message.properties == {"k": "v"}


async def test_pre_settled_transfers_are_stored_too(client):
    sender = await client.attach_sender("plain")
    client.transfer(sender, Message(body="fire and forget"), settled=True)
    (confirmed,) = await client.send(sender, Message(body="confirmed"))
    assert confirmed.remote_state == Delivery.ACCEPTED
    got = await drain_all(client, "plain")
    assert [r.message.body for r in got] == ["fire and forget", "confirmed"]


def batch(*messages: Message) -> bytes:
    """A Service Bus batch envelope (docs/wire.md §5.2): the first message's id in its
    properties, then one data section per message holding the whole encoded message."""
    envelope = bytes(Message(id=messages[0].id).encode())
    for message in messages:
        inner = bytes(message.encode())
        envelope += b"\x00\x53\x75\xb0" + len(inner).to_bytes(4, "big") + inner
    return envelope


async def test_a_batch_is_one_delivery_answered_once_and_stored_as_its_messages(client):
    sender = await client.attach_sender("plain")
    mark = len(client.frames)
    (delivery,) = await client.send(
        sender, batch(*(Message(id=f"b{i}", body=f"in batch {i}") for i in range(3)))
    )
    assert delivery.remote_state == Delivery.ACCEPTED
    assert len(client.dispositions(mark, by_sender=False)) == 1
    got = await drain_all(client, "plain")
    assert [(r.message.id, r.message.body) for r in got] == [
        (f"b{i}", f"in batch {i}") for i in range(3)
    ]
    seqs = [r.annotations[SEQUENCE_NUMBER] for r in got]
    assert seqs == list(range(seqs[0], seqs[0] + 3))  # each its own number


async def test_message_over_the_queue_size_is_rejected_and_not_stored(client):
    sender = await client.attach_sender("small")  # max message size 1024
    fits = Message(body=b"x" * 900)
    too_big = Message(body=b"x" * 2000)
    small_ok, big = await client.send(sender, fits, too_big)
    assert small_ok.remote_state == Delivery.ACCEPTED
    assert_rejected(big, "amqp:link:message-size-exceeded")
    assert not sender.closed_by_broker  # the link goes on
    got = await drain_all(client, "small")
    assert [len(r.message.body) for r in got] == [900]


async def test_malformed_and_sessionless_messages_are_rejected_with_their_conditions(client):
    sender = await client.attach_sender("plain")
    # A properties section (00 53 73) twice: malformed (docs/wire.md §5.3).
    twice = Message(id="a").encode() + Message(id="b", body="x").encode()
    (malformed,) = await client.send(sender, bytes(twice))
    assert_rejected(malformed, "amqp:decode-error")
    to_sessions = await client.attach_sender("sessions")
    no_session, long_id, fine = await client.send(
        to_sessions,
        Message(body="no group"),
        Message(body="long", group_id="s" * 129),
        Message(body="ok", group_id="g"),
    )
    assert_rejected(no_session, "amqp:not-allowed")
    assert_rejected(long_id, "com.microsoft:argument-out-of-range")
    assert fine.remote_state == Delivery.ACCEPTED
    assert await drain_all(client, "plain") == []


async def test_large_messages_span_frames_both_ways(client):
    """A message larger than either side's max-frame-size is split into several transfer
    frames by the client and by busd (docs/wire.md §1.3, §5.2), and reassembled intact."""
    body = bytes(range(256)) * 1600  # 400 KiB: more than busd's 256 KiB frames
    sender = await client.attach_sender("plain")
    (delivery,) = await client.send(sender, Message(body=body))
    assert delivery.remote_state == Delivery.ACCEPTED
    assert len(sender.frames("transfer", incoming=False)) > 1
    receiver = await client.attach_receiver("plain", receive_and_delete=True, credit=1)
    (got,) = await receiver.wait_for(1)
    assert got.message.body == body
    assert len(receiver.frames("transfer")) > 1  # our max-frame-size is proton's 32 KiB


async def test_credit_is_topped_up_below_half_the_window(client):
    sender = await client.attach_sender("plain")
    assert sender.link.credit == 1000
    deliveries = await client.send(sender, *(Message(body=i) for i in range(600)))
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}
    # Below 500 the broker flows the window back up to 1000 (docs/wire.md §5.1).
    await client.wait(lambda: sender.link.credit >= 900, "the credit top-up")
    assert len(sender.frames("flow")) >= 2


_FLOW = re.compile(r"delivery-count=(\w+), link-credit=(\w+)")  # proton prints them in hex
_SETTLED_RANGE = re.compile(r"role=true, first=(\w+)(?:, last=(\w+))?")


async def test_credit_never_outruns_the_store(client):
    # 900 transfers in one write: more than half the window, none answered yet. The broker
    # must not top the credit up for transfers still waiting for the store, or a fast sender
    # piles up unbounded work (docs/wire.md §5.1). Walk the broker's frames in order: at
    # every flow, what it permits minus what it answered stays within the window.
    sender = await client.attach_sender("plain")
    first = len(client.frames)
    deliveries = await client.send(sender, *(Message(body=i) for i in range(900)))
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}
    await client.wait(lambda: sender.link.credit >= 500, "the credit top-up")
    frames = [f for f in client.frames[first:] if f.incoming]

    def settled(frame) -> int:
        m = _SETTLED_RANGE.search(frame.text) if frame.performative == "disposition" else None
        return int(m.group(2) or m.group(1), 0) - int(m.group(1), 0) + 1 if m else 0

    answered, flows = 0, 0
    for i, frame in enumerate(frames):
        answered += settled(frame)
        if frame.performative == "flow" and (m := _FLOW.search(frame.text)):
            flows += 1
            permitted = int(m.group(1), 0) + int(m.group(2), 0)
            # proton writes a flow ahead of the dispositions produced in the same step
            batch = 0
            for later in frames[i + 1 :]:
                if later.performative != "disposition":
                    break
                batch += settled(later)
            assert permitted - (answered + batch) <= 1000, (frame.text, answered + batch)
    assert answered == 900 and flows >= 1
