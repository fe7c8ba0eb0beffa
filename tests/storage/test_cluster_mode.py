"""Every script runs on a server in cluster mode, where a script touching a key outside the
slot of its KEYS is refused (the scripts carry a `#!lua` shebang, which turns the check on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import pytest_asyncio
import redis

from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import start_valkey_cluster

PL = ReceiveMode.PEEK_LOCK


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory) -> Iterator[str]:
    """A one-node Valkey cluster owning every slot."""
    server = start_valkey_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield server.connection_url
    finally:
        server.stop()


@pytest_asyncio.fixture
async def cluster_store(cluster_url):
    s = RedisStore(cluster_url, prefix="cluster")
    await s.connect()
    yield s
    await s.close()


async def test_the_cluster_refuses_a_script_that_strays_from_its_slot(cluster_url):
    client = redis.Redis.from_url(cluster_url)
    try:
        with pytest.raises(redis.ResponseError, match="same slot"):
            client.eval("#!lua\nreturn redis.call('GET', '{other}:x')", 1, "{busd:q}:seq")
    finally:
        client.close()


async def test_every_operation_runs_in_cluster_mode(cluster_store, tokens):
    s = cluster_store
    q = QueueSpec(
        "plain",
        max_delivery_count=1,
        lock_duration_ms=300,
        default_ttl_ms=60_000,
        duplicate_detection_window_ms=1000,
    )
    sq = QueueSpec("sessions", requires_session=True, lock_duration_ms=300)
    now = int(time.time() * 1000)
    await s.subscribe(lambda name: None)

    await s.send(q, [NewMessage(b"a", message_id="1"), NewMessage(b"b"), NewMessage(b"c")])
    (sched,) = await s.schedule(q, [NewMessage(b"later", scheduled_ms=now + 60_000)])
    a, b, c = await s.receive(q, 3, PL, tokens(3))
    await s.renew_message_locks(q, [a.lock_token])
    await s.settle(
        q,
        [
            Settlement(a.lock_token, Outcome.ABANDON),  # max delivery count 1: dead-lettered
            Settlement(b.lock_token, Outcome.DEFER),
            Settlement(c.lock_token, Outcome.RELEASE),
        ],
    )
    await s.receive_deferred(q, [b.seq], PL, tokens(1))
    await s.peek(q, 0, 10)
    await s.cancel_scheduled(q, [sched])
    (dead,) = await s.receive(q.dead_letter_queue, 1, PL, tokens(1))
    await s.settle(q.dead_letter_queue, [Settlement(dead.lock_token, Outcome.COMPLETE)])

    await s.send(sq, [NewMessage(b"1", session_id="s1"), NewMessage(b"2", session_id="s2")])
    lock = await s.accept_session(sq, None, "h1")
    got = await s.receive_session(sq, lock.session_id, "h1", 5, PL, tokens(5))
    await s.set_session_state(sq, lock.session_id, "h1", b"state")
    await s.get_session_state(sq, lock.session_id, "h1")
    await s.renew_session_lock(sq, lock.session_id, "h1")
    done = Settlement(got[0].lock_token, Outcome.COMPLETE, session_id=lock.session_id)
    await s.settle(sq, [done], "h1")
    await s.release_session(sq, lock.session_id, "h1")
    await s.accept_session(sq, "s2", "h2")
    await s.receive_session(sq, "s2", "h2", 1, PL, tokens(1))
    await asyncio.sleep(0.35)
    assert (await s.sweep(sq)).expired_session_locks == ["s2"]
    await s.sweep(q)
    await s.list_sessions(sq, 0, 10, None)
    await s.list_sessions(sq, 0, 10, 0)
    assert len((await s.session_page(sq, "id", None, 10)).sessions) == 2
    await s.counts(sq)
    await s.counts(q.dead_letter_queue)
    assert await s.purge(sq) == 1
    await s.purge(q.dead_letter_queue)


async def test_a_cluster_url_uses_the_cluster_client_and_wakes_up(cluster_url):
    url = cluster_url.replace("redis://", "redis+cluster://", 1)
    s = RedisStore(url, prefix="cluster-client")
    await s.connect()
    try:
        woken: asyncio.Queue[str] = asyncio.Queue()
        await s.subscribe(woken.put_nowait)
        await asyncio.sleep(0.1)  # the subscription is in place
        q = QueueSpec("routed")
        waiter = f"{s.process_id}:receiver"
        assert await s.receive(q, 1, ReceiveMode.RECEIVE_AND_DELETE, [], waiter) == []
        (seq,) = await s.send(q, [NewMessage(b"via the cluster client")])
        assert await asyncio.wait_for(woken.get(), 5) == waiter
        (message,) = await s.receive(q, 1, ReceiveMode.RECEIVE_AND_DELETE, [])
        assert (message.seq, message.blob) == (seq, b"via the cluster client")
        assert await s.ping()
    finally:
        await s.close()


def test_cluster_urls_are_recognised():
    from busd.storage.redis.store import parse_cluster_url

    assert parse_cluster_url("redis://h:1/0") is None
    assert parse_cluster_url("redis+cluster://h:1") == "redis://h:1"
    assert parse_cluster_url("rediss+cluster://u:p@h:1") == "rediss://u:p@h:1"
    assert parse_cluster_url("redis://h:1?cluster=true&x=1") == "redis://h:1?x=1"


async def test_fan_out_and_topic_scripts_run_in_cluster_mode(cluster_store, tokens):
    """A topic and its subscriptions share one slot: fan-out, cancel and drop are one script
    each."""
    from busd.storage.messages import Placement
    from busd.storage.specs import TopicSpec, subscription_path

    s = cluster_store
    subs = [
        QueueSpec(subscription_path("orders/t", n), topic="orders/t", requires_session=(n == "c"))
        for n in ("a", "b", "c")
    ]
    await s.open_subscriptions("orders/t", ["a", "b", "c"])
    topic = TopicSpec("orders/t", duplicate_detection_window_ms=1000)
    now = int(time.time() * 1000)
    seqs = await s.publish(
        topic,
        subs,
        [
            NewMessage(b"m", message_id="1", session_id="k"),
            NewMessage(b"later", scheduled_ms=now + 60_000),
        ],
    )
    await s.publish(
        topic,
        subs,
        [NewMessage(b"r")],
        [[Placement(0), Placement(1, blob=b"x"), Placement(2, dead_letter=("r", "d"))]],
    )
    await s.cancel_topic_scheduled(topic, subs, [seqs[1]])
    (a1, a2) = await s.receive(subs[0], 5, PL, tokens(5))
    assert (a1.seq, a1.blob, a2.blob) == (seqs[0], b"m", b"r")
    assert await s.accept_session(subs[2], None, "p:1") is not None
    await s.drop_subscriptions("orders/t", subs, with_topic=True)
    assert (await s.counts(subs[1])).active == 0


@pytest_asyncio.fixture
async def routed_store(cluster_url):
    """A store on the cluster client, as busd runs with a `redis+cluster://` URL."""
    s = RedisStore(cluster_url.replace("redis://", "redis+cluster://", 1), prefix="routed")
    await s.connect()
    yield s
    await s.close()


async def test_a_topic_transaction_commits_in_one_slot(routed_store, tokens):
    """A send to a topic and the completion of one of its subscription's messages, staged
    under the topic and committed by one script: the topic and its subscriptions share one
    slot."""
    from busd.storage.messages import Placement
    from busd.storage.specs import TopicSpec, subscription_path
    from busd.storage.staged import StagedCancel, StagedPublish, StagedSettlement

    s = routed_store
    subs = [QueueSpec(subscription_path("txn/t", n), topic="txn/t") for n in ("a", "b")]
    await s.open_subscriptions("txn/t", ["a", "b"])
    topic = TopicSpec("txn/t")
    await s.publish(topic, subs, [NewMessage(b"in")])
    (m,) = await s.receive(subs[0], 1, PL, tokens(1))
    now = int(time.time() * 1000)
    (later,) = await s.publish(topic, subs, [NewMessage(b"later", scheduled_ms=now + 60_000)])
    (reserved,) = await s.reserve_sequence_numbers(topic, 1)
    txn = b"t" * 16
    ops = [
        StagedSettlement(subs[0], Settlement(m.lock_token, Outcome.COMPLETE)),
        StagedPublish(topic, NewMessage(b"out"), ["a", "b"], [Placement(0), Placement(1)]),
        StagedPublish(
            topic,
            NewMessage(b"sched", scheduled_ms=now + 60_000),
            ["a", "b"],
            [Placement(1)],
            reserved,
        ),
        StagedCancel(topic, later),
    ]
    _, due = await s.stage_transaction(topic, txn, ops, first=True, timeout_ms=60_000, limit=100)
    assert due > now
    await s.renew_message_locks(subs[0], [m.lock_token], until_ms=due)
    await s.commit_transaction(topic, [subs[0]], txn, [(topic, subs)])
    assert [x.blob for x in await s.peek(subs[0], 0, 10)] == [b"out"]
    got = await s.peek(subs[1], 0, 10)
    # (numbered when scheduled, so before the send the commit numbered)
    assert [x.blob for x in got] == [b"in", b"sched", b"out"] and got[1].seq == reserved
    await s.drop_subscriptions("txn/t", subs, with_topic=True)


async def test_a_forwarders_move_on_a_cluster_is_never_lost_nor_doubled(routed_store, tokens):
    """Source and destination live in different slots: the destination records what it took,
    so a forwarder that dies between the two halves costs neither a message nor a copy."""
    from busd.storage import keys as keyspace
    from busd.storage.forwarding import ForwardDestination, ForwardedMessage, ForwardResult

    s = routed_store
    src, dst = QueueSpec("fwd-src", lock_duration_ms=300), QueueSpec("fwd-dst")
    to_queue = ForwardDestination("queue:fwd-dst", queue=dst)

    def moves(taken):
        return [ForwardedMessage(m.lock_token, m.seq, m.hops, message=m) for m in taken]

    await s.send(src, [NewMessage(b"a"), NewMessage(b"b")])
    taken = await s.take_forwarding(src, "dead:1", 5, tokens(5))
    assert await s.take_forwarding(src, "live:1", 5, tokens(5)) is None  # the lease
    # the first forwarder's process dies after the destination's half
    first = moves(taken)
    await s._forward_enqueue(src, to_queue, first, [s._forward_record(src, m) for m in first], [])
    await asyncio.sleep(0.35)
    await s.sweep(src)
    again = await s.take_forwarding(src, "live:1", 5, tokens(5))
    assert [m.blob for m in again] == [b"a", b"b"]
    assert await s.forward(src, to_queue, moves(again), hop_limit=4) == [ForwardResult.MOVED] * 2
    got = await s.peek(dst, 0, 10)
    assert [(m.blob, m.enqueue_seq) for m in got] == [(b"a", 1), (b"b", 2)]
    assert await s.peek(src, 0, 10) == []
    assert await s._client.zcard(keyspace.key("routed", "fwd-dst", "dedup")) == 0  # forgotten

    # a topic: fanned out with the placements given; the hop limit and a gone destination
    from busd.storage.messages import Placement
    from busd.storage.specs import TopicSpec, subscription_path

    subs = [QueueSpec(subscription_path("fwd-t", n), topic="fwd-t") for n in ("x", "y")]
    await s.open_subscriptions("fwd-t", ["x", "y"])
    to_topic = ForwardDestination("topic:fwd-t", topic=TopicSpec("fwd-t"), subscriptions=subs)
    await s.send(src, [NewMessage(b"c"), NewMessage(b"d"), NewMessage(b"e")])
    c, d, e = await s.take_forwarding(src, "live:1", 5, tokens(5))
    c_move, d_move, e_move = moves([c, d, e])
    c_move.placements = [Placement(1)]
    d_move.hops = 4
    assert await s.forward(src, to_topic, [c_move, d_move], hop_limit=4) == [
        ForwardResult.MOVED,
        ForwardResult.DEAD_LETTERED,
    ]
    assert await s.peek(subs[0], 0, 10) == []
    assert [(m.blob, m.enqueue_seq) for m in await s.peek(subs[1], 0, 10)] == [(b"c", 3)]
    assert await s.forward(src, ForwardDestination("gone:fwd-x"), [e_move], hop_limit=4) == [
        ForwardResult.DEAD_LETTERED
    ]
    dead = await s.peek(src.dead_letter_queue, 0, 10)
    assert [(m.blob, m.dead_letter_reason) for m in dead] == [
        (b"d", "MaxTransferHopCountExceeded"),
        (b"e", "MessagingEntityNotFound"),
    ]


async def test_the_catalog_is_written_and_announced_on_a_cluster(routed_store):
    s = routed_store
    heard: list[str | None] = []
    await s.catalog_subscribe(heard.append)
    await asyncio.sleep(0.1)  # subscribed
    assert await s.catalog_put("queue", "cq", {"name": "cq"}, only_new=True)
    assert not await s.catalog_put("queue", "cq", {"name": "other"}, only_new=True)
    assert await s.catalog_get("queue", "cq") == {"name": "cq"}
    assert await s.catalog_delete([("queue", "cq")]) == 1
    for _ in range(100):
        if heard.count("queue:cq") == 3:
            break
        await asyncio.sleep(0.02)
    assert heard.count("queue:cq") == 3 and await s.catalog_all() == {}
    await s.namespace_add("team-a")  # the namespaces made: one key beside the catalog
    assert await s.namespace_known("team-a") and not await s.namespace_known("team-b")
