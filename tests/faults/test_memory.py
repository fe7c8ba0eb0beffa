"""Connections that come and go give their memory back (docs/design.md §3.12).

Opens and closes many connections, each with the links a client really uses (the `$cbs`
pair, a sender, a receiver that completes a message, a `$management` pair), with the protocol
client over TCP and with the official SDK, then checks that busd's count of connection objects
in memory and its resident memory come back to where they were: a few at a time, and all open
at once then all closed, twice. Unfinished transfers on many sender links stay within the
process's buffer limit and are given back when the links close.

Sizes come from the environment: the short defaults keep CI quick; `scripts/faults` runs
2,000 protocol-client and 300 SDK connections (BUSD_FAULTS_CONNECTIONS, BUSD_FAULTS_SDK).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from proton import Delivery, Message

from tests.faults.conftest import metric, rss_kib
from tests.faults.tcp import tcp_client

CONNECTIONS = int(os.environ.get("BUSD_FAULTS_CONNECTIONS", "150"))
# Open at once, then closed: the burst that glibc's heap kept after the objects were freed.
BURST = int(os.environ.get("BUSD_FAULTS_BURST", "1000"))
SDK_CONNECTIONS = int(os.environ.get("BUSD_FAULTS_SDK", "8"))
AT_ONCE = 16
# What may stay after the churn: allocator pages Python keeps, caches that fill once.
RSS_SLACK_KIB = 12 * 1024
OBJECT_SLACK = 4


async def _proton_connection(port: int, i: int) -> None:
    client = await tcp_client(port)
    try:
        await client.authorize("plain")
        await client.send_to("plain", Message(body=f"memory {i}"))
        receiver = await client.attach_receiver("plain", credit=1)
        received = await receiver.wait_for(1, timeout=20)
        await client.dispose(received[0], Delivery.ACCEPTED)
        if i % 4 == 0:
            response = await client.request(
                "plain", "peek-message", {"from-sequence-number": 1, "message-count": 1}
            )
            assert response.properties["statusCode"] in (200, 204)
        await client.close()
    finally:
        client.proto.close()


async def _proton_churn(port: int, count: int) -> None:
    numbers = iter(range(count))

    async def worker() -> None:
        for i in numbers:
            await _proton_connection(port, i)

    await asyncio.gather(*(worker() for _ in range(AT_ONCE)))


async def _sdk_connection(connection_string: str, i: int) -> None:
    async with ServiceBusClient.from_connection_string(connection_string) as client:
        async with client.get_queue_sender("plain") as sender:
            await sender.send_messages(ServiceBusMessage(f"sdk {i}"))
        async with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
            for message in await receiver.receive_messages(max_message_count=1, max_wait_time=5):
                await receiver.complete_message(message)


async def _sdk_churn_async(connection_string: str, count: int) -> None:
    numbers = iter(range(count))

    async def worker() -> None:  # the SDK waits on its own timers: many at once
        for i in numbers:
            await _sdk_connection(connection_string, i)

    await asyncio.gather(*(worker() for _ in range(AT_ONCE)))


def _sdk_churn(connection_string: str, count: int) -> None:
    asyncio.run(_sdk_churn_async(connection_string, count))


def _settled(busd, baseline: float, patience: float = 15) -> float:
    """The connection-object count once it stops falling (closes finish in the background)."""
    deadline = time.monotonic() + patience
    count = metric(busd, "busd_connection_objects")
    while count > baseline + OBJECT_SLACK and time.monotonic() < deadline:
        time.sleep(0.2)
        count = metric(busd, "busd_connection_objects")
    return count


def test_connections_opened_and_closed_give_their_memory_back(start_busd, capsys):
    busd = start_busd()
    pid = busd.proc.pid
    # Warm up: first-use caches (scripts, codecs, SDK paths) are not a leak.
    asyncio.run(_proton_churn(busd.port, 50))
    _sdk_churn(busd.connection_string, 3)
    objects_before = _settled(busd, 0)
    rss_before = rss_kib(pid)

    started = time.monotonic()
    asyncio.run(_proton_churn(busd.port, CONNECTIONS))
    proton_s = time.monotonic() - started
    objects_proton = _settled(busd, objects_before)
    rss_proton = rss_kib(pid)
    _sdk_churn(busd.connection_string, SDK_CONNECTIONS)
    objects_after = _settled(busd, objects_before)
    rss_after = rss_kib(pid)

    with capsys.disabled():
        print(
            f"\nmemory: {CONNECTIONS} proton connections in {proton_s:.1f} s, then "
            f"{SDK_CONNECTIONS} SDK connections; RSS {rss_before // 1024} MB -> "
            f"{rss_proton // 1024} MB -> {rss_after // 1024} MB; connection objects "
            f"{objects_before:.0f} -> {objects_proton:.0f} -> {objects_after:.0f}; "
            f"open now {metric(busd, 'busd_connections'):.0f}"
        )
    assert metric(busd, "busd_connections") == 0
    assert objects_after <= objects_before + OBJECT_SLACK, "closed connections stay in memory"
    assert rss_after - rss_before <= RSS_SLACK_KIB, (
        f"RSS grew by {(rss_after - rss_before) // 1024} MB over the churn"
    )


async def _burst(port: int, count: int, pid: int) -> int:
    """Open `count` connections (token, a sender, a receiver with credit), all at once, then
    close them all; returns busd's RSS (KiB) while they were all open."""
    clients = []

    async def open_one() -> None:
        client = await tcp_client(port)
        clients.append(client)
        await client.authorize("plain")
        await client.attach_sender("plain")
        await client.attach_receiver("plain", credit=1)

    async def close(client) -> None:
        try:
            await client.close()
        finally:
            client.proto.close()

    try:
        for start in range(0, count, 50):
            await asyncio.gather(*(open_one() for _ in range(min(50, count - start))))
        peak = rss_kib(pid)
    finally:
        for start in range(0, len(clients), 50):
            await asyncio.gather(*(close(c) for c in clients[start : start + 50]))
    return peak


def _rss_settled(busd, pid: int) -> int:
    """RSS once the closed connections are freed and busd gave the memory back (a moment
    after the last close, docs/design.md §3.12)."""
    _settled(busd, 0)
    time.sleep(2)
    return rss_kib(pid)


def test_a_burst_of_connections_gives_its_memory_back_and_a_second_adds_nothing(start_busd, capsys):
    busd = start_busd()
    pid = busd.proc.pid
    asyncio.run(_burst(busd.port, 50, pid))  # first-use caches are not a leak
    start = _rss_settled(busd, pid)
    peak1 = asyncio.run(_burst(busd.port, BURST, pid))
    after1 = _rss_settled(busd, pid)
    peak2 = asyncio.run(_burst(busd.port, BURST, pid))
    after2 = _rss_settled(busd, pid)
    with capsys.disabled():
        print(
            f"\nmemory: {BURST} connections open at once, then closed, twice: RSS start "
            f"{start // 1024} MB, round 1 {peak1 // 1024} -> {after1 // 1024} MB, round 2 "
            f"{peak2 // 1024} -> {after2 // 1024} MB; connection objects "
            f"{metric(busd, 'busd_connection_objects'):.0f}"
        )
    assert metric(busd, "busd_connection_objects") <= OBJECT_SLACK
    # Most of what the burst took is given back (what stays: Python's object arenas that a
    # few long-lived objects keep), and a second burst reuses it instead of adding to it.
    assert after1 - start <= (peak1 - start) // 2, "the burst's memory was not given back"
    assert after2 - after1 <= RSS_SLACK_KIB // 2, (
        f"a second burst grew RSS by {(after2 - after1) // 1024} MB"
    )


# Unfinished transfers: sender links each holding most of a 1 MB message (more=true, never
# completed), more than the process may buffer (docs/design.md §3.12).
PARTIAL_CONNECTIONS = 20
PARTIAL_LINKS = 10  # per connection
PARTIAL_SIZE = 1_100_000
PROCESS_BUFFER_MIB = 32  # the default


async def _unfinished(port: int, pid: int, busd) -> tuple[int, int, int, int]:
    """(RSS with every transfer in, bytes held then, links detached, RSS once the client
    detached the links it still had)."""
    clients = []
    for _ in range(PARTIAL_CONNECTIONS):
        client = await tcp_client(port)
        await client.authorize("plain")
        senders = [await client.attach_sender("plain") for _ in range(PARTIAL_LINKS)]
        for sender in senders:
            sender.link.delivery(uuid.uuid4().bytes)
            sender.link.send(b"\x00" * PARTIAL_SIZE)  # not advanced: never finished
        await client.wait(
            lambda c=client: c.transport.pending() <= 0 and c.session.outgoing_bytes == 0,
            "every frame out",
            60,
        )
        await client.settle_down(0.2)
        clients.append((client, senders))
    during = rss_kib(pid)
    held = int(metric(busd, "busd_unfinished_transfer_bytes"))
    detached = sum(s.closed_by_broker for _, senders in clients for s in senders)
    for client, senders in clients:
        for sender in senders:
            if not sender.closed_by_broker:
                sender.link.close()
        await client.settle_down(0.2)
    await asyncio.sleep(2)  # the links' memory goes back a moment after (see _rss_settled)
    after_links = rss_kib(pid)
    for client, _ in clients:
        try:
            await client.close()
        finally:
            client.proto.close()
    return during, held, detached, after_links


def test_unfinished_transfers_stay_within_the_buffer_limit_and_are_given_back(start_busd, capsys):
    busd = start_busd()
    pid = busd.proc.pid
    start = rss_kib(pid)
    during, held, detached, after_links = asyncio.run(_unfinished(busd.port, pid, busd))
    after = _rss_settled(busd, pid)
    links = PARTIAL_CONNECTIONS * PARTIAL_LINKS
    with capsys.disabled():
        print(
            f"\nmemory: {links} sender links x {PARTIAL_SIZE // 1000} kB unfinished: RSS "
            f"{start // 1024} MB -> {during // 1024} MB ({held / 2**20:.1f} MB held, "
            f"{detached} links detached) -> {after_links // 1024} MB once the links "
            f"closed -> {after // 1024} MB once the connections closed"
        )
    assert held <= PROCESS_BUFFER_MIB * 2**20
    assert detached >= links - PROCESS_BUFFER_MIB  # one link's ~1 MB each fits
    # On top of what busd holds, proton keeps the frames of each transfer it is reading
    # (docs/design.md §3.12); 200 links x 1.1 MB once took 290 MB here.
    assert during - start <= 4 * PROCESS_BUFFER_MIB * 1024, (
        f"RSS grew by {(during - start) // 1024} MB"
    )
    assert metric(busd, "busd_unfinished_transfer_bytes") == 0
    assert during - after_links >= held // 1024 // 2, "closed links kept their bytes"
    assert after - start <= RSS_SLACK_KIB, f"RSS stayed {(after - start) // 1024} MB up"
