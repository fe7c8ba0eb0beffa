"""Settlements and session receives of many receivers on one entity, coalesced into fewer
store calls (busd/storage/redis/coalesce.py): each receiver still gets its own outcome or messages,
checked against its own lock, and nothing is applied twice, taken twice or lost."""

from __future__ import annotations

import asyncio

import pytest

from busd.errors import Condition
from busd.storage.messages import NewMessage, Outcome, ReceiveMode, Settlement
from busd.storage.redis.coalesce import Coalescer


class Calls:
    """A stand-in for one lane's store call: records what each call was given."""

    def __init__(self, fail_on: object = None) -> None:
        self.made: list[list[object]] = []
        self.fail_on = fail_on
        self.release = asyncio.Event()

    async def run(self, items: list[object]) -> list[object]:
        self.made.append(list(items))
        await self.release.wait()
        if self.fail_on in items:
            raise RuntimeError("store unavailable")
        return [f"done {item}" for item in items]


async def test_what_comes_while_a_call_is_in_flight_goes_out_as_one_next_call():
    coalescer: Coalescer[object, object] = Coalescer()
    calls = Calls()
    first = asyncio.ensure_future(coalescer.call("lane", [1], calls.run))
    await asyncio.sleep(0)
    assert calls.made == [[1]]  # an idle lane calls at once
    later = [asyncio.ensure_future(coalescer.call("lane", [n, n + 10], calls.run)) for n in (2, 3)]
    other = asyncio.ensure_future(coalescer.call("other lane", [9], calls.run))
    await asyncio.sleep(0)
    assert calls.made == [[1], [9]]  # the lane's others wait; another lane does not
    calls.release.set()
    assert await first == ["done 1"]
    assert [await t for t in later] == [["done 2", "done 12"], ["done 3", "done 13"]]
    assert await other == ["done 9"]
    assert calls.made == [[1], [9], [2, 12, 3, 13]]  # in the order they came, each together
    assert await coalescer.call("lane", [4], calls.run) == ["done 4"]  # idle again: at once
    assert calls.made[-1] == [4]


async def test_a_failed_call_fails_each_of_its_callers_and_the_lane_goes_on():
    coalescer: Coalescer[object, object] = Coalescer()
    calls = Calls(fail_on="bad")
    first = asyncio.ensure_future(coalescer.call("lane", ["a"], calls.run))
    await asyncio.sleep(0)
    joined = [asyncio.ensure_future(coalescer.call("lane", [x], calls.run)) for x in ("b", "bad")]
    await asyncio.sleep(0)
    calls.release.set()
    assert await first == ["done a"]
    for task in joined:
        with pytest.raises(RuntimeError, match="store unavailable"):
            await task
    assert await coalescer.call("lane", ["c"], calls.run) == ["done c"]


@pytest.mark.every_store
async def test_many_holders_settling_at_once_each_get_their_own_outcome(
    store, store_kind, make_queue, tokens, redis_url
):
    """64 sessions, each held by its own holder with one message locked, settled at once as
    64 links would: each settlement is checked against its own holder's lock (a holder naming
    a session it does not hold is refused), every completed message is gone, an abandoned one
    is back with its count; on one server the 64 calls were made as fewer."""
    import redis

    q = make_queue(requires_session=True, lock_duration_ms=60_000)
    sessions = [f"s{i:02d}" for i in range(64)]
    await store.send(q, [NewMessage(f"m-{s}".encode(), session_id=s) for s in sessions])
    taken = {}
    for s in sessions:
        lock = await store.accept_session(
            q, s, f"holder-{s}", count=1, mode=ReceiveMode.PEEK_LOCK, tokens=tokens(1)
        )
        (taken[s],) = lock.messages
    abandoned = sessions[:4]

    def settle(s: str, holder: str):
        outcome = Outcome.ABANDON if s in abandoned else Outcome.COMPLETE
        return store.settle(q, [Settlement(taken[s].lock_token, outcome, session_id=s)], holder)

    with redis.Redis.from_url(redis_url) as client:
        before = client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)
        results = await asyncio.gather(
            settle("s63", "holder-s00"),  # not its holder: refused, nothing changes
            *(settle(s, f"holder-{s}") for s in sessions),
        )
        calls = client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0) - before
    assert results == [[Condition.SESSION_LOCK_LOST]] + [[None]] * 64
    if store_kind == "server":  # the cluster's scripts run on other servers
        assert 1 <= calls < 64
    for s in sessions:
        again = await store.receive_session(
            q, s, f"holder-{s}", 5, ReceiveMode.PEEK_LOCK, tokens(5)
        )
        if s in abandoned:
            assert [(m.blob, m.delivery_count) for m in again] == [(f"m-{s}".encode(), 1)]
        else:
            assert again == []
    counts = await store.counts(q)
    assert counts.active + counts.locked == len(abandoned)


@pytest.mark.every_store
async def test_many_holders_receiving_at_once_each_get_their_own_sessions_messages(
    store, store_kind, make_queue, tokens, redis_url
):
    """64 sessions held by their own holders, each with three messages, received at once as 64
    links woken by a send would: each receiver gets its own session's messages in order, up to
    what it asked, a receiver naming a session it does not hold is refused alone; on one
    server the 64 calls were made as fewer."""
    import redis

    q = make_queue(requires_session=True, lock_duration_ms=60_000)
    sessions = [f"s{i:02d}" for i in range(64)]
    for s in sessions:
        await store.accept_session(q, s, f"holder-{s}")
    await store.send(
        q, [NewMessage(f"{s}-{n}".encode(), session_id=s) for n in range(3) for s in sessions]
    )

    def receive(s: str, holder: str, count: int):
        return store.receive_session(q, s, holder, count, ReceiveMode.PEEK_LOCK, tokens(count))

    with redis.Redis.from_url(redis_url) as client:
        before = client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)
        results = await asyncio.gather(
            receive("s63", "holder-s00", 3),  # not its holder: refused, nothing taken
            *(receive(s, f"holder-{s}", 1 + i % 3) for i, s in enumerate(sessions)),
            return_exceptions=True,
        )
        calls = client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0) - before
    refused, *received = results
    assert getattr(refused, "condition", None) == Condition.SESSION_LOCK_LOST
    for i, (s, got) in enumerate(zip(sessions, received)):
        assert [m.blob for m in got] == [f"{s}-{n}".encode() for n in range(1 + i % 3)]
        assert all(m.session_id == s and m.lock_token for m in got)
    if store_kind == "server":  # the cluster's scripts run on other servers
        assert 1 <= calls < 64
    for i, s in enumerate(sessions):  # the rest, once each
        rest = await receive(s, f"holder-{s}", 5)
        assert [m.blob for m in rest] == [f"{s}-{n}".encode() for n in range(1 + i % 3, 3)]


async def test_a_coalesced_call_carries_whole_callers_up_to_its_limit(monkeypatch):
    from busd.storage.redis import coalesce

    monkeypatch.setattr(coalesce, "MAX_ITEMS", 4)
    coalescer: Coalescer[object, object] = Coalescer()
    calls = Calls()
    first = asyncio.ensure_future(coalescer.call("lane", [0], calls.run))
    await asyncio.sleep(0)
    sizes = (3, 1, 2, 5)
    waiting = [
        asyncio.ensure_future(coalescer.call("lane", [f"{n}.{i}" for i in range(n)], calls.run))
        for n in sizes
    ]
    await asyncio.sleep(0)
    calls.release.set()
    await first
    answers = [await t for t in waiting]
    assert [len(a) for a in answers] == list(sizes)
    assert [len(c) for c in calls.made] == [1, 4, 2, 5]  # 3+1, then 2 (2+5 > 4), then 5 alone
