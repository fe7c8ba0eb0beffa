"""What Go's azservicebus (on go-amqp) needs of busd's wire, against busd's protocol in memory:
an empty session state read as none, the session of a session receiver taken from its link in
`$management` requests, and the holder's link detached when its session lock is lost on demand
(docs/wire.md §8.4; docs/faults.md)."""

from __future__ import annotations

import time

import pytest
from proton import Delivery, Message, symbol

from busd.broker import faults

pytestmark = pytest.mark.timeout(30)

SEQUENCE = symbol("x-opt-sequence-number")


async def test_an_empty_session_state_is_no_state(client):
    await client.send_to("sessions", Message(body="s", group_id="a"))
    receiver = await client.attach_receiver("sessions", session="a")
    link = {"associated-link-name": receiver.name}
    for state in (b"kept", b""):  # the Go SDK clears a state with an empty binary
        answer = await client.request(
            "sessions", "set-session-state", {"session-id": "a", "session-state": state}, **link
        )
        assert answer.properties["statusCode"] == 200
    answer = await client.request("sessions", "get-session-state", {"session-id": "a"}, **link)
    assert answer.body["session-state"] is None


async def test_management_requests_take_the_session_of_the_associated_link(client):
    await client.send_to(
        "sessions", *(Message(body=f"{g}{i}", group_id=g) for i in range(2) for g in ("a", "b"))
    )
    receiver = await client.attach_receiver("sessions", session="a", credit=2)
    first, second = await receiver.wait_for(2)
    link = {"associated-link-name": receiver.name}
    # no session-id, as the Go SDK asks: the link's session, not the queue's every message
    peeked = await client.request("sessions", "peek-message", {"message-count": 10}, **link)
    bodies = []
    for item in peeked.body["messages"]:
        message = Message()
        message.decode(item["message"])
        bodies.append(message.body)
    assert bodies == ["a0", "a1"]
    await client.dispose(second, Delivery.MODIFIED, failed=True, undeliverable=True)  # defer
    seq = second.annotations[SEQUENCE]
    fetched = await client.request(
        "sessions", "receive-by-sequence-number", {"sequence-numbers": [seq]}, **link
    )
    assert fetched.properties["statusCode"] == 200
    assert len(fetched.body["messages"]) == 1
    assert first.message.body == "a0"


async def test_a_session_lock_lost_on_demand_detaches_its_holder(broker, client):
    await client.send_to("sessions", Message(body="s", group_id="a"))
    receiver = await client.attach_receiver("sessions", session="a", credit=1)
    await receiver.wait_for(1)
    fault = faults.parse(
        {"kind": "session-lock-lost", "entity": "sessions", "session": "a"},
        "sessions",
        int(time.time() * 1000),
    )
    broker.faults.enabled = True  # as `busd serve --faults` starts it
    assert (await broker.faults.add(fault))["released"] is True
    await client.wait(lambda: receiver.closed_by_broker, "the detach of the lost session")
    assert receiver.condition.name == "com.microsoft:session-lock-lost"
