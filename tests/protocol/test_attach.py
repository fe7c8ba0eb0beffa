"""Attach answers and refusals (docs/wire.md §4.1, §4.3) and the CBS exchange (§3), frame by
frame, against busd's protocol in memory."""

from __future__ import annotations

import pytest
from proton import Condition, Delivery, Link, Message

from tests.protocol.harness import (
    MAX_BATCH_SIZE,
    NEXT_AVAILABLE,
    TRACKING_ID,
    LinkHandle,
    is_null,
)

pytestmark = pytest.mark.timeout(30)


def assert_refused(handle: LinkHandle, condition: str, *, client_receives: bool) -> None:
    """docs/wire.md §4.3: an attach with the broker's terminus null and the client's copied,
    then a detach with closed=true and a three-field error."""
    link = handle.link
    attaches = handle.frames("attach")
    detaches = handle.frames("detach")
    assert len(attaches) == 1 and len(detaches) == 1
    frames = handle.client.frames
    assert frames.index(attaches[0]) < frames.index(detaches[0])
    if client_receives:  # the broker would own the source
        assert is_null(link.remote_source) and "source=" not in attaches[0].text
        assert link.remote_target.address == link.target.address
    else:  # the broker would own the target
        assert is_null(link.remote_target) and "target=" not in attaches[0].text
        assert link.remote_source.address == link.source.address
    assert detaches[0].has("closed=true")
    cond = handle.condition
    assert cond is not None and cond.name == condition
    assert cond.description  # says why
    assert cond.info == {TRACKING_ID: "busd"}  # docs/wire.md §9.4


async def test_unknown_entities_are_refused_with_not_found(connect):
    client = await connect()
    await client.authorize("")  # the whole namespace: it may learn what does not exist
    for address in ("nosuch", "plain/Subscriptions/s", "$management", "plain/$bogus", "a//b"):
        receiver = await client.attach_receiver(address)
        assert_refused(receiver, "amqp:not-found", client_receives=True)
    sender = await client.attach_sender("nosuch")
    assert_refused(sender, "amqp:not-found", client_receives=False)


async def test_links_without_a_covering_token_are_refused_unauthorized(connect):
    client = await connect()
    receiver = await client.attach_receiver("plain")
    assert_refused(receiver, "amqp:unauthorized-access", client_receives=True)
    sender = await client.attach_sender("plain")
    assert_refused(sender, "amqp:unauthorized-access", client_receives=False)
    # A token covers its entity and what is under it, nothing else (docs/wire.md §3.5).
    await client.authorize("other")
    sender = await client.attach_sender("plain")
    assert_refused(sender, "amqp:unauthorized-access", client_receives=False)
    dead_letters = await client.attach_receiver("other/$DeadLetterQueue")
    assert not dead_letters.closed_by_broker
    assert dead_letters.link.remote_source.address == "other/$DeadLetterQueue"


async def test_wrong_receiver_kinds_and_dead_letter_senders_are_not_allowed(client):
    plain_on_sessions = await client.attach_receiver("sessions")
    assert_refused(plain_on_sessions, "amqp:not-allowed", client_receives=True)
    session_on_plain = await client.attach_receiver("plain", session="s")
    assert_refused(session_on_plain, "amqp:not-allowed", client_receives=True)
    next_on_plain = await client.attach_receiver("plain", session=NEXT_AVAILABLE)
    assert_refused(next_on_plain, "amqp:not-allowed", client_receives=True)
    to_dead_letters = await client.attach_sender("plain/$DeadLetterQueue")
    assert_refused(to_dead_letters, "amqp:not-allowed", client_receives=False)
    # The dead-letter sub-queue of a session queue is received like a plain queue
    # (docs/design.md §2.9), and the connection is still usable after refusals.
    assert not (await client.attach_receiver("sessions/$DeadLetterQueue")).closed_by_broker
    assert not (await client.attach_sender("plain")).closed_by_broker


async def test_accepted_receiver_attach_echoes_both_termini_and_modes(client):
    address = "amqps://localhost:5672/Plain"  # the form the Python SDK sends (§2.1)
    receiver = await client.attach_receiver(address)
    link = receiver.link
    (attach,) = receiver.frames("attach")
    assert not receiver.closed_by_broker
    assert link.remote_source.address == address  # byte-identical (docs/wire.md §4.1)
    assert link.remote_target.address == link.target.address
    assert link.remote_snd_settle_mode == Link.SND_UNSETTLED
    assert link.remote_rcv_settle_mode == Link.RCV_SECOND
    assert attach.has("role=false", "initial-delivery-count=0x0")


async def test_accepted_sender_attach_gets_size_limits_first_mode_and_credit(client):
    sender = await client.attach_sender("small", rcv_settle_mode=Link.RCV_SECOND)
    link = sender.link
    assert not sender.closed_by_broker
    assert link.remote_target.address == "small"
    assert link.remote_source.address == "client-out"
    # busd settles each transfer itself: rcv-settle-mode first whatever was asked (§4.1).
    assert link.remote_rcv_settle_mode == Link.RCV_FIRST
    assert link.remote_max_message_size == 1024
    assert sender.remote_properties == {MAX_BATCH_SIZE: 1024}
    # Credit right after the attach (docs/wire.md §5.1).
    (flow,) = sender.frames("flow")
    assert flow.has("link-credit=0x3e8")
    assert link.credit == 1000


async def test_put_token_answers(connect):
    client = await connect()
    good = await client.put_token("plain")
    assert good.properties["status-code"] == 202
    assert good.properties["status-description"] == "Accepted"
    assert "error-condition" not in good.properties  # its presence means failure (§3.4)
    bad = await client.put_token("plain", key="WRONG")
    assert bad.properties["status-code"] == 401
    # Refusals carry the status only, as Service Bus's (§3.4): the SDK then reports it.
    assert "error-condition" not in bad.properties
    expired = await client.put_token("plain", valid_s=-10)
    assert expired.properties["status-code"] == 401
    # CBS responses arrive pre-settled (docs/wire.md §3.4).
    _, responses = client.node_links("$cbs")
    assert all(r.delivery.settled for r in responses.received)


def server_links(client) -> int:
    """The links proton still keeps in the broker's side of the connection (the census
    behind busd_link_objects)."""
    return client.proto.handler.kept_endpoints()[1]


async def test_links_the_client_detached_are_freed(client):
    """A session processor's connection attaches and detaches a receiver for every session it
    takes, for as long as it lives. proton keeps each link of a connection until it is freed:
    busd frees it when it answers the detach, so the connection does not grow with its past
    links (accepted, refused, session receivers alike)."""
    await client.send_to("sessions", *(Message(body=f"s{i}", group_id=f"s{i}") for i in range(3)))
    before = server_links(client)  # the $cbs node's two links
    for _ in range(10):
        for handle in (
            await client.attach_receiver("plain"),
            await client.attach_sender("plain"),
            await client.attach_receiver("no-such-queue"),
        ):
            if handle.closed_by_broker:  # refused: the client answers the broker's detach
                handle.link.close()
            else:
                await client.detach(handle)
    for i in range(3):
        handle = await client.attach_receiver("sessions", session=f"s{i}", credit=1)
        (received,) = await handle.wait_for(1)
        await client.dispose(received, Delivery.ACCEPTED)
        await client.detach(handle)
    await client.wait(lambda: server_links(client) == before, "every detached link freed")
    # the connection serves on: a new link is answered as before
    receiver = await client.attach_receiver("plain")
    assert receiver.answered and not receiver.closed_by_broker


def server_sessions(client) -> int:
    """The AMQP sessions proton still keeps in the broker's side of the connection."""
    return client.proto.handler.kept_endpoints()[0]


async def test_sessions_the_client_ended_are_freed(client):
    """The JavaScript SDK begins an AMQP session for every link it attaches, all on one
    connection, and ends it with the link: busd frees each ended session (and what links it
    still had) once it answers the end, as it frees detached links."""
    main_session = client.session
    before = server_sessions(client)
    for _ in range(10):
        client.session = client.conn.session()
        client.session.open()
        await client.attach_receiver("plain")  # left attached: the end takes it along
        client.session.close()
    client.session = main_session
    await client.wait(lambda: server_sessions(client) == before, "every ended session freed")
    assert server_links(client) == 2  # the $cbs node's, on the first session
    receiver = await client.attach_receiver("plain")
    assert receiver.answered and not receiver.closed_by_broker


async def test_a_link_both_sides_detach_at_once_is_freed_once(client, broker):
    """busd detaches a link with an error (e.g. a lost session lock) while the client detaches
    it too: the link is freed once busd's work for it is done, not while it still runs."""
    before = server_links(client)
    for _ in range(5):
        handle = await client.attach_receiver("plain", credit=1)
        handler = client.proto.handler
        endpoint = next(e for e in handler.links if e.link.name == handle.link.name)
        handler.detach(endpoint, Condition("amqp:internal-error", "crossing detaches"))
        handle.link.close()  # the client's detach crosses busd's
        client.pump()
        await client.wait(lambda h=handle: h.closed_by_broker, "busd's detach")
    await client.wait(lambda: server_links(client) == before, "both sides' links freed")
    receiver = await client.attach_receiver("plain")
    assert receiver.answered and not receiver.closed_by_broker
