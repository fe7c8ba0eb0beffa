"""A link's life on proton's engine (busd/amqp/engine.py, docs/design.md §3.2), against busd's
protocol in memory: an attach read raw and refused, a detach carrying the client's error, a
flow that comes before the attach is answered, a link or AMQP session that goes while its
session accept is still in the store, and the one timer all session leases share."""

from __future__ import annotations

import asyncio
import time

import pytest
from cproton_ffi import ffi, lib
from proton import Condition, Link, Message, symbol, uint

from busd.broker import lease as lease_module
from tests.protocol.harness import (
    NEXT_AVAILABLE,
    SESSION_FILTER,
    TIMEOUT,
    ProtocolClient,
    is_null,
)

pytestmark = pytest.mark.timeout(30)


async def fill(client: ProtocolClient, entity: str, *sessions: str, each: int = 1) -> None:
    await client.send_to(
        entity, *(Message(body=f"{s}{i}", group_id=s) for s in sessions for i in range(each))
    )


async def test_an_attach_whose_properties_are_not_text_is_refused_and_the_connection_serves_on(
    client: ProtocolClient,
):
    """The attach's properties are decoded once, by busd's codec: a string in them that is
    not UTF-8 refuses the link with invalid-field (null terminus, then the detach)."""
    link = client.session.receiver("bad-properties")
    link.source.address = "plain"
    link.target.address = "client-in"
    data = lib.pn_link_properties(link._impl)
    lib.pn_data_put_map(data)
    lib.pn_data_enter(data)
    key = b"com.microsoft:timeout"
    lib.pn_data_put_symbol(data, (len(key), ffi.from_buffer(key)))
    value = b"\xff\xfe"
    lib.pn_data_put_string(data, (len(value), ffi.from_buffer(value)))
    lib.pn_data_exit(data)
    link.open()
    handle = client._handle(link)
    await client.wait(lambda: handle.closed_by_broker, "the refusal")
    assert is_null(link.remote_source)
    assert handle.condition.name == "amqp:invalid-field"
    assert "properties" in handle.condition.description
    await client.send_to("plain", Message(body="still served"))
    receiver = await client.attach_receiver("plain", credit=1)
    assert (await receiver.wait_for(1))[0].message.body == "still served"


async def test_a_refused_attach_is_freed_once_the_client_answers_its_detach(client, broker):
    """A session receiver on a queue without sessions: refused, and its link freed (no longer
    kept by proton) once the client answers the detach."""
    handler = client.proto.handler
    refused = await client.attach_receiver("plain", session="a")
    assert refused.condition.name == "amqp:not-allowed"
    assert handler.kept_endpoints()[1] == 3  # $cbs's two links and the refused one
    await client.detach(refused)
    await client.settle_down(0.05)
    assert handler.kept_endpoints()[1] == 2
    assert len(handler.links) == 2  # ($cbs's): the refused one was never registered


async def test_a_detach_with_the_clients_error_releases_the_session_at_once(connect, client):
    """The client detaches with an error of its own: busd answers with a clean detach and the
    session can be taken by another receiver as soon as that answer is heard."""
    await fill(client, "sessions", "a", each=2)
    holder = await client.attach_receiver("sessions", session="a", credit=1)
    (first,) = await holder.wait_for(1)
    holder.link.condition = Condition("amqp:internal-error", "the client gave up")
    holder.link.close()
    await client.wait(lambda: holder.closed_by_broker, "the detach answer")
    (detach,) = holder.frames("detach")
    assert detach.has("closed=true") and "error=" not in detach.text
    other = await connect()
    await other.authorize("sessions")
    again = await other.attach_receiver("sessions", session="a", credit=2)
    assert again.remote_filter == {SESSION_FILTER: "a"}
    # released, not lost: the unsettled message comes back with its count unchanged
    got = await again.wait_for(2)
    assert [r.message.body for r in got] == [first.message.body, "a1"]
    assert got[0].message.delivery_count == 0


async def test_credit_granted_before_the_attach_is_answered_is_used_once_it_is(client):
    """A next-available receiver waiting for a session: the client's flow arrives before the
    attach answer; the first message of the session that comes goes out on that credit."""
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(5000)}, wait=False
    )
    await client.settle_down(0.05)
    receiver.flow(5)
    await client.settle_down(0.05)
    assert not receiver.answered
    await fill(client, "sessions", "late", each=3)
    got = await receiver.wait_for(3)
    assert receiver.remote_filter == {SESSION_FILTER: "late"}
    assert [r.message.body for r in got] == ["late0", "late1", "late2"]


async def test_a_drain_before_the_attach_is_answered_is_answered_after_it(client):
    """A drain sent while the accept waits is answered (drained flow) once the link is open:
    no message is there beyond what the accept took."""
    await fill(client, "sessions", "d", each=1)
    receiver = await client.attach_receiver("sessions", session="d", wait=False)
    receiver.drain(10)
    (item,) = await receiver.wait_for(1)
    assert item.message.body == "d0"
    await client.wait(lambda: receiver.link.credit == 0, "the drained flow")
    assert not receiver.closed_by_broker


@pytest.mark.parametrize("how", ["detach", "end"])
async def test_a_link_that_goes_while_its_accept_is_in_the_store_releases_the_session(
    connect, client, broker, how
):
    """The client detaches the link (or ends its AMQP session) in the same frames as the
    attach, before the store has locked the session: the detach (or end) is answered after
    the accept, and the session is free for the next receiver, with its messages unharmed.
    (The AMQP session is begun first: proton answers a begin and end that come in one read
    with a begin that names no remote channel.)"""
    await fill(client, "sessions", "p", each=2)
    other = await connect()
    await other.authorize("sessions")
    session = other.conn.session()
    session.open()
    await other.wait(lambda: bool(session.state & lib.PN_REMOTE_ACTIVE), "the begin answer")
    link: Link = session.receiver("gone-at-once")
    link.source.address = "sessions"
    link.target.address = "client-in"
    link.source.filter.put_dict({SESSION_FILTER: "p"})
    link.open()
    link.flow(2)
    if how == "detach":
        link.close()
    else:
        session.close()
    handle = other._handle(link)
    if how == "detach":
        await other.wait(lambda: handle.closed_by_broker, "the detach answer")
    else:
        await other.wait(lambda: bool(session.state & lib.PN_REMOTE_CLOSED), "the end answer")
    again = await client.attach_receiver("sessions", session="p", credit=2)
    assert again.remote_filter == {SESSION_FILTER: "p"}
    got = await again.wait_for(2)
    assert [r.message.body for r in got] == ["p0", "p1"]
    assert all(r.message.delivery_count == 0 for r in got)
    assert other.proto.handler.kept_endpoints()[1] == 2  # ($cbs's links only)


async def test_ending_the_amqp_session_of_a_waiting_receiver_is_answered_at_once(connect, client):
    """A next-available receiver waits in the store for a session; its AMQP session ends:
    the end is answered without waiting for the accept's timeout, and the receiver is no
    longer among the waiters (a session that comes next goes to a live receiver)."""
    other = await connect()
    await other.authorize("sessions")
    session = other.conn.session()
    session.open()
    await other.wait(lambda: bool(session.state & lib.PN_REMOTE_ACTIVE), "the begin answer")
    link = session.receiver("waiting")
    link.source.address = "sessions"
    link.target.address = "client-in"
    link.source.filter.put_dict({SESSION_FILTER: None})
    link.properties = {TIMEOUT: uint(5000)}
    link.open()
    link.flow(1)
    await other.settle_down(0.05)
    started = asyncio.get_running_loop().time()
    session.close()
    await other.wait(lambda: bool(session.state & lib.PN_REMOTE_CLOSED), "the end answer")
    assert asyncio.get_running_loop().time() - started < 1
    live = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(5000)}, wait=False
    )
    await client.settle_down(0.05)
    live.flow(1)
    await fill(client, "sessions", "w")
    (item,) = await live.wait_for(1)
    assert item.message.body == "w0"


async def test_held_sessions_share_one_lease_timer_and_each_is_lost_in_time(client, broker):
    """Twelve held sessions of 300 ms locks: the leases add at most one asyncio timer between
    them (none per session), and every receiver is still told its lock was lost, around its
    own lock's end plus grace."""
    names = [f"s{i}" for i in range(12)]
    await fill(client, "short-sessions", *names)
    loop = asyncio.get_running_loop()

    def timers() -> int:
        return sum(1 for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]

    before = timers()
    receivers = []
    for name in names:
        receivers.append(await client.attach_receiver("short-sessions", session=name))
    assert all(r.remote_filter == {SESSION_FILTER: name} for r, name in zip(receivers, names))
    assert timers() <= before + 1
    started = loop.time()
    await client.wait(
        lambda: all(r.closed_by_broker for r in receivers), "every lock lost", timeout=5
    )
    assert loop.time() - started < 2  # 300 ms lock + 300 ms grace + a slot, not seconds
    assert {r.condition.name for r in receivers} == {"com.microsoft:session-lock-lost"}
    assert not broker.receivers.lease_timer._slots  # every lease left the timer
    assert lease_module.SLOT_S <= 0.05


async def test_a_lease_ended_by_its_receiver_leaves_the_timer(client, broker):
    await fill(client, "sessions", "e")
    receiver = await client.attach_receiver("sessions", session="e", credit=1)
    await receiver.wait_for(1)
    assert sum(len(s) for s in broker.receivers.lease_timer._slots.values()) == 1
    await client.detach(receiver)
    assert not broker.receivers.lease_timer._slots


def test_symbol_keys_of_decoded_properties_match_protons():
    """routing looks the timeout up with proton's symbol in the map busd's codec decoded."""
    from busd.amqp.types import Symbol

    assert {Symbol("com.microsoft:timeout"): 5}.get(TIMEOUT) == 5
    assert symbol("x") == Symbol("x")


async def test_leases_filed_in_one_slot_are_queued_once_and_each_lost_one_is_told(broker):
    """A hundred leases of one slot, each ended before it comes due: the slot is queued once
    (not once per lease); a lease left running is told its lock was lost, once, after its
    lock's end plus grace."""
    queue = broker.queue("short-sessions")  # 300 ms locks: 300 ms of grace
    leases = lease_module.LeaseTimer()
    now_ms = int(time.time() * 1000)
    told: list[str] = []
    for i in range(100):
        lease = lease_module.SessionLease(
            broker.store, queue, f"s{i}", "holder", now_ms, time.monotonic()
        )
        lease.start(leases, lambda i=i: told.append(f"s{i}"))
        lease.end()
    assert len(leases._order) == 1 and not leases._slots
    kept = lease_module.SessionLease(
        broker.store, queue, "kept", "holder", now_ms, time.monotonic()
    )
    kept.start(leases, lambda: told.append("kept"))
    await asyncio.sleep(0.2)
    assert told == []  # not before the lock's end plus grace (0.3 s + 0.3 s)
    await asyncio.sleep(0.6)
    assert told == ["kept"] and kept.lost
    kept.end()
    assert not leases._slots and not leases._order
