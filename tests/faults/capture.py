"""Record the bytes real clients send to busd: the frame fuzzer's seeds (tests/faults/seeds/).

    python -m tests.faults.capture PORT     # a busd serving the queues of tests/faults/conftest.py

Each seed is everything one client connection wrote, from its protocol header to its close:
the protocol client (tests/protocol/harness.py) doing what Service Bus clients do, and the
official SDK recorded through a small TCP relay. Tokens in the protocol client's seeds are
valid for a century, so replayed seeds still reach past `$cbs`; the SDK's expire after an
hour, as the SDK makes them, and replay as a refused put-token.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

from proton import Delivery, Message, uint

from tests.faults.tcp import tcp_client
from tests.protocol.harness import NEXT_AVAILABLE, TIMEOUT

SEEDS = Path(__file__).parent / "seeds"
CENTURY_S = 100 * 365 * 24 * 3600


async def _record(port: int, name: str, script) -> None:
    recorded: list[bytes] = []
    client = await tcp_client(port, record=recorded)
    await script(client)
    await client.close()
    (SEEDS / f"{name}.bin").write_bytes(b"".join(recorded))


async def send_receive_complete(client) -> None:
    await client.put_token("plain", valid_s=CENTURY_S)
    await client.send_to("plain", Message(body="seed", id=str(uuid.uuid4()), properties={"k": "v"}))
    receiver = await client.attach_receiver("plain", credit=5)
    (item,) = await receiver.wait_for(1)
    await client.dispose(item, Delivery.ACCEPTED)
    await client.detach(receiver)


async def management(client) -> None:
    await client.put_token("plain", valid_s=CENTURY_S)
    await client.request("plain", "peek-message", {"from-sequence-number": 1, "message-count": 5})
    await client.send_to("plain", Message(body="deferred"))
    receiver = await client.attach_receiver("plain", credit=1)
    (item,) = await receiver.wait_for(1)
    await client.dispose(item, Delivery.MODIFIED, failed=True, undeliverable=True)
    await client.detach(receiver)


async def session_receiver(client) -> None:
    await client.put_token("sessions", valid_s=CENTURY_S)
    await client.send_to(
        "sessions",
        Message(body="s", group_id="seed-session"),
        Message(body="t", group_id="seed-session"),
    )
    receiver = await client.attach_receiver(
        "sessions", session=NEXT_AVAILABLE, credit=2, properties={TIMEOUT: uint(2000)}
    )
    items = await receiver.wait_for(2)
    await client.dispose(items[0], Delivery.ACCEPTED)
    await client.dispose(items[1], Delivery.RELEASED)
    await client.request(
        "sessions", "set-session-state", {"session-id": "seed-session", "session-state": b"state"}
    )
    await client.detach(receiver)


async def _relay_sdk(port: int) -> None:
    """The official SDK's connection, recorded through a relay on a port of its own."""
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus.aio import ServiceBusClient

    recorded: list[bytes] = []

    async def relay(reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)

        async def pipe(src, dst, keep) -> None:
            while data := await src.read(65536):
                if keep:
                    recorded.append(data)
                dst.write(data)
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True
        )

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    relay_port = server.sockets[0].getsockname()[1]
    conn = (
        f"Endpoint=sb://localhost:{relay_port};SharedAccessKeyName="
        "RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
    async with ServiceBusClient.from_connection_string(conn) as client:
        async with client.get_queue_sender("sessions") as sender:
            await sender.send_messages([ServiceBusMessage("sdk", session_id="sdk-seed")])
        async with client.get_queue_receiver(
            "sessions", session_id="sdk-seed", max_wait_time=3
        ) as receiver:
            for message in await receiver.receive_messages(max_message_count=1, max_wait_time=3):
                await receiver.complete_message(message)
            await receiver.session.set_state(b"sdk-state")
    await asyncio.sleep(0.5)
    server.close()
    (SEEDS / "sdk-session.bin").write_bytes(b"".join(recorded))


async def main(port: int) -> None:
    SEEDS.mkdir(exist_ok=True)
    await _record(port, "send-receive-complete", send_receive_complete)
    await _record(port, "management-defer", management)
    await _record(port, "session-receiver", session_receiver)
    await _relay_sdk(port)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
