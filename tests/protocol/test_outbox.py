"""A receiver link's outbox (busd/broker/links/outbox.py, docs/design.md §3.5), against busd's
protocol in memory: what the session accept took, the link's own fetch and what sends hand
over go out in the session's order within the credit; what does not fit goes back first; a
drain is answered after one more look; a link that goes while a send hands it messages sends
none of them, and they come back to the session uncounted. Sends hand over before the first
credit and while the link's own fetch runs; an offered holder is not woken, it looks again
itself."""

from __future__ import annotations

import asyncio

import pytest
from proton import Message

from tests.protocol.harness import SEQUENCE_NUMBER, ProtocolClient, StoreCalls

pytestmark = pytest.mark.timeout(30)

CALLS = ("accept_session", "receive_session", "send", "send_handing_over", "settle")


class Gate:
    """Holds the answers of a store method: the real call runs at once (its effect is in the
    store), its answer reaches the broker only once the gate opens."""

    def __init__(self, store, name: str) -> None:
        self.opened = asyncio.Event()
        self.entered = 0
        method = getattr(store, name)

        async def call(*args, **kwargs):
            result = await method(*args, **kwargs)
            self.entered += 1
            await self.opened.wait()
            return result

        setattr(store, name, call)

    async def reached(self, client: ProtocolClient, count: int = 1) -> None:
        await client.wait(lambda: self.entered >= count, "the gated store call")


def bodies(handle) -> list[str]:
    return [r.message.body for r in handle.received]


def seqs(handle) -> list[int]:
    return [r.annotations[SEQUENCE_NUMBER] for r in handle.received]


async def learn_first_credit(client: ProtocolClient, credit: int) -> None:
    """A session receiver of this connection that first granted `credit`: the connection's
    next accept takes that many before its client grants any (docs/wire.md §6.5)."""
    await client.send_to("sessions", Message(body="teach", group_id="teach"))
    teacher = await client.attach_receiver("sessions", session="teach")
    teacher.flow(credit)
    await teacher.wait_for(1)
    await client.detach(teacher)


async def test_the_three_producers_go_out_in_the_session_s_order(broker, connect, client):
    producer = await connect()
    await producer.authorize("sessions")
    await learn_first_credit(client, 2)
    await producer.send_to("sessions", *(Message(body=f"a{i}", group_id="a") for i in range(3)))
    calls = StoreCalls(broker.store, *CALLS)

    # 1. the accept takes a0 and a1 before any credit, and holds them
    receiver = await client.attach_receiver("sessions", session="a")
    await client.settle_down(0.05)
    assert receiver.received == []
    # a send meanwhile is not handed over (it would overtake them): it is filed
    await producer.send_to("sessions", Message(body="a3", group_id="a"))
    assert (calls.counts["send"], calls.counts["send_handing_over"]) == (1, 0)

    # 2. the credit comes: the held two go out, then the link's own fetch takes a2 and a3
    receiver.flow(10)
    await receiver.wait_for(4)
    await client.settle_down(0.05)
    assert calls.counts["receive_session"] == 1

    # 3. the link is dry with credit: the next sends hand their messages over
    await producer.send_to("sessions", Message(body="a4", group_id="a"))
    await producer.send_to("sessions", Message(body="a5", group_id="a"))
    await receiver.wait_for(6)
    await client.settle_down(0.05)
    assert calls.counts["send_handing_over"] == 2
    assert calls.counts["receive_session"] == 1  # no wake-up, no fetch
    assert bodies(receiver) == [f"a{i}" for i in range(6)]
    assert seqs(receiver) == sorted(seqs(receiver)) and len(set(seqs(receiver))) == 6
    assert calls.counts["settle"] == 0  # nothing had to go back
    assert [r.message.delivery_count for r in receiver.received] == [0] * 6


async def test_credit_bounds_a_hand_over_and_a_drain_is_answered_after_one_more_look(
    broker, connect, client
):
    producer = await connect()
    await producer.authorize("sessions")
    receiver = await client.attach_receiver("sessions", session="b", credit=2)
    await client.settle_down(0.05)  # the accept found nothing: the link is dry
    calls = StoreCalls(broker.store, *CALLS)

    # one send of three: the offer takes what the credit allows, the third is filed
    await producer.send_to("sessions", *(Message(body=f"b{i}", group_id="b") for i in range(3)))
    await receiver.wait_for(2)
    await client.settle_down(0.1)
    assert bodies(receiver) == ["b0", "b1"]
    assert receiver.link.credit == 0
    assert (calls.counts["send_handing_over"], calls.counts["receive_session"]) == (1, 0)

    # the filed one woke the link; with credit it fetches it
    receiver.flow(1)
    await receiver.wait_for(3)
    assert bodies(receiver) == ["b0", "b1", "b2"]
    assert calls.counts["receive_session"] == 1

    # credit exhausted again; a drain on a dry link looks once more, then is answered
    receiver.drain(5)
    await client.wait(lambda: not receiver.link.draining(), "the drained flow")
    assert receiver.frames("flow")[-1].has("link-credit=0x0,", "drain=true")
    assert calls.counts["receive_session"] == 2
    # dry now, and still a drain looks once more: a message whose wake-up is on its way from
    # another process is not missed
    receiver.drain(5)
    await client.wait(lambda: not receiver.link.draining(), "the second drained flow")
    assert calls.counts["receive_session"] == 3
    assert len(receiver.received) == 3
    assert calls.counts["settle"] == 0


async def test_what_does_not_fit_goes_back_before_anything_else_is_taken(broker, client):
    await learn_first_credit(client, 3)
    await client.send_to("sessions", *(Message(body=f"c{i}", group_id="c") for i in range(3)))
    calls = StoreCalls(broker.store, *CALLS)
    receiver = await client.attach_receiver("sessions", session="c")  # takes c0..c2
    await client.settle_down(0.05)
    await client.send_to("sessions", Message(body="c3", group_id="c"))
    await client.send_to("sessions", Message(body="c4", group_id="c"))
    receiver.flow(1)  # less than was taken: c1 and c2 go back in one call
    await receiver.wait_for(1)
    await client.wait(lambda: calls.counts["settle"] == 1, "the give-back")
    await client.settle_down(0.05)
    assert bodies(receiver) == ["c0"]
    receiver.flow(10)
    await receiver.wait_for(5)
    await client.settle_down(0.05)
    assert bodies(receiver) == ["c0", "c1", "c2", "c3", "c4"]
    assert seqs(receiver) == sorted(seqs(receiver))
    # what went back was never delivered: no attempt counted
    assert [r.message.delivery_count for r in receiver.received] == [0] * 5
    assert calls.counts["send_handing_over"] == 0  # held messages let no send overtake them
    assert calls.counts["settle"] == 1


async def test_a_link_closed_mid_hand_over_sends_nothing_and_the_session_gets_it_back(
    broker, connect, client
):
    producer = await connect()
    await producer.authorize("sessions")
    sender = await producer.attach_sender("sessions")
    receiver = await client.attach_receiver("sessions", session="d", credit=5)
    await client.settle_down(0.05)
    held = broker.receivers.holding("sessions", "d")
    assert held is not None

    # The send reaches the broker, which offers it to the holder and calls the store ...
    delivery = producer.transfer(sender, Message(body="d0", group_id="d"))
    producer.pump()
    for _ in range(1000):
        if held.outbox.under_way:
            break
        await asyncio.sleep(0)
    assert held.outbox.under_way == 1, "the send made no offer"
    # ... and the link goes before the store answers.
    receiver.link.close()
    client.pump()
    await producer.wait(lambda: delivery.settled, "the send's outcome")
    await client.wait(lambda: receiver.closed_by_broker, "the detach")
    await client.settle_down(0.1)
    assert receiver.received == []
    assert broker.receivers.holding("sessions", "d") is None

    # The session's release returned it (handed over or filed, never delivered): uncounted.
    again = await client.attach_receiver("sessions", session="d", credit=5)
    (item,) = await again.wait_for(1)
    assert item.message.body == "d0"
    assert item.message.delivery_count == 0


async def test_a_send_before_the_first_credit_joins_the_accept_s_messages(broker, connect, client):
    producer = await connect()
    await producer.authorize("sessions")
    await learn_first_credit(client, 3)
    await producer.send_to("sessions", Message(body="e0", group_id="e"))
    calls = StoreCalls(broker.store, *CALLS)
    receiver = await client.attach_receiver("sessions", session="e")  # takes e0 of 3 expected
    await client.settle_down(0.05)
    # offered 3 - 1: e1 and e2 are handed over and wait with e0; e3 is filed
    await producer.send_to("sessions", *(Message(body=f"e{i}", group_id="e") for i in (1, 2, 3)))
    await client.settle_down(0.05)
    assert receiver.received == []
    assert calls.counts["send_handing_over"] == 1
    receiver.flow(10)
    await receiver.wait_for(4)
    await client.settle_down(0.05)
    assert bodies(receiver) == ["e0", "e1", "e2", "e3"]
    assert calls.counts["receive_session"] == 1  # e3 only: e1 and e2 needed none
    assert calls.counts["settle"] == 0
    assert [r.message.delivery_count for r in receiver.received] == [0] * 4


async def test_the_first_credit_sends_the_accept_s_messages_while_a_hand_over_is_under_way(
    broker, connect, client
):
    producer = await connect()
    await producer.authorize("sessions")
    await learn_first_credit(client, 3)
    await producer.send_to("sessions", Message(body="f0", group_id="f"))
    receiver = await client.attach_receiver("sessions", session="f")  # takes f0
    await client.settle_down(0.05)
    calls = StoreCalls(broker.store, *CALLS)
    gate = Gate(broker.store, "send_handing_over")
    sending = asyncio.ensure_future(producer.send_to("sessions", Message(body="f1", group_id="f")))
    await gate.reached(client)  # f1 is handed over; the broker has not heard yet
    receiver.flow(5)
    await receiver.wait_for(1)  # f0 goes with the credit, not after the send
    assert bodies(receiver) == ["f0"]
    gate.opened.set()
    await sending
    await receiver.wait_for(2)
    await client.settle_down(0.05)
    assert bodies(receiver) == ["f0", "f1"]
    assert (calls.counts["receive_session"], calls.counts["settle"]) == (0, 0)


async def test_a_send_during_the_link_s_fetch_is_handed_over_and_merged_in_order(
    broker, connect, client
):
    producer = await connect()
    await producer.authorize("sessions")
    receiver = await client.attach_receiver("sessions", session="g", credit=0)
    await client.settle_down(0.05)
    await producer.send_to("sessions", *(Message(body=f"g{i}", group_id="g") for i in range(2)))
    calls = StoreCalls(broker.store, *CALLS)
    gate = Gate(broker.store, "receive_session")
    receiver.flow(5)
    await gate.reached(client)  # the fetch took g0 and g1; its answer is on its way
    await producer.send_to("sessions", Message(body="g2", group_id="g"))
    assert calls.counts["send_handing_over"] == 1  # offered while the fetch runs
    gate.opened.set()
    await receiver.wait_for(3)
    await client.settle_down(0.05)
    assert bodies(receiver) == ["g0", "g1", "g2"]
    assert seqs(receiver) == sorted(seqs(receiver))
    # g2 was handed over: no wake-up, no second fetch, nothing given back
    assert (calls.counts["receive_session"], calls.counts["settle"]) == (1, 0)


async def test_what_a_fetch_and_a_hand_over_bring_beyond_the_credit_goes_back_in_order(
    broker, connect, client
):
    producer = await connect()
    await producer.authorize("sessions")
    receiver = await client.attach_receiver("sessions", session="h", credit=0)
    await client.settle_down(0.05)
    await producer.send_to("sessions", *(Message(body=f"h{i}", group_id="h") for i in range(2)))
    calls = StoreCalls(broker.store, *CALLS)
    gate = Gate(broker.store, "receive_session")
    receiver.flow(2)
    await gate.reached(client)  # the fetch took h0 and h1
    await producer.send_to("sessions", Message(body="h2", group_id="h"))  # handed over too
    # something of the round came back (h2): it closes, and the next send is filed
    await producer.send_to("sessions", Message(body="h3", group_id="h"))
    assert (calls.counts["send_handing_over"], calls.counts["send"]) == (1, 1)
    gate.opened.set()
    await receiver.wait_for(2)
    await client.wait(lambda: calls.counts["settle"] == 1, "the give-back")
    await client.settle_down(0.05)
    assert bodies(receiver) == ["h0", "h1"]  # the credit's worth, in order; h2 went back
    receiver.flow(5)
    await receiver.wait_for(4)
    await client.settle_down(0.05)
    assert bodies(receiver) == ["h0", "h1", "h2", "h3"]
    assert [r.message.delivery_count for r in receiver.received] == [0] * 4
    assert calls.counts["settle"] == 1


async def test_an_offered_holder_is_not_woken_and_looks_again_itself(broker, connect, client):
    producer = await connect()
    await producer.authorize("sessions")
    receiver = await client.attach_receiver("sessions", session="k", credit=1)
    await client.settle_down(0.05)  # dry, with credit 1
    held = broker.receivers.holding("sessions", "k")
    assert held is not None
    woken = []
    broker.receivers.listen(held.holder, lambda: (woken.append(1), held.wake()))
    calls = StoreCalls(broker.store, *CALLS)
    # one send of two: k0 is handed over (the credit's worth), k1 is filed for the holder
    await producer.send_to("sessions", *(Message(body=f"k{i}", group_id="k") for i in range(2)))
    await receiver.wait_for(1)
    await client.settle_down(0.1)
    assert woken == []  # no wake-up from the store
    assert calls.counts["receive_session"] == 0  # no credit left to look with
    receiver.flow(1)  # not dry: it looks, and finds k1
    await receiver.wait_for(2)
    assert bodies(receiver) == ["k0", "k1"]
    assert calls.counts["receive_session"] == 1
