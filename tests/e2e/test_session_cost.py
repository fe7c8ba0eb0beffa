"""What one session's life costs the store, and that a waiting receiver is woken, not polled.

A next-available receiver's session life is three store scripts (docs/design.md §2.6, §3.4):
acceptSession (lock + first messages), settleMessages, releaseSession. The test counts them,
and every command they run, with Valkey's `INFO commandstats` on a store of this module's own
(nothing else runs commands on it) and a sweep interval of an hour (the sweep adds nothing
while counting). A change that makes a session cost more must change the bounds here, on
purpose.

The wake-up test proves the path is event-driven (docs/design.md §3.5): with the sweep an hour
away, a receiver waiting for a session gets one sent after it started waiting only through the
store's targeted wake-up.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from proton import Message

from tests.e2e.amqp_client import NEXT_AVAILABLE, ProtonCbsClient
from tests.e2e.conftest import command_calls, queue

pytestmark = pytest.mark.timeout(120)

SESSIONS = 20
# Per session with one message: acceptSession, settleMessages, releaseSession ...
SCRIPTS_PER_SESSION = 3
# ... running these commands (measured: 47 before the session inspector, whose accept records the
# holder's connection, address and last activity, docs/management.md §7: 5 more; 49 since an
# accept takes a receiver off the waiters only when it was one, and neither an accepted free
# session nor a settled one still holding messages is looked up in the session index). The
# accept's housekeeping look (four index reads) is skipped inside the quiet window a look that
# found nothing leaves (includes/housekeeping.lua): 47 measured here, where most accepts come
# within 10 ms of the one before; 51 when none does (a look then also checks and sets the window).
# (tests/storage/test_quiet_window.py proves the window; its timing is not this test's.)
# Since a lock token names its message (lua/includes/lockToken.lua), no token index is written
# by the accept nor read and cleared by the settle: 3 fewer, 44.5 measured, 48 at most. Since a
# message's metadata lives beside its body (lua/includes/metaField.lua), the accept reads both
# in one HMGET and the settle deletes both in one HDEL: 2 fewer, 42.5-44 measured, 46 at most.
# Since a session message names the holder it was locked for (lua/includes/checkSettlement.lua),
# the settle reads the lock's end only, not the holder: 1 fewer, 41 measured, 45 at most. A
# release of a session its settle forgot looks for no message to return or free: 2 fewer, 39
# measured, 43 at most. A release of a session with no message to return reads no lock's end
# (lua/includes/unlockSession.lua): 1 fewer, 38-38.3 measured (39.75 before, in one run), 42 at
# most. (Moving an accept's messages in one command per index saves a one-message session
# nothing: tests/storage/test_session_cost.py counts a three-message accept.) Since an accept
# takes its free session off `sfree` with the ZPOPMIN that finds it and writes its holder's
# connection in the HSET of its last activity, which the release then leaves alone
# (lua/includes/noteActivity.lua): 3 fewer, 34.75-35 measured, 39 at most.
COMMANDS_PER_SESSION = 39
NO_SWEEP = {"BUSD_SWEEP_INTERVAL": "3600"}


@pytest.fixture(scope="module")
def redis_url(own_redis_url):
    return own_redis_url


def test_a_session_life_costs_three_scripts(busd_factory, redis_url):
    busd = busd_factory([queue("cost", RequiresSession=True)], extra_env=NO_SWEEP)
    store = redis.Redis.from_url(redis_url)
    with ProtonCbsClient(busd.port) as client:
        client.authorize("cost")
        sender = client.sender("cost")
        for i in range(SESSIONS):
            sender.send(Message(body=f"m{i}", group_id=f"s{i:03d}"))
        before = command_calls(store)
        for i in range(SESSIONS):
            receiver = client.receiver("cost", credit=10, session=NEXT_AVAILABLE, timeout_ms=5000)
            assert receiver.receive(timeout=10).body == f"m{i}"  # oldest session first
            receiver.accept()
            receiver.close()  # answered once the release is stored
        after = command_calls(store)
    calls = {name: after[name] - before.get(name, 0) for name in after}
    calls.pop("cmdstat_info", None)  # this test's own INFO
    scripts = sum(calls.get(f"cmdstat_{c}", 0) for c in ("fcall", "evalsha", "eval"))
    commands = sum(calls.values())
    assert scripts <= SCRIPTS_PER_SESSION * SESSIONS, calls
    per_command = {name: n / SESSIONS for name, n in calls.items() if n}
    assert commands <= COMMANDS_PER_SESSION * SESSIONS, (commands / SESSIONS, str(per_command))
    assert scripts >= SESSIONS  # it did count them
    # and nothing of the sessions is left behind (storage/keys.py: `sessions`, `sactive`)
    keys = f"{{{busd.prefix}:cost}}"
    assert store.zcard(f"{keys}:sessions") == 0
    assert store.hlen(f"{keys}:sactive") == 0


def test_a_waiting_receiver_is_woken_by_the_send(busd_factory, redis_url):
    busd = busd_factory([queue("woken", RequiresSession=True)], extra_env=NO_SWEEP)
    store = redis.Redis.from_url(redis_url)
    waiters = f"{{{busd.prefix}:woken}}:swaiters"  # storage/keys.py: the queue's session waiters
    got: list[str] = []
    with ProtonCbsClient(busd.port) as client, ProtonCbsClient(busd.port) as waiter:
        client.authorize("woken")
        waiter.authorize("woken")

        def wait_for_a_session() -> None:
            receiver = waiter.receiver(
                "woken", credit=10, session=NEXT_AVAILABLE, timeout_ms=30_000
            )
            got.append(receiver.receive(timeout=30).body)
            receiver.accept()
            receiver.close()

        thread = threading.Thread(target=wait_for_a_session)
        thread.start()
        deadline = time.monotonic() + 30
        while not store.zcard(waiters):  # registered: nothing free when it asked
            assert time.monotonic() < deadline, "the receiver never waited"
            time.sleep(0.01)
        client.sender("woken").send(Message(body="new", group_id="late"))
        # well within the accept's timeout and nowhere near the sweep: only a wake-up does it
        thread.join(timeout=30)
    assert got == ["new"]
