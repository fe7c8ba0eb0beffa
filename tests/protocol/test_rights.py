"""Tokens and rights (docs/wire.md §3.4, §3.5): Send / Listen / Manage claims on links and
`$management` operations, no entity-name enumeration without a signed token, put-token 404 for
a missing entity, and links detached when their token expires."""

from __future__ import annotations

import asyncio

import pytest
from proton import Message

from busd.entities.records import SubscriptionEntity, TopicEntity
from tests.protocol.harness import NEXT_AVAILABLE, ProtocolClient
from tests.protocol.test_attach import assert_refused

pytestmark = pytest.mark.timeout(30)

UNAUTHORIZED = "amqp:unauthorized-access"
KEYS = {"sender": "send-key", "listener": "listen-key", "manager": "manage-key"}


async def as_key(connect, key_name: str, *entities: str) -> ProtocolClient:
    client = await connect()
    for entity in entities:
        response = await client.put_token(entity, key_name=key_name, key=KEYS[key_name])
        assert response.properties["status-code"] == 202
    return client


def status(response: Message) -> tuple[int, str | None]:
    props = response.properties
    return props["statusCode"], props.get("errorCondition")


async def test_a_listen_key_receives_but_cannot_send_or_schedule(connect):
    client = await as_key(connect, "listener", "plain")
    sender = await client.attach_sender("plain")
    assert_refused(sender, UNAUTHORIZED, client_receives=False)
    assert "'Send' claim(s) are required" in sender.condition.description
    receiver = await client.attach_receiver("plain", credit=5)
    assert not receiver.closed_by_broker
    assert not (await client.attach_receiver("plain/$DeadLetterQueue")).closed_by_broker
    assert (
        status(
            await client.request(
                "plain", "peek-message", {"from-sequence-number": 1, "message-count": 1}
            )
        )[0]
        == 204
    )
    scheduled = await client.request("plain", "schedule-message", {"messages": []})
    assert status(scheduled) == (401, UNAUTHORIZED)
    cancelled = await client.request("plain", "cancel-scheduled-message", {"sequence-numbers": []})
    assert status(cancelled) == (401, UNAUTHORIZED)


async def test_a_send_key_sends_and_schedules_but_cannot_receive_or_peek(connect):
    client = await as_key(connect, "sender", "plain", "sessions")
    sender = await client.attach_sender("plain")
    assert not sender.closed_by_broker
    (delivery,) = await client.send(sender, Message(body="sent with Send"))
    assert delivery.remote_state == delivery.ACCEPTED
    for address, session in (
        ("plain", None),
        ("sessions", NEXT_AVAILABLE),
        ("plain/$DeadLetterQueue", None),
    ):
        receiver = await client.attach_receiver(address, session=session)
        assert_refused(receiver, UNAUTHORIZED, client_receives=True)
        assert "'Listen' claim(s) are required" in receiver.condition.description
    assert status(await client.request("plain", "schedule-message", {"messages": []}))[0] == 200
    for operation, body in (
        ("peek-message", {"from-sequence-number": 1, "message-count": 1}),
        ("renew-lock", {"lock-tokens": []}),
        ("receive-by-sequence-number", {"sequence-numbers": []}),
        ("update-disposition", {"disposition-status": "completed", "lock-tokens": []}),
    ):
        assert status(await client.request("plain", operation, body)) == (401, UNAUTHORIZED), (
            operation
        )
    for operation, body in (
        ("get-message-sessions", {"skip": 0, "top": 10}),
        ("get-session-state", {"session-id": "s"}),
        ("renew-session-lock", {"session-id": "s"}),
    ):
        assert status(await client.request("sessions", operation, body)) == (401, UNAUTHORIZED), (
            operation
        )


async def test_a_manage_key_sends_and_receives(connect):
    client = await as_key(connect, "manager", "plain")
    sender = await client.attach_sender("plain")
    (delivery,) = await client.send(sender, Message(body="managed"))
    assert delivery.remote_state == delivery.ACCEPTED
    receiver = await client.attach_receiver("plain", credit=5)
    assert not receiver.closed_by_broker
    assert (
        status(
            await client.request(
                "plain", "peek-message", {"from-sequence-number": 1, "message-count": 1}
            )
        )[0]
        == 200
    )
    assert status(await client.request("plain", "schedule-message", {"messages": []}))[0] == 200


async def test_without_a_token_existing_and_missing_entities_answer_alike(connect):
    client = await connect()
    await client.authorize("other")  # a token, but for another entity
    answers = []
    for address in ("plain", "nosuch"):
        for attach in (client.attach_sender, client.attach_receiver):
            handle = await attach(address)
            assert handle.closed_by_broker
            answers.append(
                (handle.condition.name, handle.condition.description.replace(address, "<name>"))
            )
    assert set(answers) == {
        (UNAUTHORIZED, "Unauthorized access to '<name>': put a valid token for it on $cbs first.")
    }
    # A token signed with a wrong key learns nothing either: 401, not 404.
    assert (await client.put_token("nosuch", key="WRONG")).properties["status-code"] == 401
    assert (await client.put_token("plain", key="WRONG")).properties["status-code"] == 401


async def test_put_token_for_a_missing_entity_is_answered_404(connect):
    client = await connect()
    missing = await client.put_token("nosuch")
    assert missing.properties["status-code"] == 404
    assert "could not be found" in missing.properties["status-description"]
    assert "error-condition" not in missing.properties
    for entity in ("", "plain", "Plain/$DeadLetterQueue", "sessions/$management"):
        assert (await client.put_token(entity)).properties["status-code"] == 202, entity
    # The refused token granted nothing.
    sender = await client.attach_sender("nosuch")
    assert sender.closed_by_broker and sender.condition.name == "amqp:not-found"  # namespace


async def test_put_token_for_topics_and_subscriptions_answers_by_the_catalog(connect, broker):
    await broker.catalog.create(TopicEntity("news"))
    await broker.catalog.create(SubscriptionEntity("news", "all"))
    client = await connect()
    for entity, expected in (
        ("news", 202),
        ("News/Subscriptions/All", 202),
        ("news/subscriptions/all/$DeadLetterQueue", 202),
        ("news/subscriptions/none", 404),
        ("olds", 404),
    ):
        assert (await client.put_token(entity)).properties["status-code"] == expected, entity


async def test_links_are_detached_when_their_token_expires(connect):
    client = await connect()
    await client.put_token("plain", valid_s=3)  # se in whole seconds: lapses in 2 to 3 s
    sender = await client.attach_sender("plain")
    receiver = await client.attach_receiver("plain", credit=5)
    await client.request("plain", "peek-message", {"from-sequence-number": 1, "message-count": 1})
    management = client.node_links("plain/$management")
    await client.wait(
        lambda: sender.closed_by_broker and receiver.closed_by_broker,
        "the detach of both links",
        timeout=5,
    )
    for handle in (sender, receiver, *management):
        assert handle.closed_by_broker
        assert handle.condition.name == UNAUTHORIZED
        assert "expired" in handle.condition.description
    # The CBS links stay: a new token makes the connection usable again.
    cbs_requests, cbs_responses = client.node_links("$cbs")
    assert not cbs_requests.closed_by_broker and not cbs_responses.closed_by_broker
    await client.authorize("plain")
    again = await client.attach_sender("plain")
    assert not again.closed_by_broker


async def test_a_token_renewed_in_time_keeps_the_links(connect):
    client = await connect()
    await client.put_token("plain", valid_s=3)
    await client.put_token("other", valid_s=3)
    kept = await client.attach_receiver("plain", credit=5)
    lost = await client.attach_receiver("other", credit=5)
    await client.put_token("plain", valid_s=3600)  # the refresh, as the SDK does it
    await client.wait(lambda: lost.closed_by_broker, "the detach of the other link", timeout=5)
    await client.settle_down(0.3)
    assert not kept.closed_by_broker
    sender = await client.attach_sender("plain")
    await client.send(sender, Message(body="after the refresh"))
    await kept.wait_for(1)
    assert kept.received[0].message.body == "after the refresh"


async def test_one_expiry_timer_per_connection_whatever_its_links(connect):
    client = await connect()
    await client.put_token("", valid_s=3600)
    for _ in range(50):
        await client.attach_receiver("plain", credit=1)
    loop = asyncio.get_running_loop()
    timers = [
        h
        for h in loop._scheduled
        if not h.cancelled()  # type: ignore[attr-defined]
        and getattr(h._callback, "__name__", "") == "_expire"
    ]  # type: ignore[attr-defined]
    assert len(timers) == 1


async def test_a_waiting_session_receiver_is_refused_when_its_token_expires(connect):
    client = await connect()
    await client.put_token("sessions", valid_s=3)
    waiting = await client.attach_receiver("sessions", session=NEXT_AVAILABLE, credit=1, wait=False)
    await client.wait(lambda: waiting.answered, "the refusal of the waiting receiver", timeout=5)
    assert_refused(waiting, UNAUTHORIZED, client_receives=True)
    assert "expired" in waiting.condition.description
    # It waits no more: a session that becomes available goes to the next receiver.
    producer = await connect()
    await producer.authorize("sessions")
    await producer.send_to("sessions", Message(body="s1", group_id="s1"))
    await client.authorize("sessions")
    taker = await client.attach_receiver("sessions", session=NEXT_AVAILABLE, credit=1)
    assert taker.remote_filter
    (item,) = await taker.wait_for(1)
    assert item.message.body == "s1"
