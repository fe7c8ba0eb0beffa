"""A session message in flight is in the queue's in-flight index instead of its index of the
session's messages (lua/includes/lockMessage.lua): taken out when it is locked (or never put
there when a send hands it over), put back when it is unlocked, neither when it is completed.
Whatever reads a session's messages reads both. On one server, whose keys the test reads."""

from __future__ import annotations

import asyncio

import redis

from busd.storage import keys as keyspace
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis_store import RedisStore
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


async def test_a_message_in_flight_leaves_the_session_index_and_comes_back_unlocked(
    store, make_queue, redis_url, tokens
):
    q = make_queue(requires_session=True)
    index = Index(redis_url, store, q)
    seqs = await store.send(q, msgs("s1", b"a", b"b", b"c", b"d"))
    await store.accept_session(q, "s1", "h1")
    got = await store.receive_session(q, "s1", "h1", 3, PL, tokens(3))
    assert [m.seq for m in got] == seqs[:3]
    assert index.listed("s1") == seqs[3:] and index.in_flight("s1") == seqs[:3]
    # whatever reads the session's messages reads both indexes
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
    # abandoned and deferred: back in the session's index; completed: in neither
    assert index.listed("s1") == [seqs[0], seqs[2], seqs[3]] and index.in_flight("s1") == []
    (again,) = await store.receive_session(q, "s1", "h1", 1, PL, tokens(1))
    assert again.seq == seqs[0] and index.listed("s1") == seqs[2:]
    await store.release_session(q, "s1", "h1")  # the lock's end unlocks what is in flight
    assert index.listed("s1") == [seqs[0], *seqs[2:]] and index.in_flight("s1") == []
    assert sorted(await store.list_sessions(q, 0, 10, None)) == ["s1"]


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
    body = keyspace.key(store.prefix, q.key_scope[0], "q.body")
    sall = keyspace.key(store.prefix, q.key_scope[0], "q.sall")
    with redis.Redis.from_url(redis_url) as client:  # as the layout before left it
        client.eval(
            "local m = cmsgpack.unpack(redis.call('HGET', KEYS[1], ARGV[1])); m.xs = nil; "
            "redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(m)); "
            "redis.call('ZADD', KEYS[2], 0, ARGV[2])",
            2,
            body,
            sall,
            f"m{seq}",
            b"s1\0" + b"%016d" % seq,
        )
    assert index.listed("s1") == [seq] and index.in_flight("s1") == [seq]
    assert [p.seq for p in await store.peek(q, 0, 10, session_id="s1")] == [seq]  # listed once
    await store.settle(q, [Settlement(m.lock_token, Outcome.COMPLETE, "s1")], "h1")
    assert index.listed("s1") == [] and index.in_flight("s1") == []
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
    assert Index(redis_url, store, q).listed("s1") == [second]
    lock = await store.accept_session(q, None, "h2")
    assert lock is not None and lock.session_id == "s1"
