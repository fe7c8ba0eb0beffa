"""What a short session's own steps cost the store, command by command (docs/design.md §3.19):
the accept that locks it and takes its first messages, their settle, and the release of the
emptied session.
A change that makes them cost more must change the bounds here, on purpose."""

from __future__ import annotations

import pytest
import redis

from busd.storage import keys as keyspace
from busd.storage.messages import LockTokens, NewMessage, Outcome, ReceiveMode, Settlement

pytestmark = pytest.mark.every_store

PL = ReceiveMode.PEEK_LOCK
PER_SESSION = 3  # messages, as scripts/bench --scenario churn-5000 sends
ROUNDS = 5

# A next-available accept with credit that takes a session's 3 messages, the queue's lazy
# housekeeping held off (its quiet window, lua/includes/housekeeping.lua: how often it looks
# depends on the machine, not on the accept). Measured 26: the script, TIME, the window's
# EXISTS, the free session (ZRANGE), the lock (HSET, ZADD, ZREM of sfree), the inspector's
# last activity and connection (2 HSET), the session's available messages (ZRANGEBYLEX), the
# count received (HINCRBY), and 5 per message (read, out of sready, into sinflight, out of
# q.all, metadata written); 16 since the messages of one look move in one command per index
# (lua/includes/takeSessionMessages.lua): 5 for all of them. 14 since the free session is
# found and taken off `sfree` by one ZPOPMIN, and the holder's connection is written with the
# last activity in one HSET (lua/includes/noteActivity.lua).
ACCEPT_COMMANDS = 14
# The release of the session once its messages are settled. Measured 14: the script, TIME,
# its holder and the lock's end (HGET, ZSCORE), the lock (HDEL, ZREM), the inspector's
# connection (HDEL), the session's three indexes of messages (ZLEXCOUNT each), its state
# (HEXISTS) and, with neither, the session forgotten (ZREM of sessions and supdated, HDEL of
# sactive); 13 since the lock's end is read only when the session has messages to return
# (lua/includes/unlockSession.lua); 12 since the holder's connection is a field beside the
# last activity, deleted with it when the session is forgotten (not by the release).
RELEASE_COMMANDS = 12
# The settle of the session's three messages in one call (their links' settlements of one turn
# come in one call, busd/storage/redis/coalesce.py). Measured 13: the script, TIME, the lock's
# end once (ZSCORE), 3 per message (its metadata read, out of sinflight, its body and metadata
# deleted) and the count completed (HINCRBY); 9 since the completions of a call are removed
# with one command per key for all of them (lua/includes/removeFrom.lua).
SETTLE_COMMANDS = 9
# A send of 3 messages to each of 5 sessions in one call, interleaved. Measured 84 when each
# message made its own commands: the script, TIME, the sequence numbers (INCRBY) and the count
# sent (HINCRBY); per session its holder (HGET), its place in the session index and in sfree
# (ZADD each) and the wake-up of a waiting receiver (ZPOPMIN); per message q.all, sready and
# the expiry index (ZADD each) and its body (HSET). 12 since what a call adds is made with one
# command per key (lua/includes/addTo.lua) and its holders read with one HMGET: the same
# whatever the number of messages and sessions.
SEND_COMMANDS = 12
SEND_SESSIONS = 5


def _commands(client: redis.Redis) -> int:
    """Commands the server has run so far (those inside scripts included), less INFO."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


@pytest.mark.not_on("cluster", reason="counts one server's commands")
@pytest.mark.not_on("partitioned", reason="counts one server's commands")
async def test_a_send_to_many_sessions_costs_a_command_per_index(store, store_url, make_queue):
    q = make_queue(requires_session=True, lock_duration_ms=30_000, default_ttl_ms=3_600_000)
    holder = f"{store.process_id}:1"
    sids = [f"s{i}" for i in range(SEND_SESSIONS)]
    # interleaved, as many senders' messages coalesced into one call arrive
    batch = [NewMessage(b"%s-%d" % (sid.encode(), i), session_id=sid)
             for i in range(PER_SESSION) for sid in sids]  # fmt: skip
    with redis.Redis.from_url(store_url) as client:
        await store.counts(q)  # the store's connection made, and the queue's context known
        before = _commands(client)
        seqs = await store.send(q, batch)
        sent = _commands(client) - before
    assert sent <= SEND_COMMANDS, sent
    assert len(set(seqs)) == len(batch)
    counts = await store.counts(q)
    assert counts.active == len(batch)
    # every session free, oldest first, each with its messages in the order sent
    for sid in sids:
        lock = await store.accept_session(
            q, None, holder, count=10, mode=PL, tokens=LockTokens(10), client="c\0a",
            waiting=False,
        )  # fmt: skip
        assert lock is not None and lock.session_id == sid
        assert [m.blob for m in lock.messages] == [b"%s-%d" % (sid.encode(), i) for i in range(3)]
        assert all(m.expires_ms is not None for m in lock.messages)


@pytest.mark.not_on("cluster", reason="counts one server's commands")
@pytest.mark.not_on("partitioned", reason="counts one server's commands")
async def test_a_short_sessions_accept_and_release_cost_few_commands(store, store_url, make_queue):
    q = make_queue(requires_session=True, lock_duration_ms=30_000)
    quiet = keyspace.key(store.prefix, q.key_scope[0], "quiet")
    holder = f"{store.process_id}:1"
    sids = [f"s{i}" for i in range(ROUNDS)]
    sent = {}
    for sid in sids:
        sent[sid] = await store.send(q, [NewMessage(b"%d" % i, session_id=sid) for i in range(3)])
    accepts, settles, releases = [], [], []
    with redis.Redis.from_url(store_url) as client:
        for sid in sids:
            client.set(quiet, b"1", px=60_000)
            before = _commands(client)
            lock = await store.accept_session(
                q,
                None,
                holder,
                count=10,
                mode=PL,
                tokens=LockTokens(10),
                client="c\0a",
                waiting=False,
            )
            accepts.append(_commands(client) - before)
            assert lock is not None and lock.session_id == sid  # the oldest free session
            # all of them, in order, locked for the holder: each settles
            assert [m.seq for m in lock.messages] == sent[sid]
            assert [m.blob for m in lock.messages] == [b"0", b"1", b"2"]
            settlements = [Settlement(m.lock_token, Outcome.COMPLETE, sid) for m in lock.messages]
            before = _commands(client)
            assert await store.settle(q, settlements, holder) == [None] * PER_SESSION
            settles.append(_commands(client) - before)
            before = _commands(client)
            await store.release_session(q, sid, holder, offered=False)
            releases.append(_commands(client) - before)
    # the lower count: whatever else reaches the server meanwhile only adds
    assert min(accepts) <= ACCEPT_COMMANDS, accepts
    assert min(settles) <= SETTLE_COMMANDS, settles
    assert min(releases) <= RELEASE_COMMANDS, releases
    counts = await store.counts(q)
    assert (counts.active, counts.locked) == (0, 0)
    assert await store.list_sessions(q, 0, 10, None) == []  # forgotten, nothing left behind
