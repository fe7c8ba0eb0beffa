"""The SDK's asyncio client (azure.servicebus.aio) against busd: plain queues and sessions."""

from __future__ import annotations

import asyncio

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("plain"),
            queue("sessions", RequiresSession=True),
            # The async renewer wakes once a second: a 5 s lock is the shortest it can keep.
            queue("short", RequiresSession=True, LockDuration="PT5S"),
        ]
    )


async def receive(receiver, count, wait=3):
    got = []
    for _ in range(10):
        if len(got) >= count:
            break
        got.extend(
            await receiver.receive_messages(max_message_count=count - len(got), max_wait_time=wait)
        )
    return got


async def test_plain_queue_send_receive_settle(busd):
    async with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        async with client.get_queue_sender("plain") as sender:
            await sender.send_messages([ServiceBusMessage(f"a{i}") for i in range(3)])
        async with client.get_queue_receiver("plain", max_wait_time=3) as receiver:
            messages = await receive(receiver, 3)
            assert [str(m) for m in messages] == ["a0", "a1", "a2"]
            await receiver.complete_message(messages[0])
            await receiver.abandon_message(messages[1])
            await receiver.dead_letter_message(messages[2], reason="r", error_description="d")
            (again,) = await receive(receiver, 1)
            assert str(again) == "a1" and again.delivery_count == 1
            await receiver.complete_message(again)
        async with client.get_queue_receiver(
            "plain", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
        ) as dlq:
            (dead,) = await receive(dlq, 1)
            assert (str(dead), dead.dead_letter_reason) == ("a2", "r")
            await dlq.complete_message(dead)


async def test_concurrent_next_available_receivers_get_different_sessions(busd):
    async with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        async with client.get_queue_sender("sessions") as sender:
            for sid in ("p1", "p2", "p3", "p4", "p5"):
                await sender.send_messages(
                    [ServiceBusMessage(f"{sid}-{i}", session_id=sid) for i in range(3)]
                )

        async def pump():
            async with client.get_queue_receiver(
                "sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
            ) as receiver:
                sid = receiver.session.session_id
                messages = await receive(receiver, 3)
                for m in messages:
                    await receiver.complete_message(m)
                return sid, [str(m) for m in messages]

        results = await asyncio.gather(*(pump() for _ in range(5)))
    assert sorted(sid for sid, _ in results) == ["p1", "p2", "p3", "p4", "p5"]
    for sid, bodies in results:
        assert bodies == [f"{sid}-{i}" for i in range(3)]


async def test_session_state_renew_and_listing(busd):
    async with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        async with client.get_queue_sender("short") as sender:
            await sender.send_messages(ServiceBusMessage("x", session_id="aio-s"))
        renewer = AutoLockRenewer(max_lock_renewal_duration=20)
        async with client.get_queue_receiver(
            "short", session_id="aio-s", auto_lock_renewer=renewer
        ) as receiver:
            assert await receiver.session.get_state() is None
            await receiver.session.set_state("state-1")
            await asyncio.sleep(6)  # longer than the 5 s lock: the renewer keeps it
            (message,) = await receive(receiver, 1)
            assert message.delivery_count == 0
            await receiver.complete_message(message)
            assert await receiver.session.get_state() == b"state-1"
        await renewer.close()
        ids = [sid async for sid in client.list_queue_sessions("short")]
        assert "aio-s" in ids


async def test_a_session_id_that_is_not_a_string_is_refused(busd):
    """The async twin of the SDK's test: session_id=1 (sent as an int) raises ServiceBusError
    on receive, and the process goes on serving (docs/wire.md §6.5)."""
    async with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with pytest.raises(ServiceBusError) as refused:
            async with client.get_queue_receiver(
                "sessions", session_id=1, max_wait_time=5
            ) as receiver:
                await receiver.receive_messages(max_wait_time=5)
        assert "amqp:invalid-field" in str(refused.value)
        async with client.get_queue_sender("sessions") as sender:
            await sender.send_messages(ServiceBusMessage("after", session_id="int-then"))
        async with client.get_queue_receiver(
            "sessions", session_id="int-then", max_wait_time=5
        ) as receiver:
            (message,) = await receive(receiver, 1)
            assert str(message) == "after"
            await receiver.complete_message(message)
