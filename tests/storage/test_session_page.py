"""The session inspector's pages (lua/sessionPage.lua): every session once, in each sort's
order, with a store cost per page that does not grow with the number of sessions; the last
activity settles record; and an operator's release of a session lock."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from busd.errors import Condition
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement

PAGE = 250


def _commands(redis_url: str) -> int:
    """Commands the server has run so far (those run inside scripts included)."""
    client = redis.Redis.from_url(redis_url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(int(v["calls"]) for v in stats.values())


async def _fill(store, queue, count: int) -> None:
    batch = 1000  # one send call (one script) per thousand sessions
    for start in range(0, count, batch):
        await store.send(
            queue,
            [
                NewMessage(b"x", session_id=f"s{i:05d}")
                for i in range(start, min(count, start + batch))
            ],
        )


async def _page_cost(store, queue, redis_url: str) -> int:
    before = _commands(redis_url)
    await store.session_page(queue, "id", "s00100", PAGE)
    return _commands(redis_url) - before


async def test_pages_cover_every_session_once_at_a_cost_that_does_not_grow(
    store, make_queue, redis_url
):
    small = make_queue(requires_session=True)
    big = make_queue(requires_session=True)
    await _fill(store, small, 500)
    await _fill(store, big, 5000)
    # the store's work for one page: the same with 500 sessions as with 5,000
    assert await _page_cost(store, big, redis_url) == await _page_cost(store, small, redis_url)

    seen: list[str] = []
    after = None
    while True:
        page = await store.session_page(big, "id", after, PAGE)
        assert page.total == 5000
        seen += [d.session_id for d in page.sessions]
        assert all(
            (d.active, d.in_flight, d.deferred, d.scheduled) == (1, 0, 0, 0) for d in page.sessions
        )
        after = page.next
        if after is None:
            break
    assert seen == [f"s{i:05d}" for i in range(5000)]


async def test_sorts_follow_their_index_and_columns_count_by_state(store, make_queue, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=30_000)
    await store.send(q, [NewMessage(b"a", session_id="late")])
    await store.send(q, [NewMessage(b"b", session_id="early"), NewMessage(b"c", session_id="x")])
    await store.send(q, [NewMessage(b"d", session_id="early")])
    lock = await store.accept_session(q, "x", "h1", count=1, tokens=tokens(1))
    await store.set_session_state(q, "x", "h1", b"0123456789" * 10)
    # the free sessions by their oldest message: "late" was sent first
    waiting = await store.session_page(q, "waiting", None, 10)
    assert [d.session_id for d in waiting.sessions] == ["late", "early"]
    assert waiting.sessions[1].active == 2
    (held,) = (await store.session_page(q, "locked", None, 10)).sessions
    assert (held.session_id, held.holder, held.locked_until_ms) == ("x", "h1", lock.locked_until_ms)
    assert (held.active, held.in_flight, held.state_size) == (0, 1, 100)
    assert held.state_preview == b"0123456789" * 3 + b"01"
    # paging a score-sorted index by its cursor
    first = await store.session_page(q, "waiting", None, 1)
    second = await store.session_page(q, "waiting", first.next, 1)
    assert [first.sessions[0].session_id, second.sessions[0].session_id] == ["late", "early"]
    with pytest.raises(Exception, match="unknown sort"):
        await store.session_page(q, "nope", None, 1)


async def test_an_operator_release_loses_the_holders_lock(store, make_queue, tokens):
    q = make_queue(requires_session=True, lock_duration_ms=30_000)
    await store.send(q, [NewMessage(b"a", session_id="s")])
    lock = await store.accept_session(q, "s", "h1", count=1, tokens=tokens(1))
    assert await store.drop_session_lock(q, "s") is True
    assert await store.drop_session_lock(q, "s") is False
    (refused,) = await store.settle(
        q, [Settlement(lock.messages[0].lock_token, Outcome.COMPLETE, session_id="s")], "h1"
    )
    assert refused == Condition.SESSION_LOCK_LOST
    again = await store.accept_session(
        q, "s", "h2", count=1, tokens=tokens(1), mode=ReceiveMode.PEEK_LOCK
    )
    assert [m.blob for m in again.messages] == [b"a"]  # available again, uncounted
    assert again.messages[0].delivery_count == 0


async def test_a_lost_session_lock_ends_as_an_expired_one(store, make_queue, tokens):
    """A fault on demand (docs/faults.md) ends the lock as its expiry does: the holder is
    refused, the next acceptor takes the session at once, the attempt is counted."""
    q = make_queue(requires_session=True, lock_duration_ms=30_000)
    await store.send(q, [NewMessage(b"a", session_id="s")])
    lock = await store.accept_session(q, "s", "h1", count=1, tokens=tokens(1))
    assert await store.lose_session_lock(q, "s") is True
    assert await store.lose_session_lock(q, "s") is False
    (refused,) = await store.settle(
        q, [Settlement(lock.messages[0].lock_token, Outcome.COMPLETE, session_id="s")], "h1"
    )
    assert refused == Condition.SESSION_LOCK_LOST
    again = await store.accept_session(
        q, "s", "h2", count=1, tokens=tokens(1), mode=ReceiveMode.PEEK_LOCK
    )
    assert [m.blob for m in again.messages] == [b"a"]
    assert again.messages[0].delivery_count == 1


async def _last_activity(store, queue) -> int:
    (row,) = (await store.session_page(queue, "id", None, 10)).sessions
    return row.last_activity_ms


async def _complete(store, queue, message) -> None:
    done = Settlement(message.lock_token, Outcome.COMPLETE, session_id="s")
    assert await store.settle(queue, [done], "h1") == [None]


async def test_settles_record_the_last_activity_once_a_second(store, make_queue, tokens):
    """A settle writes its session's last activity unless it (or the accept) wrote it less
    than a second ago (lua/includes/noteActivity.lua): the settles in between cost no write,
    and the recorded time lags by less than that."""
    q = make_queue(requires_session=True, lock_duration_ms=60_000)
    await store.send(q, [NewMessage(b"%d" % i, session_id="s") for i in range(4)])
    # the fourth stays in flight: the inspector lists a held session that has messages
    a, b, c, _ = (await store.accept_session(q, "s", "h1", count=4, tokens=tokens(4))).messages
    first = await _last_activity(store, q)  # the accept's
    await _complete(store, q, a)
    await _complete(store, q, b)
    if time.time() * 1000 - first < 900:  # (a machine slower than that: no claim)
        assert await _last_activity(store, q) == first
    await asyncio.sleep(1.05)
    await _complete(store, q, c)
    assert await _last_activity(store, q) >= first + 1000


async def test_a_short_lock_has_its_last_activity_recorded_more_often(store, make_queue, tokens):
    """Once a quarter of the lock duration when that is under a second: a session settling
    more often than its lock lasts never looks stuck."""
    q = make_queue(requires_session=True, lock_duration_ms=800)
    await store.send(q, [NewMessage(b"%d" % i, session_id="s") for i in range(3)])
    a, b, _ = (await store.accept_session(q, "s", "h1", count=3, tokens=tokens(3))).messages
    await _complete(store, q, a)
    first = await _last_activity(store, q)
    await asyncio.sleep(0.25)
    await _complete(store, q, b)
    assert await _last_activity(store, q) >= first + 200


async def test_the_holders_connection_shows_while_held_and_goes_with_the_session(
    store, make_queue, redis_url
):
    """The accept writes its holder's connection beside the session's last activity
    (lua/includes/noteActivity.lua); the inspector shows it while the session is held, a later
    holder's replaces it, and nothing of it is left once the session is forgotten. A session
    whose connection an earlier busd kept in `sclient` still shows it."""
    from busd.storage import keys as keyspace

    q = make_queue(requires_session=True, lock_duration_ms=30_000)
    await store.send(q, [NewMessage(b"a", session_id="s1"), NewMessage(b"b", session_id="s2")])
    assert (await store.accept_session(q, "s1", "h1", client="c1\0127.0.0.1:1")) is not None

    async def shown(sid: str) -> tuple[str | None, str | None]:
        page = await store.session_page(q, "id", None, 10)
        (row,) = [s for s in page.sessions if s.session_id == sid]
        return row.holder, row.client

    assert await shown("s1") == ("h1", "c1\0127.0.0.1:1")
    await store.release_session(q, "s1", "h1")
    assert await shown("s1") == (None, None)  # not held: no connection shown
    assert (await store.accept_session(q, "s1", "h2")) is not None  # its connection unknown
    assert await shown("s1") == ("h2", None)  # not the earlier holder's
    # an earlier busd's record of a holder's connection
    with redis.Redis.from_url(redis_url) as client:
        sactive = keyspace.key(store.prefix, q.key_scope[0], "sactive")
        client.hdel(sactive, "s2\0c")
        assert (await store.accept_session(q, "s2", "h3")) is not None
        client.hdel(sactive, "s2\0c")
        client.hset(keyspace.key(store.prefix, q.key_scope[0], "sclient"), "s2", "old\0addr")
        assert await shown("s2") == ("h3", "old\0addr")
        # both sessions emptied and let go: forgotten, their fields with them
        for sid, holder in (("s1", "h2"), ("s2", "h3")):
            (m,) = await store.receive_session(
                q, sid, holder, 1, ReceiveMode.PEEK_LOCK, [b"t" * 16]
            )
            assert await store.settle(
                q, [Settlement(m.lock_token, Outcome.COMPLETE, sid)], holder
            ) == [None]
            await store.release_session(q, sid, holder)
        assert client.hlen(sactive) == 0
