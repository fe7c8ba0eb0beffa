"""Peek-lock settlement and busd's settled echo (docs/wire.md §7.1–§7.3), against busd's
protocol in memory. Each client disposition is sent unsettled, as the Python SDK does, and
answered by one settled disposition whose state says what the store did."""

from __future__ import annotations

import time

import pytest
from proton import Condition, Delivery, Message, symbol

from tests.protocol.harness import (
    LOCKED_UNTIL,
    LinkHandle,
    ProtocolClient,
    Received,
    token_of_tag,
    uuid_array,
)

pytestmark = pytest.mark.timeout(30)

ACTIVE, DEFERRED = 0, 1  # x-opt-message-state (docs/wire.md §6.3)


async def one_locked(
    client: ProtocolClient, entity: str = "plain", body: str = "m"
) -> tuple[LinkHandle, Received]:
    """Send one message to `entity` and take it in peek-lock on a fresh receiver."""
    await client.send_to(entity, Message(body=body))
    receiver = await client.attach_receiver(entity, credit=1)
    (item,) = await receiver.wait_for(1)
    assert not item.delivery.settled
    return receiver, item


async def peek_states(client: ProtocolClient, entity: str = "plain") -> list[int]:
    """The `x-opt-message-state` of every message of `entity`, in sequence order."""
    response = await client.request(entity, "peek-message", {"message-count": 10})
    if response.properties["statusCode"] == 204:
        return []
    states = []
    for item in response.body["messages"]:
        message = Message()
        message.decode(item["message"])
        states.append(message.annotations[symbol("x-opt-message-state")])
    return states


def echo_of(client: ProtocolClient, mark: int):
    """The one disposition busd sent after `mark`: role=sender, settled (docs/wire.md §7.2)."""
    (frame,) = client.dispositions(mark, by_sender=True)
    assert frame.has("role=false", "settled=true")
    return frame


async def test_accepted_is_echoed_accepted_and_completes(client):
    _, item = await one_locked(client)
    mark = len(client.frames)
    delivery = await client.dispose(item, Delivery.ACCEPTED)
    assert delivery.remote_state == Delivery.ACCEPTED
    assert echo_of(client, mark).has("@accepted(36)")
    assert await peek_states(client) == []  # deleted (docs/design.md §2.3)


@pytest.mark.parametrize("failed", [True, False])
async def test_abandon_is_echoed_modified_failed_and_redelivered_counted(client, failed):
    """The Java SDK abandons with `modified` and neither flag set, and counts on Service Bus
    raising the delivery count and echoing `modified` (any other echo fails its abandon)."""
    receiver, item = await one_locked(client)
    mark = len(client.frames)
    delivery = await client.dispose(item, Delivery.MODIFIED, failed=failed, undeliverable=False)
    assert delivery.remote_state == Delivery.MODIFIED
    assert delivery.remote.failed and not delivery.remote.undeliverable
    assert echo_of(client, mark).has("@modified(39)", "delivery-failed=true")
    receiver.flow(1)
    (_, again) = await receiver.wait_for(2)
    assert again.message.body == "m"
    assert again.message.delivery_count == 1  # abandon counts (docs/design.md §2.4)
    assert token_of_tag(again.tag) != token_of_tag(item.tag)  # a new lock


async def test_defer_is_echoed_modified_undeliverable_and_hides_the_message(client):
    receiver, item = await one_locked(client)
    mark = len(client.frames)
    delivery = await client.dispose(item, Delivery.MODIFIED, failed=True, undeliverable=True)
    assert delivery.remote_state == Delivery.MODIFIED
    assert delivery.remote.failed and delivery.remote.undeliverable
    assert echo_of(client, mark).has("delivery-failed=true", "undeliverable-here=true")
    assert await peek_states(client) == [DEFERRED]
    receiver.drain(1)
    await client.wait(lambda: not receiver.link.draining(), "the drained flow")
    assert len(receiver.received) == 1  # only a fetch by sequence number reaches it


@pytest.mark.parametrize("how", ["released", "settled-without-state"])
async def test_release_is_echoed_released_and_redelivered_uncounted(client, how):
    receiver, item = await one_locked(client)
    mark = len(client.frames)
    if how == "released":
        delivery = await client.dispose(item, Delivery.RELEASED)
    else:  # settled with no state: a release, applied without an echo (docs/wire.md §7.1)
        item.delivery.settle()
        delivery = None
    if delivery is not None:
        assert delivery.remote_state == Delivery.RELEASED
        assert echo_of(client, mark).has("@released(38)")
    receiver.flow(1)
    (_, again) = await receiver.wait_for(2)
    assert again.message.body == "m"
    assert again.message.delivery_count == 0  # release does not count (design §2.4)
    if delivery is None:
        assert client.dispositions(mark, by_sender=True) == []


async def test_rejected_dead_letters_and_is_echoed_rejected_without_error(client):
    _, item = await one_locked(client)
    mark = len(client.frames)
    info = {symbol("DeadLetterReason"): "bad", symbol("DeadLetterErrorDescription"): "why"}
    delivery = await client.dispose(
        item, Delivery.REJECTED, condition=Condition("com.microsoft:dead-letter", None, info)
    )
    assert delivery.remote_state == Delivery.REJECTED
    assert delivery.remote.condition is None  # success (docs/wire.md §7.2)
    assert "error=" not in echo_of(client, mark).text
    assert await peek_states(client) == []
    dead = await client.attach_receiver("plain/$DeadLetterQueue", credit=1)
    (letter,) = await dead.wait_for(1)
    assert letter.message.body == "m"
    assert letter.message.properties["DeadLetterReason"] == "bad"
    assert letter.message.properties["DeadLetterErrorDescription"] == "why"


async def test_settling_an_expired_lock_is_echoed_rejected_message_lock_lost(client):
    _, item = await one_locked(client, "short-lock")  # 300 ms locks
    delay = item.annotations[LOCKED_UNTIL] / 1000 - time.time()
    await client.settle_down(max(0.0, delay) + 0.1)
    mark = len(client.frames)
    delivery = await client.dispose(item, Delivery.ACCEPTED)
    assert delivery.remote_state == Delivery.REJECTED
    cond = delivery.remote.condition
    assert cond.name == "com.microsoft:message-lock-lost" and cond.description
    assert cond.info is None  # condition and description only (docs/wire.md §9.4)
    assert echo_of(client, mark).has("@rejected(37)", "com.microsoft:message-lock-lost")
    # Nothing changed in the store: the message is still there, available again.
    assert await peek_states(client, "short-lock") == [ACTIVE]


async def test_settling_a_lock_settled_elsewhere_is_rejected_and_changes_nothing(client):
    _, item = await one_locked(client)
    token = token_of_tag(item.tag)
    done = await client.request(
        "plain",
        "update-disposition",
        {"disposition-status": "abandoned", "lock-tokens": uuid_array([token])},
    )
    assert done.properties["statusCode"] == 200
    delivery = await client.dispose(item, Delivery.ACCEPTED)
    assert delivery.remote_state == Delivery.REJECTED
    assert delivery.remote.condition.name == "com.microsoft:message-lock-lost"
    assert await peek_states(client) == [ACTIVE]  # not completed


async def test_a_client_settled_disposition_is_applied_without_echo(client):
    _, item = await one_locked(client)
    mark = len(client.frames)
    await client.dispose(item, Delivery.ACCEPTED, settled=True)
    # Applied by the store (nothing tells the client): wait until a peek shows it gone.
    deadline = time.monotonic() + 5
    while await peek_states(client):
        assert time.monotonic() < deadline, "the client-settled completion was not applied"
    assert client.dispositions(mark, by_sender=True) == []
