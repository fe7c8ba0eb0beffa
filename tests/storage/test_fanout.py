"""Fan-out: one script stores a batch sent to a topic in every subscription that takes it,
under one topic sequence number per message."""

from __future__ import annotations

import time

import pytest

from busd.errors import BusdError, Condition
from busd.storage.messages import NewMessage, Placement, ReceiveMode
from busd.storage.specs import QueueSpec, TopicSpec, subscription_path
from tests.storage.stores import NUMBERS

RD = ReceiveMode.RECEIVE_AND_DELETE
PL = ReceiveMode.PEEK_LOCK


pytestmark = pytest.mark.every_store


@pytest.fixture
def subscription(spread):
    """A subscription's handle (partitioned as its topic, on the partitioned store)."""

    def make(topic: str, name: str, **props) -> QueueSpec:
        return QueueSpec(subscription_path(topic, name), topic=topic, **spread, **props)

    return make


@pytest.fixture
def open_topic(spread, created):
    """Open the subscriptions of a topic; its handle."""

    async def open_(store, name: str, *subs: QueueSpec) -> TopicSpec:
        topic = created(TopicSpec(name, **spread))
        await store.open_subscriptions(topic, [s.subscription for s in subs])
        return topic

    return open_


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_every_subscription_gets_each_message_under_the_topic_number(
    store, subscription, open_topic
):
    subs = [subscription("t", f"s{i}") for i in range(3)]
    topic = await open_topic(store, "t", *subs)
    seqs = await store.publish(topic, subs, [NewMessage(b"a"), NewMessage(b"b")])
    assert seqs == [1, 2]
    for sub in subs:
        got = await store.receive(sub, 10, RD, [])
        assert [(m.seq, m.blob) for m in got] == [(1, b"a"), (2, b"b")]
    # one clock for every copy, and the copies are independent
    assert (await store.counts(subs[0])).totals["sent"] == 2
    assert await store.topic_totals(topic) == {"sent": 2}


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_placements_route_copies_and_a_message_nobody_takes_is_dropped(
    store, tokens, subscription, open_topic
):
    a, b = subscription("t", "a"), subscription("t", "b")
    topic = await open_topic(store, "t", a, b)
    seqs = await store.publish(
        topic,
        [a, b],
        [NewMessage(b"x", session_id="s"), NewMessage(b"y")],
        [
            [
                Placement(0),
                Placement(0, blob=b"x-ruled", own_session_id=True, session_id=None),
                Placement(1, dead_letter=("FilterEvaluationException", "division by zero")),
            ],
            [],
        ],
    )
    assert seqs == [1, 3]  # the extra copy took number 2
    got = await store.receive(a, 10, PL, tokens(10))
    assert sorted(m.blob for m in got) == [b"x", b"x-ruled"]
    assert sorted(m.seq for m in got) == [1, 2]  # the second copy: a number of its own
    assert len({m.lock_token for m in got}) == 2  # two copies, two locks
    assert await store.receive(b, 10, RD, []) == []
    (dead,) = await store.receive(b.dead_letter_queue, 10, RD, [])
    assert (dead.seq, dead.dead_letter_reason) == (1, "FilterEvaluationException")
    assert await store.topic_totals(topic) == {"sent": 2, "dropped": 1}


async def test_duplicate_detection_is_the_topics(store, subscription, spread, created):
    subs = [subscription("t", "a"), subscription("t", "b")]
    topic = created(TopicSpec("t", **spread, duplicate_detection_window_ms=60_000))
    await store.open_subscriptions(topic, ["a", "b"])
    first = await store.publish(topic, subs, [NewMessage(b"1", message_id="m")])
    again = await store.publish(topic, subs, [NewMessage(b"2", message_id="m")])
    assert first == [1] and again == [0]
    for sub in subs:
        assert [m.blob for m in await store.receive(sub, 10, RD, [])] == [b"1"]


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_sessions_ttl_and_a_subscription_that_is_gone(
    store, subscription, open_topic, spread, created
):
    sessions = subscription("t", "sess", requires_session=True)
    short = subscription("t", "short", default_ttl_ms=1000)
    gone = subscription("t", "gone")
    topic = await open_topic(store, "t", sessions, short)  # `gone` never opened
    await store.publish(
        created(TopicSpec("t", **spread, default_ttl_ms=60_000)),
        [sessions, short, gone],
        [NewMessage(b"s1", session_id="k"), NewMessage(b"none")],
    )
    lock = await store.accept_session(sessions, None, "p:1")
    assert lock.session_id == "k"
    (dead,) = await store.receive(sessions.dead_letter_queue, 10, RD, [])
    assert (dead.blob, dead.dead_letter_reason) == (b"none", "Session ID is null.")
    copies = await store.receive(short, 10, RD, [])
    assert [m.blob for m in copies] == [b"s1", b"none"]
    assert all(m.expires_ms - m.enqueued_ms == 1000 for m in copies)  # the lower ceiling
    assert (await store.counts(gone)).active == 0
    assert await store.topic_totals(topic) == {"sent": 2}


async def test_scheduled_on_a_topic_then_cancelled_everywhere(
    store, server_now, subscription, open_topic
):
    subs = [subscription("t", "a"), subscription("t", "b")]
    topic = await open_topic(store, "t", *subs)
    later = server_now() + 60_000
    (seq,) = await store.publish(topic, subs, [NewMessage(b"later", scheduled_ms=later)])
    assert [(await store.counts(s)).scheduled for s in subs] == [1, 1]
    await store.cancel_topic_scheduled(topic, subs, [seq])
    assert [(await store.counts(s)).scheduled for s in subs] == [0, 0]
    with pytest.raises(BusdError) as missing:
        await store.cancel_topic_scheduled(topic, subs, [seq])
    assert missing.value.condition == Condition.MESSAGE_NOT_FOUND


@pytest.mark.not_on("partitioned", reason=NUMBERS)
async def test_a_resubmitted_dead_letter_takes_a_fresh_topic_number(
    store, subscription, open_topic
):
    sub = subscription("t", "a")
    topic = await open_topic(store, "t", sub)
    await store.publish(topic, [sub], [NewMessage(b"m")], [[Placement(0, dead_letter=("r", "d"))]])
    assert await store.resubmit_dead_letters(sub, 10) == 1
    (back,) = await store.receive(sub, 10, RD, [])
    (nxt,) = await store.publish(topic, [sub], [NewMessage(b"n")])
    assert back.seq == 2 and nxt == 3  # one counter: no copy overwrites another


async def test_wakeups_reach_the_subscription_that_got_the_message(store, subscription, open_topic):
    woken: list[str] = []
    await store.subscribe(woken.append)
    a, b = subscription("t", "a"), subscription("t", "b")
    topic = await open_topic(store, "t", a, b)
    assert await store.receive(a, 1, RD, [], waiter=f"{store.process_id}:1") == []
    assert await store.receive(b, 1, RD, [], waiter=f"{store.process_id}:2") == []
    await store.publish(topic, [a, b], [NewMessage(b"m")], [[Placement(1)]])
    deadline = time.monotonic() + 5
    while not woken and time.monotonic() < deadline:
        import asyncio

        await asyncio.sleep(0.01)
    assert woken == [f"{store.process_id}:2"]


# A batch of 20 messages over 4 sessions to a topic with a plain and a session subscription.
# Measured 273 commands when each copy made its own: per message the topic's number (INCR);
# per copy its index entries (q.all, ready or sready, the expiry index, the session index,
# sfree), its body and metadata (HSET), the wake-up of a waiting receiver (ZPOPMIN) and, in
# the session subscription, the session's holder (HGET). 26 since what a call adds to each
# subscription's keys is made by one command per key (lua/includes/addTo.lua), a session's
# holder is read and its place in sfree set once a call, and the numbers are taken with one
# INCRBY.
PUBLISH_COMMANDS = 26


@pytest.mark.not_on("cluster", reason="counts one server's commands")
@pytest.mark.not_on("partitioned", reason="counts one server's commands")
async def test_a_batch_to_a_topic_adds_to_each_subscription_s_keys_once(
    store, store_url, tokens, subscription, open_topic
):
    import redis

    from busd.storage.messages import LockTokens

    plain = subscription("t", "plain", default_ttl_ms=3_600_000)
    sessions = subscription("t", "sessions", requires_session=True, lock_duration_ms=30_000)
    topic = await open_topic(store, "t", plain, sessions)
    batch = [NewMessage(b"%d" % i, session_id=f"s{i % 4}") for i in range(20)]
    await store.counts(plain)  # the store's connection made
    with redis.Redis.from_url(store_url) as client:
        before = sum(int(v["calls"]) for v in client.info("commandstats").values())
        seqs = await store.publish(topic, [plain, sessions], batch)
        stats = client.info("commandstats")
        made = sum(int(v["calls"]) for v in stats.values()) - before - 1  # less INFO
    assert made <= PUBLISH_COMMANDS, made
    got = await store.receive(plain, 100, RD, [])
    assert [m.blob for m in got] == [m.blob for m in batch]
    assert all(m.expires_ms is not None for m in got)
    for s in range(4):
        lock = await store.accept_session(
            sessions, None, f"{store.process_id}:1", count=10, mode=PL, tokens=LockTokens(10),
            client="c\0a", waiting=False,
        )  # fmt: skip
        assert lock is not None and lock.session_id == f"s{s}"  # the oldest free first
        assert [m.seq for m in lock.messages] == seqs[s::4]
