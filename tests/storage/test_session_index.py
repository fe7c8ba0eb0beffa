"""A session message is in one of its session's indexes at a time (lua/includes/fileMessage.lua):
available in sready, in flight in sinflight, deferred or scheduled in sall. It moves between
them with its state, and a send that hands it over puts it in flight at once. Whatever reads a
session's messages reads all three; a message written by a store before this layout (in sall
too) is listed once and leaves sall cleanly. On one server, whose keys the test reads."""

from __future__ import annotations

import asyncio
import time

import redis

from busd.storage import keys as keyspace
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec

PL = ReceiveMode.PEEK_LOCK


def msgs(sid: str, *bodies: bytes) -> list[NewMessage]:
    return [NewMessage(b, session_id=sid) for b in bodies]


class Index:
    """The session indexes of one queue, read straight from the server."""

    def __init__(self, url: str, store: RedisStore, q: QueueSpec) -> None:
        self.url, self.prefix, self.q = url, store.prefix, q

    def _seqs(self, name: str, sid: str) -> list[int]:
        key = keyspace.key(self.prefix, self.q.key_scope[0], name)
        with redis.Redis.from_url(self.url) as client:
            members = client.zrangebylex(
                key, b"[" + sid.encode() + b"\0", b"(" + sid.encode() + b"\1"
            )
        return [int(m.split(b"\0")[1]) for m in members]

    def listed(self, sid: str) -> list[int]:
        return self._seqs("q.sall", sid)

    def in_flight(self, sid: str) -> list[int]:
        return self._seqs("q.sinflight", sid)

    def ready(self, sid: str) -> list[int]:
        return self._seqs("q.sready", sid)

    def everything(self) -> list[int]:
        """q.all: every message of the queue but those in flight under a session lock."""
        with redis.Redis.from_url(self.url) as client:
            key = keyspace.key(self.prefix, self.q.key_scope[0], "q.all")
            return [int(s) for s in client.zrange(key, 0, -1)]

    def as_written_before(self, sid: str, seq: int) -> None:
        """Leave the message as a store before this layout did: in sall and in q.all, its
        metadata without the flags that say it is out of them."""
        body, sall, everything = (
            keyspace.key(self.prefix, self.q.key_scope[0], k) for k in ("q.body", "q.sall", "q.all")
        )
        with redis.Redis.from_url(self.url) as client:
            client.eval(
                "local m = cmsgpack.unpack(redis.call('HGET', KEYS[1], ARGV[1])); "
                "m.xs = nil; m.xa = nil; "
                "redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(m)); "
                "redis.call('ZADD', KEYS[2], 0, ARGV[2]); "
                "redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])",
                3,
                body,
                sall,
                everything,
                f"m{seq}",
                sid.encode() + b"\0" + b"%016d" % seq,
                seq,
            )


async def test_a_session_message_moves_between_the_indexes_of_its_states(
    store, make_queue, redis_url, tokens
):
    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    seqs = await store.send(q, msgs("s1", b"a", b"b", b"c", b"d"))
    assert index.ready("s1") == seqs and index.listed("s1") == []
    await store.accept_session(q, "s1", "h1")
    got = await store.receive_session(q, "s1", "h1", 3, PL, tokens(3))
    assert [m.seq for m in got] == seqs[:3]
    assert index.ready("s1") == seqs[3:] and index.in_flight("s1") == seqs[:3]
    assert index.listed("s1") == []
    # whatever reads the session's messages reads every index
    assert [m.seq for m in await store.peek(q, 0, 10, session_id="s1")] == seqs
    (page,) = (await store.session_page(q, "id", None, 10)).sessions
    assert (page.active, page.in_flight, page.deferred) == (1, 3, 0)
    a, b, c = got
    await store.settle(
        q,
        [
            Settlement(a.lock_token, Outcome.ABANDON, "s1"),
            Settlement(b.lock_token, Outcome.COMPLETE, "s1"),
            Settlement(c.lock_token, Outcome.DEFER, "s1"),
        ],
        "h1",
    )
    # abandoned: available again; deferred: in sall; completed: in none
    assert index.ready("s1") == [seqs[0], seqs[3]] and index.listed("s1") == [seqs[2]]
    assert index.in_flight("s1") == []
    (again,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    assert again.seq == seqs[0] and index.ready("s1") == [seqs[3]]
    await store.receive_deferred(q, [seqs[2]], PL, tokens(1), session_id="s1", holder="h1")
    assert index.listed("s1") == [] and index.in_flight("s1") == [seqs[0], seqs[2]]
    await store.release_session(q, "s1", "h1")  # the lock's end unlocks what is in flight
    assert index.ready("s1") == [seqs[0], seqs[3]] and index.listed("s1") == [seqs[2]]
    assert index.in_flight("s1") == []
    assert sorted(await store.list_sessions(q, 0, 10, None)) == ["s1"]
    (page,) = (await store.session_page(q, "id", None, 10)).sessions
    assert (page.active, page.in_flight, page.deferred) == (2, 0, 1)
    assert [m.seq for m in await store.peek(q, 0, 10, session_id="s1")] == [
        seqs[0],
        *seqs[2:],
    ]


async def test_a_message_handed_over_is_never_in_the_session_index(store, make_queue, redis_url):
    from busd.storage.messages import HandOver, LockTokens

    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    holder = f"{store.process_id}:1"
    await store.accept_session(q, "s1", holder)
    sent = await store.send_handing_over(
        q, msgs("s1", b"a"), [HandOver("s1", holder, 1, LockTokens(1))]
    )
    ((m,),) = sent.handed
    assert index.listed("s1") == [] and index.in_flight("s1") == [m.seq]
    # the session, held with a message in flight, is listed; dead-lettering it takes that too
    assert await store.list_sessions(q, 0, 10, None) == ["s1"]
    assert await store.dead_letter_session(q, "s1", "why", None) == 1
    assert index.in_flight("s1") == []
    dead = await store.peek(q.dead_letter_queue, 0, 10)
    assert [d.seq for d in dead] == [m.seq]


async def test_a_message_locked_by_a_store_written_before_settles_cleanly(
    store, make_queue, redis_url, tokens
):
    """A message locked before this layout is in both indexes, and its metadata does not say
    it left the session's index: completed, it leaves both; the session is then forgotten."""
    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    (seq,) = await store.send(q, msgs("s1", b"a"))
    await store.accept_session(q, "s1", "h1")
    (m,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    index.as_written_before("s1", seq)
    assert index.listed("s1") == [seq] and index.in_flight("s1") == [seq]
    assert [p.seq for p in await store.peek(q, 0, 10, session_id="s1")] == [seq]  # listed once
    assert index.everything() == [seq] and [p.seq for p in await store.peek(q, 0, 10)] == [seq]
    await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE, "s1")], "h1")
    assert index.listed("s1") == [] and index.in_flight("s1") == []
    assert index.everything() == []
    await store.release_session(q, "s1", "h1")
    assert await store.list_sessions(q, 0, 10, None) == []


async def test_a_lock_that_ends_dead_lettering_one_message_keeps_the_session_of_the_others(
    store, make_queue, redis_url, tokens
):
    """The end of a lock returns the messages in flight one by one, with a counted attempt:
    one at its last attempt is dead-lettered, and the session, whose other message is still
    in flight at that moment, is not forgotten: it stays listed with what came back."""
    q = make_queue(requires_session=True, max_delivery_count=2, lock_duration_ms=100)
    (first, second) = await store.send(q, msgs("s1", b"a", b"b"))
    await store.accept_session(q, "s1", "h1")
    (a,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    await store.settle(q, [Settlement(a.lock_token, Outcome.ABANDON, "s1")], "h1")  # count 1
    got = await store.receive_session(q, "s1", "h1", 2, PL, tokens(2))
    assert [m.seq for m in got] == [first, second]
    await asyncio.sleep(0.25)
    await store.sweep(q)  # the lock ran out: a's second attempt dead-letters it, b comes back
    assert [m.seq for m in await store.peek(q.dead_letter_queue, 0, 10)] == [first]
    assert await store.list_sessions(q, 0, 10, None) == ["s1"]
    assert Index(redis_url, store, q).ready("s1") == [second]
    lock = await store.accept_session(q, None, "h2")
    assert lock is not None and lock.session_id == "s1"


async def test_a_scheduled_message_is_in_sall_until_it_is_due(store, make_queue, redis_url):
    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    due = int(time.time() * 1000) + 300
    (seq,) = await store.schedule(q, [NewMessage(b"later", session_id="s1", scheduled_ms=due)])
    assert index.listed("s1") == [seq] and index.ready("s1") == []
    await asyncio.sleep(0.45)
    await store.sweep(q)  # due: enqueued, available, so in sready alone
    assert index.listed("s1") == [] and index.ready("s1") == [seq]
    lock = await store.accept_session(q, None, "h1")
    assert lock is not None and lock.session_id == "s1"


async def test_clearing_the_state_of_a_session_with_only_available_messages_keeps_it(
    store, make_queue, tokens
):
    """An operator's write of the state of a session nobody holds looks at every index of its
    messages before it forgets the session: available ones keep it."""
    q = make_queue(requires_session=True)
    (seq,) = await store.send(q, msgs("s1", b"a"))
    await store.set_session_state(q, "s1", "", b"state")
    await store.set_session_state(q, "s1", "", None)
    assert await store.list_sessions(q, 0, 10, None) == ["s1"]
    lock = await store.accept_session(q, None, "h1")
    assert lock is not None and lock.session_id == "s1"
    (m,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    assert m.seq == seq


async def test_an_available_message_written_before_leaves_sall_when_taken(
    store, make_queue, redis_url, tokens
):
    """An available message written before this layout is in sall and sready, and its metadata
    does not say it is out of sall: listed once, taken out of both, and completed cleanly."""
    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    (seq,) = await store.send(q, msgs("s1", b"a"))
    index.as_written_before("s1", seq)
    assert index.listed("s1") == [seq] and index.ready("s1") == [seq]
    assert [p.seq for p in await store.peek(q, 0, 10, session_id="s1")] == [seq]  # listed once
    (page,) = (await store.session_page(q, "id", None, 10)).sessions
    assert (page.active, page.deferred) == (1, 0)
    await store.accept_session(q, "s1", "h1")
    (m,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    assert index.listed("s1") == [] and index.ready("s1") == [] and index.in_flight("s1") == [seq]
    await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE, "s1")], "h1")
    await store.release_session(q, "s1", "h1")
    assert await store.list_sessions(q, 0, 10, None) == []


async def test_a_message_in_flight_under_a_session_lock_is_out_of_q_all_yet_seen(
    store, make_queue, redis_url, tokens
):
    """q.all leaves out a session message in flight (lua/includes/lockMessage.lua): one handed
    over is never put there, one received leaves it, one that comes back returns, one completed
    in flight costs it nothing. Peeking, counting, sizing and purging still see every message."""
    from busd.storage.messages import HandOver, LockTokens

    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    holder = f"{store.process_id}:1"
    (a,) = await store.send(q, msgs("s2", b"a"))  # s2 is not held: filed
    await store.accept_session(q, "s1", holder)
    sent = await store.send_handing_over(
        q, msgs("s1", b"bb"), [HandOver("s1", holder, 1, LockTokens(1))]
    )
    ((b,),) = sent.handed
    (c,) = await store.send(q, msgs("s1", b"ccc"))  # no offer: filed
    assert index.everything() == [a, c]
    (got,) = await store.receive_session(q, "s1", holder, 1, PL, tokens(1))
    assert got.seq == c and index.everything() == [a] and index.in_flight("s1") == [b.seq, c]
    # peeked in sequence order with the rest, from any point, up to any count
    assert [m.seq for m in await store.peek(q, 0, 10)] == [a, b.seq, c]
    assert [m.seq for m in await store.peek(q, 0, 2)] == [a, b.seq]
    assert [m.seq for m in await store.peek(q, b.seq, 1)] == [b.seq]
    assert [m.seq for m in await store.peek(q, c, 10)] == [c]
    counts = await store.counts(q)
    assert (counts.active, counts.locked, counts.oldest_enqueued_ms is not None) == (1, 2, True)
    in_flight_size = await store.size_in_bytes(q)
    # back from flight: in q.all again; completed in flight: in neither
    await store.settle(q, [Settlement(got.lock_token, Outcome.ABANDON, "s1")], holder)
    assert index.everything() == [a, c]
    await store.settle(q, [Settlement(b.lock_token, Outcome.COMPLETE, "s1")], holder)
    assert index.everything() == [a, c] and index.in_flight("s1") == []
    assert [m.seq for m in await store.peek(q, 0, 10)] == [a, c]
    (again,) = await store.receive_session(q, "s1", holder, 1, PL, tokens(1))
    assert again.seq == c and index.everything() == [a]
    # b, completed, no longer counts; c counts the same filed as in flight
    await store.release_session(q, "s1", holder)
    assert index.everything() == [a, c]
    filed_size = await store.size_in_bytes(q)
    assert 0 < filed_size < in_flight_size
    await store.accept_session(q, "s1", holder)
    await store.receive_session(q, "s1", holder, 1, PL, tokens(1))
    assert await store.size_in_bytes(q) == filed_size
    assert await store.purge(q) == 2  # a, and c in flight
    assert index.everything() == [] and await store.peek(q, 0, 10) == []
