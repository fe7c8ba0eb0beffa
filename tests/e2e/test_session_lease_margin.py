"""A session lease ends in busd before the store could give the session to another receiver
(docs/design.md §2.6): LockDuration after the accept was *sent*, less a margin for the clocks.
From then on the holder gets nothing more and its settlements are refused with
session-lock-lost, while the store still holds the lock, and even while the store cannot be
reached (a renewal stuck in a paused store): no two receivers ever act on one session at
once.

Real busd over TCP, a python-qpid-proton client, a Valkey of the module's own (it is paused).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
from proton import Delivery, Message

from busd.broker.lease import LEASE_MARGIN_S
from busd.storage.keys import key
from tests.e2e.conftest import queue
from tests.faults.tcp import tcp_client

pytestmark = pytest.mark.timeout(60)

LOCK_S = 2.0
QUEUE = "short"


@pytest.fixture(scope="module")
def redis_url(own_redis_url):
    return own_redis_url


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue(QUEUE, RequiresSession=True, LockDuration="PT2S")])


def store_lock_left_s(url: str, prefix: str, session_id: str) -> float:
    """How long the store's lock on the session still runs, by the store's clock."""
    client = redis.Redis.from_url(url)
    try:
        until = client.zscore(key(prefix, QUEUE, "slocks"), session_id)
        sec, usec = client.time()
    finally:
        client.close()
    assert until is not None, "the store holds no lock on the session"
    return until / 1000 - (sec + usec / 1e6)


async def until_monotonic(client, when: float) -> None:
    await client.settle_down(max(0.0, when - time.monotonic()))


async def hold(port: int, session_id: str, bodies: list[str]):
    """A connection holding `session_id` with its first message delivered: (client, the
    receiver, the delivery, when the accept was sent)."""
    client = await tcp_client(port)
    await client.authorize(QUEUE)
    await client.send_to(QUEUE, *(Message(body=b, group_id=session_id) for b in bodies))
    sent_at = time.monotonic()
    receiver = await client.attach_receiver(QUEUE, session=session_id, credit=1)
    (item,) = await receiver.wait_for(1)
    assert item.message.body == bodies[0]
    return client, receiver, item, sent_at


async def complete(client, item) -> tuple[float, object]:
    """Complete `item`; (seconds until busd answered, the condition of a refusal)."""
    started = time.monotonic()
    delivery = await client.dispose(item, Delivery.ACCEPTED)
    answered = time.monotonic() - started
    refused = delivery.remote_state == Delivery.REJECTED
    return answered, delivery.remote.condition.name if refused else None


async def take_again(port: int, session_id: str, count: int, within_s: float):
    """Accept the session on a new connection (retrying while it is held); its first
    `count` messages as (body, delivery count), and when the accept succeeded."""
    client = await tcp_client(port)
    await client.authorize(QUEUE)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        receiver = await client.attach_receiver(QUEUE, session=session_id, credit=count)
        if not receiver.closed_by_broker:
            accepted = time.monotonic()
            items = await receiver.wait_for(count)
            got = [(i.message.body, i.message.delivery_count) for i in items]
            for item in items:
                await client.dispose(item, Delivery.ACCEPTED)
            await client.close()
            return got, accepted
        await client.settle_down(0.05)
    raise AssertionError(f"session {session_id} never accepted again")


def test_the_lease_ends_here_before_the_store_ends_the_lock(busd, redis_url):
    async def main():
        sid = f"margin-{uuid.uuid4().hex[:6]}"
        client, receiver, item, sent_at = await hold(busd.port, sid, ["m0", "m1"])
        # Past the lease's end here, before the store's.
        await until_monotonic(client, sent_at + LOCK_S - LEASE_MARGIN_S / 2)
        assert store_lock_left_s(redis_url, busd.prefix, sid) > 0.02
        answered_s, condition = await complete(client, item)
        assert condition == "com.microsoft:session-lock-lost"
        assert store_lock_left_s(redis_url, busd.prefix, sid) > 0  # refused here, not there
        # Nothing more is delivered under the ended lease.
        receiver.flow(5)
        await client.settle_down(0.3)
        assert len(receiver.received) == 1
        # Once the store's lock ran out, the next receiver gets the session as an expired
        # lock leaves it: the refused message again with its attempt counted, then the next.
        got, _ = await take_again(busd.port, sid, 2, within_s=10)
        assert got == [("m0", 1), ("m1", 0)]
        await client.close()

    asyncio.run(main())


def test_with_a_renewal_stuck_in_a_paused_store_the_lease_ends_before_another_takes_it(
    busd, redis_url
):
    async def main():
        sid = f"paused-{uuid.uuid4().hex[:6]}"
        client, _receiver, item, sent_at = await hold(busd.port, sid, ["p0"])
        # The $management node's links, attached while the store answers.
        await client.request(QUEUE, "get-session-state", {"session-id": sid})
        requests, responses = client.node_links(f"{QUEUE}/$management")
        answers = len(responses.received)

        admin = redis.Redis.from_url(redis_url)
        pause_s = 2.5
        await until_monotonic(client, sent_at + 0.5)
        admin.execute_command("CLIENT", "PAUSE", int(pause_s * 1000), "ALL")
        # A renewal the store cannot answer: it waits behind the pause.
        client.transfer(
            requests,
            Message(
                id=uuid.uuid4(),
                reply_to=f"{QUEUE}/$management",
                body={"session-id": sid},
                properties={"operation": "com.microsoft:renew-session-lock"},
            ),
        )
        await until_monotonic(client, sent_at + LOCK_S - LEASE_MARGIN_S / 2)
        assert len(responses.received) == answers  # the renewal is still stuck
        answered_s, condition = await complete(client, item)
        refused_at = time.monotonic()
        assert condition == "com.microsoft:session-lock-lost"
        # answered here, the store still paused: the renewal sent before is still unanswered
        assert len(responses.received) == answers

        # After the pause the renewal meets the lock the store let run out meanwhile, and the
        # session goes to another receiver only after the holder was told.
        got, accepted_at = await take_again(busd.port, sid, 1, within_s=15)
        assert accepted_at > refused_at
        assert got == [("p0", 1)]
        await client.wait(lambda: len(responses.received) > answers, "the renewal's answer")
        answer = responses.received[-1].message
        assert answer.properties["statusCode"] == 410  # session-lock-lost
        print(
            f"\nrefused here {refused_at - sent_at:.3f} s after the accept was sent (answered in "
            f"{answered_s:.3f} s); "
            f"accepted by another {accepted_at - sent_at:.3f} s after"
        )
        admin.close()
        await client.close()

    asyncio.run(main())
