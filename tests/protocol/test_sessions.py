"""Session receivers (docs/wire.md §4.2, §4.3, §6.5), against busd's protocol in memory: the
attach is answered once the session is locked, with the session id in the source filter and
the lock expiry in .NET ticks; refusals carry the session conditions."""

from __future__ import annotations

import asyncio
import time

import pytest
from proton import Delivery, Described, Message, symbol, uint, ulong

from tests.protocol.harness import (
    LOCKED_UNTIL,
    LOCKED_UNTIL_UTC,
    NEXT_AVAILABLE,
    SESSION_FILTER,
    TIMEOUT,
    TRACKING_ID,
    ProtocolClient,
    StoreCalls,
    is_null,
    ticks_to_unix,
)

pytestmark = pytest.mark.timeout(30)


async def fill(client: ProtocolClient, entity: str = "sessions") -> None:
    """Three messages in each of the sessions "a" and "b", interleaved ("a" first)."""
    await client.send_to(
        entity, *(Message(body=f"{g}{i}", group_id=g) for i in range(3) for g in ("a", "b"))
    )


async def test_specific_session_attach_echoes_the_filter_and_lock_expiry(client):
    await fill(client)
    before = time.time()
    receiver = await client.attach_receiver("sessions", session="b", credit=10)
    after = time.time()
    assert not receiver.closed_by_broker
    assert receiver.link.remote_source.address == "sessions"
    assert receiver.remote_filter == {SESSION_FILTER: "b"}
    ticks = receiver.remote_properties[LOCKED_UNTIL_UTC]
    assert type(ticks) is int  # long (docs/wire.md §4.2)
    # LockDuration is 10 s: ticks are 100 ns units since 0001-01-01
    assert before + 9 <= ticks_to_unix(ticks) <= after + 11
    items = await receiver.wait_for(3)
    await client.settle_down(0.05)
    assert [i.message.body for i in receiver.received] == ["b0", "b1", "b2"]
    # A session message's x-opt-locked-until is the session lock's expiry (§6.3).
    for item in items:
        assert item.message.group_id == "b"
        assert abs(item.annotations[LOCKED_UNTIL] / 1000 - ticks_to_unix(ticks)) < 0.01


async def test_next_available_attach_answers_the_locked_session_id_as_sent(client):
    """The answer's filter replaces the client's null with the locked id, character for
    character (UTF-8 beyond ASCII), and carries nothing else."""
    session = "café-☕-会话"
    await client.send_to("sessions", Message(body="x", group_id=session))
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(2000)}, credit=1
    )
    assert not receiver.closed_by_broker
    assert receiver.remote_filter == {SESSION_FILTER: session}
    assert list(receiver.remote_properties) == [LOCKED_UNTIL_UTC]
    items = await receiver.wait_for(1)
    assert items[0].message.group_id == session


async def test_next_available_takes_the_oldest_free_session(client):
    await fill(client)
    first = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(2000)}, credit=5
    )
    assert first.remote_filter == {SESSION_FILTER: "a"}  # its oldest message is older
    assert ticks_to_unix(first.remote_properties[LOCKED_UNTIL_UTC]) > time.time()
    second = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(2000)}, credit=5
    )
    assert second.remote_filter == {SESSION_FILTER: "b"}  # "a" is held
    a_items, b_items = await first.wait_for(3), await second.wait_for(3)
    assert [i.message.body for i in a_items] == ["a0", "a1", "a2"]
    assert [i.message.body for i in b_items] == ["b0", "b1", "b2"]


async def test_described_and_binary_filter_values_name_a_session(client):
    await fill(client)
    described = await client.attach_receiver(
        "sessions", filter={SESSION_FILTER: Described(symbol("x"), "a")}
    )
    # described in, described back (go-amqp reads no other kind), with the client's descriptor
    assert described.remote_filter == {SESSION_FILTER: Described(symbol("x"), "a")}
    binary = await client.attach_receiver("sessions", filter={SESSION_FILTER: b"b"})
    assert binary.remote_filter == {SESSION_FILTER: "b"}


async def test_a_described_next_available_filter_is_answered_described(client):
    """As go-amqp (so Go's SDK) asks: the filter described by its numeric code, value null;
    the answer names the session in a value described by the same code."""
    await fill(client)
    code = ulong(0x0000013700000C)
    receiver = await client.attach_receiver(
        "sessions", filter={SESSION_FILTER: Described(code, None)}
    )
    assert receiver.remote_filter == {SESSION_FILTER: Described(code, "a")}


async def test_next_available_with_no_session_is_refused_after_its_timeout(client):
    started = time.monotonic()
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(300)}
    )
    waited = time.monotonic() - started
    assert 0.25 <= waited < 3
    # Refused as any link (docs/wire.md §4.3): null source, detach with the condition.
    assert is_null(receiver.link.remote_source)
    (attach,) = receiver.frames("attach")
    assert "source=" not in attach.text
    (detach,) = receiver.frames("detach")
    assert detach.has("closed=true")
    assert receiver.condition.name == "com.microsoft:timeout"
    assert receiver.condition.info == {TRACKING_ID: "busd"}


async def test_next_available_is_answered_when_a_session_gets_a_message(connect, client):
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(5000)}, wait=False
    )
    await client.settle_down(0.1)
    assert not receiver.answered  # the attach waits for a session (docs/wire.md §6.5)
    producer = await connect()
    await producer.authorize("sessions")
    await producer.send_to("sessions", Message(body="late", group_id="late"))
    await client.wait(lambda: receiver.answered, "the session receiver's attach")
    assert receiver.remote_filter == {SESSION_FILTER: "late"}


async def test_detaching_while_waiting_for_a_session_is_answered_at_once(client):
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(5000)}, wait=False
    )
    await client.settle_down(0.05)
    assert not receiver.answered
    started = time.monotonic()
    receiver.link.close()
    # The wait ends on the detach, not at the 5 s timeout (docs/wire.md §6.5).
    await client.wait(lambda: receiver.closed_by_broker, "the detach answer", timeout=2)
    assert time.monotonic() - started < 1
    (detach,) = receiver.frames("detach")
    assert detach.has("closed=true") and "error=" not in detach.text


async def test_a_held_session_cannot_be_locked_by_another_receiver(connect, client):
    await fill(client)
    holder = await client.attach_receiver("sessions", session="a")
    assert holder.remote_filter == {SESSION_FILTER: "a"}
    other = await connect()
    await other.authorize("sessions")
    refused = await other.attach_receiver("sessions", session="a")
    assert is_null(refused.link.remote_source)
    assert refused.condition.name == "com.microsoft:session-cannot-be-locked"
    # Once the holder detaches (and the detach is answered), the session is free again.
    await client.detach(holder)
    again = await other.attach_receiver("sessions", session="a", credit=3)
    assert again.remote_filter == {SESSION_FILTER: "a"}
    assert [i.message.body for i in await again.wait_for(3)] == ["a0", "a1", "a2"]


async def test_session_lock_expiry_detaches_with_session_lock_lost(client):
    await fill(client, "short-sessions")  # 300 ms session locks
    receiver = await client.attach_receiver("short-sessions", session="a", credit=1)
    (item,) = await receiver.wait_for(1)
    await client.wait(
        lambda: receiver.closed_by_broker, "the detach of the expired session", timeout=3
    )
    (detach,) = receiver.frames("detach")
    assert detach.has("closed=true")
    cond = receiver.condition
    assert cond.name == "com.microsoft:session-lock-lost" and cond.description
    assert cond.info is None  # a live link's detach: two fields (docs/wire.md §9.4)
    # The unsettled message counts as a failed attempt (docs/design.md §2.4).
    again = await client.attach_receiver("short-sessions", session="a", credit=1)
    (retry,) = await again.wait_for(1)
    assert retry.message.body == item.message.body == "a0"
    assert retry.message.delivery_count == 1


async def test_one_store_call_locks_the_session_and_takes_its_first_messages(broker, client):
    """Credit sent with the attach is used by the accept itself; a flow that only tops up
    credit after the session ran dry costs no store call; a new message still arrives (the
    send hands it over, docs/design.md §3.5: no receive either), and a drain still gets its
    answer."""
    await fill(client)
    calls = StoreCalls(broker.store, "accept_session", "receive_session")
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(2000)}, credit=10
    )
    assert receiver.remote_filter == {SESSION_FILTER: "a"}
    await receiver.wait_for(3)
    for item in receiver.received:
        await client.dispose(item, Delivery.ACCEPTED)
    receiver.flow(3)  # tops the credit up again, as a prefetching client does
    await client.settle_down(0.2)
    assert [i.message.body for i in receiver.received] == ["a0", "a1", "a2"]
    assert calls.counts == {"accept_session": 1, "receive_session": 0}
    await client.send_to("sessions", Message(body="a3", group_id="a"))
    await receiver.wait_for(4)
    assert receiver.received[3].message.body == "a3"
    assert calls.counts == {"accept_session": 1, "receive_session": 0}
    receiver.drain(5)
    await client.wait(lambda: not receiver.link.draining(), "the drained flow")
    assert receiver.frames("flow")[-1].has("link-credit=0x0,", "drain=true")


async def test_the_accept_takes_what_the_connection_granted_before_when_credit_comes_later(
    broker, client
):
    """Most clients grant credit once the attach is answered: the accept then takes as many
    as this connection's last session receiver first granted and sends them when the credit
    comes; more than that credit go back first, and order holds."""
    await client.send_to(
        "sessions",
        *(Message(body=f"{g}{i}", group_id=g) for g in ("a", "b", "c") for i in range(3)),
    )
    calls = StoreCalls(broker.store, "accept_session", "receive_session", "settle")
    first = await client.attach_receiver("sessions", session="a")
    first.flow(10)  # after the answer
    await first.wait_for(3)
    assert calls.counts == {"accept_session": 1, "receive_session": 1, "settle": 0}
    await client.detach(first)

    second = await client.attach_receiver("sessions", session="b")
    await client.settle_down(0.1)
    assert second.received == []  # no credit yet
    second.flow(10)
    await second.wait_for(3)
    await client.settle_down(0.1)
    assert [i.message.body for i in second.received] == ["b0", "b1", "b2"]
    assert calls.counts == {"accept_session": 2, "receive_session": 1, "settle": 0}
    # woken while holding what it took: a message sent before the credit still comes
    await client.detach(second)
    third = await client.attach_receiver("sessions", session="c")
    await client.send_to("sessions", Message(body="c3", group_id="c"))
    await client.settle_down(0.1)
    third.flow(2)  # less than it took: the rest goes back first, then comes in order
    await third.wait_for(2)
    third.flow(10)
    await third.wait_for(4)
    await client.settle_down(0.1)
    assert [i.message.body for i in third.received] == ["c0", "c1", "c2", "c3"]
    # what went back (one store call) was never delivered: no attempt counted
    assert calls.counts["settle"] == 1
    assert [i.message.delivery_count for i in third.received] == [0, 0, 0, 0]


async def test_a_renewal_moves_the_expiry_the_link_is_detached_at(client):
    """renew-session-lock goes through the receiver's lease: the link is kept past the first
    lock's end, and told the lock is lost only once the renewed one (plus its grace) passed.
    2 s locks (2 s of grace), renewed every 0.5 s: a busy machine does not lose them between
    renewals, as it would 300 ms ones."""
    lock_s = 2.0
    await fill(client, "renewed-sessions")
    attached = time.time()
    receiver = await client.attach_receiver("renewed-sessions", session="a", credit=1)
    await receiver.wait_for(1)
    renewals = 0
    while time.time() < attached + 2 * lock_s + 0.2:  # past the first lock's end and grace
        await asyncio.sleep(lock_s / 4)
        renewed = await client.request(
            "renewed-sessions",
            "renew-session-lock",
            {"session-id": "a"},
            **{"associated-link-name": receiver.name},
        )
        assert renewed.properties["statusCode"] == 200
        renewals += 1
    assert renewals >= 2 and not receiver.closed_by_broker
    expiration = renewed.body["expiration"] / 1000
    await client.wait(
        lambda: receiver.closed_by_broker, "the detach of the expired session", timeout=10
    )
    assert time.time() >= expiration + lock_s
    assert receiver.condition.name == "com.microsoft:session-lock-lost"


async def test_a_session_lock_is_used_only_through_its_own_entity(client):
    """A `$management` node of another entity cannot renew or read the session through the
    receiver that holds it there: session-lock-lost, and the lock is kept."""
    await fill(client)
    receiver = await client.attach_receiver("sessions", session="a", credit=1)
    await receiver.wait_for(1)
    link = {"associated-link-name": receiver.name}
    for operation in ("renew-session-lock", "get-session-state"):
        refused = await client.request("short-sessions", operation, {"session-id": "a"}, **link)
        assert refused.properties["statusCode"] == 410
        assert refused.properties["errorCondition"] == "com.microsoft:session-lock-lost"
    renewed = await client.request("sessions", "renew-session-lock", {"session-id": "a"}, **link)
    assert renewed.properties["statusCode"] == 200
