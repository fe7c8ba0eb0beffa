"""The attacks of an unauthenticated or careless client, against a real busd process over
TCP (docs/design.md §3.12): each meets its limit with the condition clients expect, busd
serves on, and what the attacker held is given back when it leaves.

busd runs with small limits here so that each attack hits them in a moment; the defaults
only change the numbers.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from proton import Message

from tests.faults.conftest import QUEUES, metric, rss_kib
from tests.faults.tcp import tcp_client

LIMITS = {
    "BUSD_CONNECTION_BUFFER": str(4 * 2**20),
    "BUSD_PROCESS_BUFFER": str(6 * 2**20),
    "BUSD_MAX_LINKS_PER_CONNECTION": "40",
}
MIB = 2**20


def _partial(client, handle, size: int) -> None:
    """An unfinished transfer of `size` bytes (more=true, never completed)."""
    handle.link.delivery(uuid.uuid4().bytes)
    handle.link.send(b"\x00" * size)


async def _attacks(port: int) -> dict[str, str]:
    seen: dict[str, str] = {}

    # 1. An endless request on $cbs, without a token.
    client = await tcp_client(port)
    requests = await client.attach_sender("$cbs", source="$cbs")
    for _ in range(10):
        _partial(client, requests, 32 * 1024)
        await client.settle_down(0.01)
    await client.wait(lambda: requests.closed_by_broker, "the $cbs detach")
    seen["endless $cbs request"] = requests.condition.name

    # 2. Unfinished transfers on many sender links of one connection.
    await client.authorize("plain")
    senders = [await client.attach_sender("plain") for _ in range(12)]
    for sender in senders:
        _partial(client, sender, MIB // 2)
        await client.settle_down(0.02)
    await client.settle_down(0.5)  # every byte is over
    detached = [s for s in senders if s.closed_by_broker]
    seen["12 x 512 KB unfinished transfers, one connection"] = (
        f"{len(detached)} links detached: {detached[0].condition.name}" if detached else "none"
    )

    # 3. ... and over two connections, against the process's budget.
    other = await tcp_client(port)
    await other.authorize("plain")
    more = [await other.attach_sender("plain") for _ in range(8)]
    for sender in more:
        _partial(other, sender, MIB // 2)
        await other.settle_down(0.02)
    await other.settle_down(0.5)
    detached = [s for s in more if s.closed_by_broker]
    seen["8 more x 512 KB on a second connection"] = (
        f"{len(detached)} links detached: {detached[0].condition.name}" if detached else "none"
    )
    await other.close()

    # 4. More links than a connection may have.
    receivers = [await client.attach_receiver("plain") for _ in range(45)]
    refused = [r for r in receivers if r.closed_by_broker]
    seen["45 more links on one connection"] = (
        f"{len(refused)} refused: {refused[0].condition.name}" if refused else "none"
    )
    client.sock.close()  # the attacker leaves without a word
    return seen


def test_attacks_meet_their_limits_and_busd_serves_on(start_busd, capsys):
    busd = start_busd(QUEUES, env=LIMITS)
    rss_before = rss_kib(busd.proc.pid)
    seen = asyncio.run(_attacks(busd.port))
    deadline = time.monotonic() + 10
    while metric(busd, "busd_connections") and time.monotonic() < deadline:
        time.sleep(0.2)
    rss_after = rss_kib(busd.proc.pid)

    async def served() -> None:
        client = await tcp_client(busd.port)
        await client.authorize("plain")
        await client.send_to("plain", Message(body="served"))
        await client.close()

    asyncio.run(served())
    with capsys.disabled():
        print(
            f"\nattacks (connection buffer 4 MiB, process 6 MiB, 40 links): {seen}; RSS "
            f"{rss_before // 1024} -> {rss_after // 1024} MB; connections "
            f"{metric(busd, 'busd_connections'):.0f}, links {metric(busd, 'busd_links'):.0f}"
        )
    assert seen["endless $cbs request"] == "amqp:link:message-size-exceeded"
    assert seen["12 x 512 KB unfinished transfers, one connection"].endswith(
        "amqp:resource-limit-exceeded"
    )
    assert seen["8 more x 512 KB on a second connection"].endswith("amqp:resource-limit-exceeded")
    assert seen["45 more links on one connection"].endswith("amqp:resource-limit-exceeded")
    assert metric(busd, "busd_links") == 0
    assert rss_after - rss_before < 30 * 1024
