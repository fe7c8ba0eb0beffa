"""Transactions in the store: operations staged under the via entity, applied by one script
at the commit, all or none; dropped by a rollback or, past their time, by the sweep."""

from __future__ import annotations

import os

import pytest

from busd.errors import BusdError, Condition
from busd.storage import keys as keyspace
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.specs import QueueSpec
from busd.storage.staged import StagedCancel, StagedSend, StagedSessionState, StagedSettlement
from tests.storage.stores import CROSS_SLOT, PARTITION_HANDLES

pytestmark = [
    pytest.mark.every_store,
    pytest.mark.not_on("partitioned", reason=PARTITION_HANDLES),
]

TIMEOUT_MS = 120_000


def txn() -> bytes:
    return os.urandom(16)


async def stage(store, via, txn_id, ops, *, first=True, timeout_ms=TIMEOUT_MS, limit=100):
    """How many operations the transaction holds."""
    count, _ = await store.stage_transaction(
        via, txn_id, ops, first=first, timeout_ms=timeout_ms, limit=limit
    )
    return count


async def staged_keys(store, queue) -> list:
    client = store._client
    names = [keyspace.key(store.prefix, queue.name, n) for n in keyspace.TRANSACTION_KEYS]
    return [n for n in names if await client.exists(n)]


async def test_staged_sends_are_invisible_until_the_commit(store, make_queue):
    q = make_queue()
    t = txn()
    assert (
        await stage(store, q, t, [StagedSend(q, NewMessage(b"a")), StagedSend(q, NewMessage(b"b"))])
        == 2
    )
    assert await stage(store, q, t, [StagedSend(q, NewMessage(b"c"))], first=False) == 3
    assert (await store.counts(q)).active == 0
    await store.commit_transaction(q, [], t)
    assert [m.blob for m in await store.peek(q, 0, 10)] == [b"a", b"b", b"c"]
    assert await staged_keys(store, q) == []


async def test_discard_drops_everything_staged(store, make_queue):
    q = make_queue()
    t = txn()
    await stage(store, q, t, [StagedSend(q, NewMessage(b"a"))])
    await store.discard_transaction(q, t)
    assert await staged_keys(store, q) == []
    assert await store.peek(q, 0, 10) == []
    with pytest.raises(BusdError) as err:  # gone: a commit now finds nothing to apply
        await store.commit_transaction(q, [], t)
    assert err.value.condition == Condition.TRANSACTION_TIMEOUT


@pytest.mark.not_on("cluster", reason=CROSS_SLOT)
async def test_complete_and_send_across_queues_commit_together(store, make_queue, tokens):
    source, target = make_queue(), make_queue()
    await store.send(source, [NewMessage(b"in")])
    (m,) = await store.receive(source, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    t = txn()
    await stage(
        store,
        source,
        t,
        [
            StagedSettlement(source, Settlement(m.lock_token, Outcome.COMPLETE)),
            StagedSend(target, NewMessage(b"out")),
        ],
    )
    # until the commit: the input is locked still, the output nowhere
    assert (await store.counts(source)).locked == 1
    assert await store.peek(target, 0, 10) == []
    await store.commit_transaction(source, [target], t)
    assert await store.peek(source, 0, 10) == []
    assert [x.blob for x in await store.peek(target, 0, 10)] == [b"out"]


async def test_a_lost_lock_refuses_the_whole_commit(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a"), NewMessage(b"b")])
    a, b = await store.receive(q, 2, ReceiveMode.PEEK_LOCK, tokens(2))
    # b is settled outside the transaction first: its lock is gone
    assert await store.settle(q, [Settlement(b.lock_token, Outcome.COMPLETE)]) == [None]
    t = txn()
    await stage(
        store,
        q,
        t,
        [
            StagedSend(q, NewMessage(b"out")),
            StagedSettlement(q, Settlement(a.lock_token, Outcome.COMPLETE)),
            StagedSettlement(q, Settlement(b.lock_token, Outcome.COMPLETE)),
        ],
    )
    with pytest.raises(BusdError) as err:
        await store.commit_transaction(q, [], t)
    assert err.value.condition == Condition.MESSAGE_LOCK_LOST
    # nothing applied: a still locked with its token and count, no output
    left = await store.peek(q, 0, 10)
    assert [(x.blob, x.delivery_count) for x in left] == [(b"a", 0)]
    assert await store.renew_message_locks(q, [a.lock_token])
    assert await staged_keys(store, q) == []


async def test_settling_one_message_twice_refuses_the_commit(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"a")])
    (a,) = await store.receive(q, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    t = txn()
    settle = StagedSettlement(q, Settlement(a.lock_token, Outcome.COMPLETE))
    await stage(store, q, t, [settle, settle])
    with pytest.raises(BusdError):
        await store.commit_transaction(q, [], t)
    assert len(await store.peek(q, 0, 10)) == 1


async def test_every_outcome_applies_at_the_commit(store, make_queue, tokens):
    q = make_queue()
    await store.send(q, [NewMessage(b"x") for _ in range(4)])
    ms = await store.receive(q, 4, ReceiveMode.PEEK_LOCK, tokens(4))
    outcomes = [Outcome.COMPLETE, Outcome.ABANDON, Outcome.DEFER, Outcome.DEAD_LETTER]
    t = txn()
    await stage(
        store,
        q,
        t,
        [
            StagedSettlement(q, Settlement(m.lock_token, o, dead_letter_reason="why"))
            for m, o in zip(ms, outcomes)
        ],
    )
    await store.commit_transaction(q, [], t)
    counts = await store.counts(q)
    assert (counts.active, counts.deferred, counts.dead_letter, counts.locked) == (1, 1, 1, 0)
    (again,) = await store.receive(q, 1, ReceiveMode.PEEK_LOCK, tokens(1))
    assert (again.seq, again.delivery_count) == (ms[1].seq, 1)
    (dead,) = await store.peek(q.dead_letter_queue, 0, 10)
    assert dead.dead_letter_reason == "why"


async def test_the_operation_limit_stages_nothing_past_it(store, make_queue):
    q = make_queue()
    t = txn()
    await stage(store, q, t, [StagedSend(q, NewMessage(b"%d" % i)) for i in range(3)], limit=4)
    with pytest.raises(BusdError) as err:
        await stage(
            store, q, t, [StagedSend(q, NewMessage(b"x")) for _ in range(2)], first=False, limit=4
        )
    assert err.value.condition == Condition.RESOURCE_LIMIT
    await store.commit_transaction(q, [], t)
    assert len(await store.peek(q, 0, 10)) == 3


async def test_past_its_time_a_transaction_is_refused_and_swept(store, make_queue):
    q = make_queue()
    t, other = txn(), txn()
    await stage(store, q, t, [StagedSend(q, NewMessage(b"a"))], timeout_ms=1)
    await stage(store, q, other, [StagedSend(q, NewMessage(b"b"))])
    import asyncio

    await asyncio.sleep(0.01)
    with pytest.raises(BusdError) as err:
        await stage(store, q, t, [StagedSend(q, NewMessage(b"c"))], first=False)
    assert err.value.condition == Condition.TRANSACTION_TIMEOUT
    assert await store.sweep_transactions(q) == 1
    with pytest.raises(BusdError) as err:
        await store.commit_transaction(q, [], t)
    assert err.value.condition == Condition.TRANSACTION_TIMEOUT
    await store.commit_transaction(q, [], other)  # the live one is untouched
    assert [m.blob for m in await store.peek(q, 0, 10)] == [b"b"]


async def test_session_work_needs_the_session_lock_at_the_commit(store, make_queue, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=60_000)
    await store.send(q, [NewMessage(b"a", session_id="s1")])
    await store.accept_session(q, "s1", "h1")
    (m,) = await store.receive_session(q, "s1", "h1", 1, ReceiveMode.PEEK_LOCK, tokens(1))
    ops = [
        StagedSettlement(
            q, Settlement(m.lock_token, Outcome.COMPLETE, session_id="s1"), holder="h1"
        ),
        StagedSessionState(q, "s1", "h1", b"done"),
    ]
    lost = txn()
    await stage(store, q, lost, ops)
    await store.release_session(q, "s1", "h1")
    with pytest.raises(BusdError) as err:
        await store.commit_transaction(q, [], lost)
    assert err.value.condition == Condition.SESSION_LOCK_LOST
    assert len(await store.peek(q, 0, 10)) == 1
    # held again: the same work commits
    await store.accept_session(q, "s1", "h1")
    (m,) = await store.receive_session(q, "s1", "h1", 1, ReceiveMode.PEEK_LOCK, tokens(1))
    ops[0].settlement.token = m.lock_token
    held = txn()
    await stage(store, q, held, ops)
    assert await store.get_session_state(q, "s1", "h1") is None
    await store.commit_transaction(q, [], held)
    assert await store.peek(q, 0, 10) == []
    assert await store.get_session_state(q, "s1", "h1") == b"done"


async def test_cancel_of_a_scheduled_message_applies_at_the_commit(store, make_queue, server_now):
    q = make_queue()
    (seq,) = await store.schedule(q, [NewMessage(b"later", scheduled_ms=server_now() + 60_000)])
    t = txn()
    await stage(store, q, t, [StagedCancel(q, seq)])
    assert len(await store.peek(q, 0, 10)) == 1
    await store.commit_transaction(q, [], t)
    assert await store.peek(q, 0, 10) == []


@pytest.mark.not_on("cluster", reason=CROSS_SLOT)
async def test_commits_leave_no_encoded_call_behind(store, make_queue):
    """A commit's keys are whatever entities the transaction named: the client does not
    keep its encoded call head (one per set would grow without end)."""
    for _ in range(3):
        q, other = make_queue(), make_queue()
        t = txn()
        await stage(store, q, t, [StagedSend(other, NewMessage(b"a"))])
        await store.commit_transaction(q, [other], t)
    heads = getattr(store._scripts, "_heads", {})
    assert not [k for k in heads if k[0] == "commitTransaction"]


@pytest.mark.not_on("cluster", reason=CROSS_SLOT)
async def test_a_topic_send_fans_out_at_the_commit_to_the_copies_staged(store, make_queue):
    """The copies were decided when the send was staged: a subscription deleted since gets
    none; duplicate detection is the topic's; a topic gone refuses the whole commit."""
    import uuid

    from busd.storage.messages import Placement
    from busd.storage.specs import TopicSpec, subscription_path
    from busd.storage.staged import StagedPublish

    name = f"t-{uuid.uuid4().hex[:8]}"
    subs = [QueueSpec(subscription_path(name, n), topic=name) for n in ("a", "b")]
    await store.open_subscriptions(name, ["a", "b"])
    topic = TopicSpec(name, duplicate_detection_window_ms=60_000)
    q = make_queue()

    def publish(blob: bytes, message_id: str | None = None) -> StagedPublish:
        return StagedPublish(
            topic,
            NewMessage(blob, message_id=message_id),
            ["a", "b", "gone"],
            [Placement(0), Placement(1, blob=b"own"), Placement(2)],
        )

    t = txn()
    await stage(store, q, t, [publish(b"m", "id-1"), publish(b"dup", "id-1")])
    await store.drop_subscriptions(name, [subs[1]])
    await store.commit_transaction(q, [], t, [(topic, subs[:1])])
    (copy,) = await store.peek(subs[0], 0, 10)
    assert copy.blob == b"m"
    assert (await store.counts(subs[1])).active == 0
    assert (await store.topic_totals(topic))["duplicates"] == 1
    t = txn()
    await stage(store, q, t, [StagedSend(q, NewMessage(b"out")), publish(b"lost")])
    with pytest.raises(BusdError) as err:  # the topic is not named: it was deleted
        await store.commit_transaction(q, [], t)
    assert err.value.condition == Condition.TRANSACTION_ROLLBACK
    assert await store.peek(q, 0, 10) == []
