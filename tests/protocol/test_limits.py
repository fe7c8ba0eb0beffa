"""What one client may make busd hold, and names busd cannot use (docs/design.md §3.12),
against busd's protocol in memory: each limit is answered with the condition clients expect,
the connection (or the process) keeps serving, and what was held is given back."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest
from cproton_ffi import ffi, lib
from proton import Endpoint, Link, Message

from busd.broker.limits import MAX_NAME_LENGTH, Buffers
from tests.protocol.harness import LinkHandle, ProtocolClient

pytestmark = pytest.mark.timeout(30)


def set_limits(broker, **changes) -> None:
    """Change the broker's limits for the connections made after this."""
    broker.limits = dataclasses.replace(broker.limits, **changes)
    broker.buffers = Buffers(broker.limits.process_buffer)


async def raw_link(
    client: ProtocolClient, name: bytes, *, sender: bool, address: bytes
) -> LinkHandle:
    """A link whose name and address are raw bytes (proton's API takes only text)."""
    make = lib.pn_sender if sender else lib.pn_receiver
    link = Link.wrap(make(client.session._impl, name))
    terminus = lib.pn_link_target(link._impl) if sender else lib.pn_link_source(link._impl)
    lib.pn_terminus_set_address(terminus, address)
    link.open()
    handle = client._handle(link)
    await client.wait(lambda: handle.closed_by_broker, "the refusal")
    return handle


@pytest.mark.parametrize(
    "name, address",
    [
        (b"bad-\xff\xfe", b"plain"),
        (b"good", b"pla\xc3in"),
        (b"x" * (MAX_NAME_LENGTH + 1), b"plain"),
        (b"good", b"p" * (MAX_NAME_LENGTH + 1)),
    ],
)
@pytest.mark.parametrize("sender", [True, False])
async def test_names_that_are_not_text_are_refused_and_the_connection_serves_on(
    client: ProtocolClient, broker, name: bytes, address: bytes, sender: bool
):
    handle = await raw_link(client, name, sender=sender, address=address)
    assert handle.condition.name == "amqp:invalid-field"
    assert "UTF-8" in handle.condition.description or "longer" in handle.condition.description
    await client.send_to("plain", Message(body="still served"))
    receiver = await client.attach_receiver("plain", credit=1)
    assert (await receiver.wait_for(1))[0].message.body == "still served"


async def test_a_container_id_that_is_not_text_closes_the_connection(new_protocol, broker, connect):
    bad = ProtocolClient(new_protocol())
    lib.pn_connection_set_container(bad.conn._impl, b"client-\xff")
    bad.conn.open()
    await bad.wait(lambda: bool(bad.conn.state & Endpoint.REMOTE_CLOSED), "the close")
    assert bad.conn.remote_condition.name == "amqp:invalid-field"
    await bad.wait(lambda: bad.sock.closed, "the socket closed")
    await bad.settle_down(0.05)
    assert broker.authenticated_connections == 0
    good = await connect()  # the process serves on
    await good.authorize("plain")


def _put_raw_property(conn, value: bytes) -> None:
    """An open whose properties map holds a string of raw bytes (proton's API takes text)."""
    data = lib.pn_connection_properties(conn._impl)
    lib.pn_data_put_map(data)
    lib.pn_data_enter(data)
    key = ffi.new("char[]", b"note")
    lib.pn_data_put_symbol(data, ffi.new("pn_bytes_t*", {"size": 4, "start": key})[0])
    raw = ffi.new("char[]", value)
    lib.pn_data_put_string(data, ffi.new("pn_bytes_t*", {"size": len(value), "start": raw})[0])
    lib.pn_data_exit(data)


@pytest.mark.parametrize(
    "field, value",
    [
        ("hostname", b"\xff\xfe.localhost"),
        ("hostname", b"h" * (MAX_NAME_LENGTH + 1)),
        ("properties", b"caf\xe9"),
    ],
    ids=["hostname-not-utf8", "hostname-too-long", "property-not-utf8"],
)
async def test_an_open_field_that_is_not_text_closes_the_connection_cleanly(
    new_protocol, broker, connect, field: str, value: bytes
):
    bad = ProtocolClient(new_protocol())
    if field == "hostname":
        lib.pn_connection_set_hostname(bad.conn._impl, value)
    else:
        _put_raw_property(bad.conn, value)
    bad.conn.open()
    await bad.wait(lambda: bool(bad.conn.state & Endpoint.REMOTE_CLOSED), "the close")
    assert bad.conn.remote_condition.name == "amqp:invalid-field"
    assert field.rstrip("s") in bad.conn.remote_condition.description
    await bad.wait(lambda: bad.sock.closed, "the socket closed")
    good = await connect()  # the process serves on (the fixture fails on a logged error)
    await good.authorize("plain")


async def test_a_session_lock_is_released_when_its_connection_drops_after_a_bad_name(
    connect, client: ProtocolClient
):
    await client.send_to("sessions", Message(body="m", group_id="s-bad-name"))
    holder = await connect()
    await holder.authorize("sessions")
    receiver = await holder.attach_receiver("sessions", session="s-bad-name", credit=1)
    await receiver.wait_for(1)
    await raw_link(holder, b"\xff\xff", sender=False, address=b"sessions")
    holder.sock.close()  # the client vanishes
    await client.settle_down(0.2)  # busd hears of it and releases the session
    other = await client.attach_receiver("sessions", session="s-bad-name", credit=1)
    assert not other.closed_by_broker, other.condition
    (again,) = await other.wait_for(1)
    assert again.message.body == "m"


async def test_links_per_connection_are_capped(broker, connect):
    set_limits(broker, links_per_connection=3)
    client = await connect()
    await client.authorize("plain")  # $cbs: two links
    await client.attach_receiver("plain")
    refused = await client.attach_receiver("plain")
    assert refused.closed_by_broker
    assert refused.condition.name == "amqp:resource-limit-exceeded"


async def test_authenticated_connections_per_process_are_capped(broker, connect, new_protocol):
    set_limits(broker, connections=1)
    unauthenticated = await connect()  # not counted: they are capped apart (busd.net.listener)
    first = await connect()
    await first.authorize("plain")
    second = ProtocolClient(new_protocol())
    second.conn.open()
    await second.wait(lambda: bool(second.conn.state & Endpoint.REMOTE_CLOSED), "the close")
    assert second.conn.remote_condition.name == "amqp:resource-limit-exceeded"
    # one that opened before the cap was reached is closed at its first valid put-token
    answer = asyncio.ensure_future(unauthenticated.put_token("plain"))
    await unauthenticated.wait(
        lambda: bool(unauthenticated.conn.state & Endpoint.REMOTE_CLOSED), "the close"
    )
    assert unauthenticated.conn.remote_condition.name == "amqp:resource-limit-exceeded"
    answer.cancel()
    await first.send_to("plain", Message(body="the first serves on"))
    assert broker.authenticated_connections == 1


async def test_a_connection_without_a_valid_token_is_closed_after_the_time_out(broker, connect):
    set_limits(broker, auth_timeout_s=0.3)
    idle = await connect()
    authorized = await connect()
    await authorized.authorize("plain")
    failed = await idle.put_token("plain", key="wrong")
    assert failed.properties["status-code"] == 401
    await idle.wait(lambda: bool(idle.conn.state & Endpoint.REMOTE_CLOSED), "the close", 3)
    assert idle.conn.remote_condition.name == "amqp:unauthorized-access"
    await authorized.settle_down(0.4)
    assert not authorized.conn.state & Endpoint.REMOTE_CLOSED
    await authorized.send_to("plain", Message(body="after the time-out"))


def partial_transfer(client: ProtocolClient, handle: LinkHandle, size: int):
    """Start a transfer of `size` bytes and leave it unfinished (more=true)."""
    delivery = handle.link.delivery(uuid.uuid4().bytes)
    handle.link.send(b"\x00" * size)  # no advance: proton sends it with more=true
    return delivery


async def test_an_endless_cbs_request_detaches_its_link_and_frees_what_it_held(connect, broker):
    client = await connect()  # no token
    requests = await client.attach_sender("$cbs", source="$cbs")
    for _ in range(4):
        partial_transfer(client, requests, 40 * 1024)
        await client.settle_down(0.02)
    await client.wait(lambda: requests.closed_by_broker, "the detach")
    assert requests.condition.name == "amqp:link:message-size-exceeded"
    assert broker.buffers.held == 0
    assert (await client.put_token("plain")).properties["status-code"] == 202


async def test_unfinished_transfers_past_the_connection_budget_detach_the_link(broker, connect):
    set_limits(broker, connection_buffer=300 * 1024)
    client = await connect()
    await client.authorize("plain")
    first = await client.attach_sender("plain")
    second = await client.attach_sender("plain")
    partial_transfer(client, first, 200 * 1024)
    await client.settle_down(0.05)
    assert not first.closed_by_broker
    partial_transfer(client, second, 200 * 1024)
    await client.wait(lambda: second.closed_by_broker, "the detach")
    assert second.condition.name == "amqp:resource-limit-exceeded"
    first.link.close()
    await client.wait(lambda: first.closed_by_broker, "the detach of the first")
    assert broker.buffers.held == 0
    await client.send_to("plain", Message(body="the connection serves on"))


async def test_unfinished_transfers_past_the_process_budget_detach_the_link(broker, connect):
    set_limits(broker, process_buffer=300 * 1024)
    one, two = await connect(), await connect()
    await one.authorize("plain")
    await two.authorize("plain")
    first = await one.attach_sender("plain")
    second = await two.attach_sender("plain")
    partial_transfer(one, first, 200 * 1024)
    await one.settle_down(0.05)
    partial_transfer(two, second, 200 * 1024)
    await two.wait(lambda: second.closed_by_broker, "the detach")
    assert second.condition.name == "amqp:resource-limit-exceeded"
    assert not first.closed_by_broker
    one.sock.close()  # the connection goes with its unfinished transfer
    await two.settle_down(0.1)
    assert broker.buffers.held == 0


async def test_a_refused_links_transfers_are_dropped(client: ProtocolClient, broker):
    refused = await client.attach_sender("plain/$DeadLetterQueue")  # nobody sends there
    assert refused.closed_by_broker
    partial_transfer(client, refused, 100 * 1024)
    await client.settle_down(0.05)
    await client.send_to("plain", Message(body="served"))
    assert broker.buffers.held == 0


async def test_links_busd_closed_first_count_until_the_client_answers(broker, connect):
    """A refused attach stays in proton until the client answers busd's detach: such links
    count toward the links per connection, and a client that leaves as many unanswered is
    closed, so a connection keeps at most twice the limit whatever the client does."""
    set_limits(broker, links_per_connection=4)
    client = await connect()
    await client.authorize("plain")  # $cbs: two links
    ignored = [await client.attach_receiver("no-such-queue") for _ in range(2)]
    assert all(h.closed_by_broker for h in ignored)  # no token for it: refused
    refused = await client.attach_receiver("plain")  # 2 attached + 2 unanswered
    assert refused.condition.name == "amqp:resource-limit-exceeded"
    for handle in (*ignored, refused):  # answered: they no longer count
        handle.link.close()
    await client.settle_down()  # (proton writes a new attach before older detaches)
    accepted = await client.attach_receiver("plain")
    assert accepted.answered and not accepted.closed_by_broker, accepted.condition
    # now leave refusals unanswered, up to the limit: then the connection is closed
    for _ in range(4):
        handle = await client.attach_receiver("no-such-queue")
        assert handle.closed_by_broker
    client.session.receiver("one-too-many").open()
    await client.wait(lambda: bool(client.conn.state & Endpoint.REMOTE_CLOSED), "the close")
    assert client.conn.remote_condition.name == "amqp:resource-limit-exceeded"
