"""Load for the fault tests: a producer and session consumers that survive their broker
process or the store going away, and the check of what they saw.

Every message body is `<session id>/<index>`. The producer sends each message once and never
again (a send whose outcome it did not hear may or may not be stored: it is optional, never
expected). Consumers take the next available session, complete each message with an unsettled
`accepted` and note when busd confirms it, and let the session go once it is idle; a consumer
whose connection drops connects again (to the next port in turn) and carries on.

`check` counts what must never happen, whatever failed meanwhile:
- lost: a message whose send busd acknowledged, gone from the store without ever being
  delivered;
- stuck: a message still in the store when the run ends (nobody could take it);
- duplicated after complete: a delivery of a message after busd had confirmed its complete;
- completed but back: a message whose complete busd confirmed, still in the store when the
  run ends (a store that lost the complete: it would be delivered again);
- order: within a session, a message first delivered before one sent ahead of it, or a link
  delivering a session's messages out of order;
- overlap: two consumers holding one session at the same time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field

from proton import Delivery, Message, uint

from tests.faults.tcp import tcp_client
from tests.protocol.harness import NEXT_AVAILABLE, SESSION_FILTER, TIMEOUT, ProtocolClient

ENTITY = "sessions"
IDLE_S = 0.4  # a consumer lets its session go after this long without a message
ACCEPT_TIMEOUT_MS = 2000


async def until(client: ProtocolClient | list[ProtocolClient], done, timeout: float) -> bool:
    """Pump `client` (or each of a list) until `done()` (True), a socket closes or `timeout`
    passes (False)."""
    clients = client if isinstance(client, list) else [client]
    deadline = time.monotonic() + timeout
    while True:
        moved = False
        for each in clients:
            moved = each.pump() or moved
        if done():
            return True
        if any(c.sock.closed for c in clients) or time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0 if moved else 0.002)


async def connect(port: int, timeout: float = 5) -> ProtocolClient | None:
    """A connection authorised for ENTITY, or None when busd or its store cannot give one."""
    try:
        client = await asyncio.wait_for(tcp_client(port), timeout)
        response = await asyncio.wait_for(client.put_token(ENTITY), timeout)
    except (TimeoutError, OSError, AssertionError):
        return None
    if response.properties.get("status-code") != 202:
        client.proto.close()
        return None
    return client


@dataclass
class Record:
    """What every client saw; times are time.monotonic()."""

    sent: set[tuple[str, int]] = field(default_factory=set)  # acknowledged sends
    acked_at: dict[tuple[str, int], float] = field(default_factory=dict)  # sends, when
    send_failures: int = 0
    deliveries: list[tuple[float, int, str, int]] = field(default_factory=list)
    completed: dict[tuple[str, int], float] = field(default_factory=dict)  # first confirm
    holds: list[list] = field(default_factory=list)  # [link, sid, start, end]
    refusals: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    reconnects: int = 0
    links = itertools.count(1)


async def produce(
    port: int, plan: dict[str, int], record: Record, stop: asyncio.Event, rate_per_s: float = 400
) -> None:
    """Send every message of `plan` once, session by session interleaved, at about
    `rate_per_s`; reconnect after a failure and go on with the next message."""
    order = [(sid, i) for i in range(max(plan.values())) for sid in plan if i < plan[sid]]
    pending = iter(order)
    client = sender = None
    for sid, index in pending:
        if stop.is_set():
            return
        while client is None or sender is None or client.sock.closed:
            if client is not None:
                client.proto.close()
            client = await connect(port)
            sender = None
            if client is not None:
                try:
                    sender = await client.attach_sender(ENTITY)
                except AssertionError:
                    client.proto.close()
                    client = None
            if client is None:
                record.reconnects += 1
                await asyncio.sleep(0.2)
        delivery = client.transfer(sender, Message(body=f"{sid}/{index}", group_id=sid))
        heard = await until(client, lambda d=delivery: d.settled, 10)
        if heard and delivery.remote_state == Delivery.ACCEPTED:
            record.sent.add((sid, index))
            record.acked_at[(sid, index)] = time.monotonic()
        else:  # (never sent again: it may be stored all the same)
            record.send_failures += 1
            if not heard:
                client.proto.close()
                client = None
            await asyncio.sleep(0.25)  # busd or its store is away: do not burn the plan
        await asyncio.sleep(1 / rate_per_s)
    if client is not None:
        await client.close()


async def consume(ports: list[int], record: Record, stop: asyncio.Event) -> None:
    """One consumer: next available session, complete everything, let go when idle.
    `ports` may change while it runs (a restarted process listens elsewhere)."""
    turn = itertools.count()
    client: ProtocolClient | None = None
    while not stop.is_set():
        if client is None or client.sock.closed:
            if client is not None:
                client.proto.close()
                record.reconnects += 1
            client = await connect(ports[next(turn) % len(ports)])
            if client is None:
                await asyncio.sleep(0.2)
                continue
        try:
            await hold_one_session(client, record, stop)
        except AssertionError:  # the harness timed out: the connection is gone
            client.proto.close()
    if client is not None and not client.sock.closed:
        try:
            await client.close(timeout=3)
        except AssertionError:
            client.proto.close()


async def hold_one_session(client: ProtocolClient, record: Record, stop: asyncio.Event) -> None:
    receiver = await client.attach_receiver(
        ENTITY, session=NEXT_AVAILABLE, properties={TIMEOUT: uint(ACCEPT_TIMEOUT_MS)}, wait=False
    )
    answered = await until(client, lambda: receiver.answered, ACCEPT_TIMEOUT_MS / 1000 + 10)
    if not answered:
        return  # the connection went (or busd never answered: the check below counts it)
    if receiver.closed_by_broker:
        condition = receiver.condition.name if receiver.condition else "none"
        record.refusals[condition] += 1
        if condition != "com.microsoft:timeout":
            await asyncio.sleep(0.1)
        return
    link = next(Record.links)
    sid = str(receiver.remote_filter.get(SESSION_FILTER))
    hold = [link, sid, time.monotonic(), None]
    record.holds.append(hold)
    receiver.flow(20)
    seen = 0
    unconfirmed: list[tuple[Delivery, tuple[str, int]]] = []
    while not stop.is_set():
        got = await until(
            client, lambda n=seen: len(receiver.received) > n or receiver.closed_by_broker, IDLE_S
        )
        _confirmations(unconfirmed, record)
        if not got or receiver.closed_by_broker or client.sock.closed:
            break
        for item in receiver.received[seen:]:
            key = _key(item.message.body)
            record.deliveries.append((time.monotonic(), link, *key))
            item.delivery.update(Delivery.ACCEPTED)
            unconfirmed.append((item.delivery, key))
        new = len(receiver.received) - seen
        seen = len(receiver.received)
        receiver.flow(new)
    if not client.sock.closed and not receiver.closed_by_broker:
        hold[3] = time.monotonic()  # let go: busd releases after this
        receiver.link.close()
        await until(client, lambda: receiver.closed_by_broker, 10)
    else:
        hold[3] = time.monotonic()
    _confirmations(unconfirmed, record)
    if receiver.closed_by_broker and receiver.condition is not None:
        record.refusals["detached " + receiver.condition.name] += 1


def _confirmations(unconfirmed: list, record: Record) -> None:
    for delivery, key in list(unconfirmed):
        if delivery.remote_state or delivery.settled:
            unconfirmed.remove((delivery, key))
            if delivery.remote_state == Delivery.ACCEPTED and key not in record.completed:
                record.completed[key] = time.monotonic()


def _key(body) -> tuple[str, int]:
    sid, _, index = str(body).rpartition("/")
    return sid, int(index)


@dataclass
class Verdict:
    sent: int = 0
    completed: int = 0  # busd confirmed the complete
    completed_unconfirmed: int = 0  # delivered, gone from the store, no confirmation heard
    lost: int = 0
    stuck: int = 0
    duplicated_after_complete: int = 0
    completed_but_back: int = 0
    order: int = 0
    overlap: int = 0
    deliveries: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            self.lost
            + self.stuck
            + self.duplicated_after_complete
            + self.completed_but_back
            + self.order
            + self.overlap
        )

    def summary(self) -> str:
        return (
            f"sent {self.sent}, completed {self.completed} (+{self.completed_unconfirmed} "
            f"unconfirmed), deliveries {self.deliveries}; lost {self.lost}, stuck "
            f"{self.stuck}, duplicated after complete "
            f"{self.duplicated_after_complete}, completed but back {self.completed_but_back}, "
            f"order {self.order}, overlap {self.overlap}"
        )


def stored(url: str, prefix: str, partitions: int | None = None) -> set[tuple[str, int]]:
    """The messages (by body) still in ENTITY's store when the run ends (in each of its
    `partitions`, when it has them; `url` may name a cluster: redis+cluster://)."""
    import redis

    from busd.storage.keys import key, partition_scope

    scopes = (
        [ENTITY]
        if partitions is None
        else [partition_scope(ENTITY, p, partitions) for p in range(partitions)]
    )
    client: redis.Redis | redis.RedisCluster
    if "+cluster://" in url:
        client = redis.RedisCluster.from_url(url.replace("+cluster://", "://", 1))
    else:
        client = redis.Redis.from_url(url)
    try:
        # a message's body is field '<seq>'; its metadata beside it is 'm<seq>'
        blobs = [
            blob
            for scope in scopes
            for field, blob in client.hgetall(key(prefix, scope, "q.body")).items()
            if not field.startswith(b"m")
        ]
    finally:
        client.close()
    found = set()
    for blob in blobs:
        # the body is the last section of the bare message: "...<sid>/<index>"
        tail = blob[-40:].rsplit(b"\xa1", 1)[-1][1:].decode("utf-8", "replace")
        if "/" in tail:
            found.add(_key(tail))
    return found


def check(record: Record, left: set[tuple[str, int]]) -> Verdict:
    """`left`: what is still stored at the end (`stored`)."""
    v = Verdict(sent=len(record.sent), deliveries=len(record.deliveries))
    v.completed = len(record.sent & set(record.completed))
    delivered = {(sid, index) for _t, _link, sid, index in record.deliveries}
    unconfirmed = record.sent - set(record.completed)
    stuck = sorted(unconfirmed & left)
    lost = sorted(unconfirmed - left - delivered)
    v.completed_unconfirmed = len(unconfirmed - left - set(lost))
    v.stuck, v.lost = len(stuck), len(lost)
    if stuck:
        v.examples.append(f"stuck e.g. {stuck[:3]}")
    if lost:
        v.examples.append(f"lost e.g. {lost[:3]}")
    back = sorted(set(record.completed) & left)
    v.completed_but_back = len(back)
    if back:
        v.examples.append(f"completed but back e.g. {back[:3]}")
    first: dict[tuple[str, int], float] = {}
    for t, _link, sid, index in sorted(record.deliveries):
        done = record.completed.get((sid, index))
        if done is not None and done < t:
            v.duplicated_after_complete += 1
            v.examples.append(f"{sid}/{index} delivered {t - done:.3f} s after its complete")
        first.setdefault((sid, index), t)
    by_session: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (sid, index), t in first.items():
        by_session[sid].append((index, t))
    for sid, items in by_session.items():
        items.sort()
        for (i, t), (j, u) in zip(items, items[1:]):
            if u < t:
                v.order += 1
                v.examples.append(f"{sid}/{j} first delivered before {sid}/{i}")
    last: dict[tuple[int, str], int] = {}
    for _t, link, sid, index in sorted(record.deliveries):
        previous = last.get((link, sid))
        if previous is not None and index <= previous:
            v.order += 1
            v.examples.append(f"{sid}/{index} after {sid}/{previous} on one link")
        last[(link, sid)] = index
    spans: dict[str, list] = defaultdict(list)
    for link, sid, start, end in record.holds:
        spans[sid].append((start, end if end is not None else float("inf"), link))
    for sid, items in spans.items():
        items.sort()
        held_until = float("-inf")
        for start, end, _link in items:
            if start < held_until:
                v.overlap += 1
                v.examples.append(f"{sid}: held by two consumers for {held_until - start:.3f} s")
            held_until = max(held_until, end)
    v.examples = v.examples[:8]
    return v


def recovered(
    name: str,
    record: Record,
    verdict: Verdict,
    since: float,
    seconds: float,
    sessions: set[str] | None = None,
) -> tuple[float | None, float | None]:
    """After a fault at `since`: seconds to the first send acknowledged after it (to one of
    `sessions`, when given) and to the first delivery of such a message (None: never); and a
    line of what the run saw, printed under `name`."""
    after = {
        k: t
        for k, t in record.acked_at.items()
        if t > since and (sessions is None or k[0] in sessions)
    }
    sent = min(after.values(), default=None)
    received = min(
        (t for t, _link, sid, index in record.deliveries if (sid, index) in after), default=None
    )
    sent_s = None if sent is None else sent - since
    received_s = None if received is None else received - since

    def text(s: float | None) -> str:
        return "never" if s is None else f"{s:.1f} s"

    print(
        f"\n{name}: {seconds:.1f} s; sends acknowledged again after {text(sent_s)}, such a "
        f"message received after {text(received_s)}; {verdict.summary()}; refusals "
        f"{dict(record.refusals)}; send failures {record.send_failures}"
    )
    for example in verdict.examples:
        print("  ", example)
    return sent_s, received_s


def plan(sessions: int, per_session: int) -> dict[str, int]:
    return {f"s{n:03d}": per_session for n in range(sessions)}


async def run(
    plan_: dict[str, int],
    producer_port: int,
    consumer_ports: list[int],
    *,
    consumers: int,
    deadline_s: float,
    chaos=None,
    rate_per_s: float = 400,
    quiet_s: float | None = None,
) -> tuple[Record, float]:
    """Send `plan_` and consume it while `chaos()` (a coroutine, cancelled at the end) does
    its worst; stop once every acknowledged send is completed and the producer is done, or
    at the deadline, or (`quiet_s`) once the producer and the chaos are done and nothing was
    delivered or confirmed for `quiet_s` (a complete that ran although busd refused it is
    never confirmed: the check counts it apart). Returns what was seen and how long it
    took."""
    record = Record()
    stop = asyncio.Event()
    started = time.monotonic()
    producer = asyncio.ensure_future(produce(producer_port, plan_, record, stop, rate_per_s))
    workers = [
        asyncio.ensure_future(consume(consumer_ports, record, stop)) for _ in range(consumers)
    ]
    chaos_task = asyncio.ensure_future(chaos()) if chaos is not None else None
    progress, moved_at = (0, 0), time.monotonic()
    while time.monotonic() - started < deadline_s:
        await asyncio.sleep(0.2)
        now = (len(record.deliveries), len(record.completed))
        if now != progress:
            progress, moved_at = now, time.monotonic()
        if producer.done() and (chaos_task is None or chaos_task.done()):
            if record.sent <= set(record.completed):
                break
            if quiet_s is not None and time.monotonic() - moved_at > quiet_s:
                break
    stop.set()
    if chaos_task is not None:
        chaos_task.cancel()
    await asyncio.gather(
        producer, *workers, *([chaos_task] if chaos_task else []), return_exceptions=True
    )
    return record, time.monotonic() - started
