"""Connections that come and go give their memory back (docs/design.md §3.12).

Opens and closes many connections, each with the links a client really uses (the `$cbs`
pair, a sender, a receiver that completes a message, a `$management` pair), with the protocol
client over TCP and with the official SDK, then checks that busd's count of connection objects
in memory and its resident memory come back to where they were.

Sizes come from the environment: the short defaults keep CI quick; `scripts/faults` runs
2,000 protocol-client and 300 SDK connections (BUSD_FAULTS_CONNECTIONS, BUSD_FAULTS_SDK).
"""

from __future__ import annotations

import asyncio
import os
import time

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from proton import Delivery, Message

from tests.faults.conftest import metric, rss_kib
from tests.faults.tcp import tcp_client

CONNECTIONS = int(os.environ.get("BUSD_FAULTS_CONNECTIONS", "150"))
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
            response = await client.request("plain", "peek-message",
                                            {"from-sequence-number": 1, "message-count": 1})
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
            for message in await receiver.receive_messages(max_message_count=1,
                                                           max_wait_time=5):
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
        print(f"\nmemory: {CONNECTIONS} proton connections in {proton_s:.1f} s, then "
              f"{SDK_CONNECTIONS} SDK connections; RSS {rss_before // 1024} MB -> "
              f"{rss_proton // 1024} MB -> {rss_after // 1024} MB; connection objects "
              f"{objects_before:.0f} -> {objects_proton:.0f} -> {objects_after:.0f}; "
              f"open now {metric(busd, 'busd_connections'):.0f}")
    assert metric(busd, "busd_connections") == 0
    assert objects_after <= objects_before + OBJECT_SLACK, "closed connections stay in memory"
    assert rss_after - rss_before <= RSS_SLACK_KIB, (
        f"RSS grew by {(rss_after - rss_before) // 1024} MB over the churn")
