"""`busd serve --config` with a changed entities file over a store that holds entities
already: the whole file is checked before anything is written (docs/design.md §2.1). A file
asking for what the stored entities cannot become stops the start with exit 78 and one line
naming the entity, and the store's records and messages are what they were. busd runs as a
real process over the suite's store; the messages are sent with the azure-servicebus SDK.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from busd.errors import EXIT_CONFIG
from busd.storage.partitioned.router import wrap
from busd.storage.redis.store import RedisStore
from busd.storage.specs import QueueSpec
from tests.conftest import delete_prefix
from tests.e2e.conftest import (
    launch_busd,
    queue,
    serve_command,
    subscription,
    topic,
    write_config,
)

pytestmark = pytest.mark.timeout(120)


def serve_failing(
    redis_url: str, prefix: str, config: Path, workdir: Path, *more: str
) -> tuple[int, str]:
    """`busd serve` that is expected to stop at start: its exit code and output."""
    done = subprocess.run(
        serve_command(config, "--redis-url", redis_url, "--key-prefix", prefix, *more),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=workdir,
    )
    return done.returncode, done.stdout + done.stderr


def stored(redis_url: str, prefix: str) -> tuple[dict, int]:
    """Every catalog record, and the messages of queue `orders`."""

    async def read() -> tuple[dict, int]:
        store = wrap(RedisStore(redis_url, prefix=prefix))
        await store.connect()
        try:
            counts = await store.counts(QueueSpec(name="orders"))
            return await store.catalog_all(), counts.active
        finally:
            await store.close()

    return asyncio.run(read())


def send(busd, count: int) -> None:
    with (
        ServiceBusClient.from_connection_string(busd.connection_string) as client,
        client.get_queue_sender("orders") as sender,
    ):
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(count)])


@pytest.fixture
def seeded(redis_url, tmp_path):
    """A store seeded from a first file (queues `orders`, holding 3 messages, and `other`)."""
    prefix = f"e2e-file-{uuid.uuid4().hex[:10]}"
    first = write_config(tmp_path / "first.json", [queue("orders"), queue("other")])
    busd = launch_busd(redis_url, first, tmp_path, prefix=prefix)
    try:
        send(busd, 3)
    finally:
        busd.stop()
    yield prefix
    delete_prefix(redis_url, prefix)


def one_error_line(output: str) -> str:
    """The error, said once (by each worker that met it, with --workers)."""
    assert "Traceback" not in output, output
    (line,) = {line for line in output.splitlines() if line.startswith("busd: error:")}
    return line


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["single", "workers"])
def test_requires_session_flipped_on_a_queue_holding_messages_changes_nothing(
    redis_url, tmp_path, seeded, workers
):
    before = stored(redis_url, seeded)
    assert before[1] == 3
    changed = write_config(
        tmp_path / "changed.json",
        [queue("other", LockDuration="PT2M"), queue("orders", RequiresSession=True)],
        [topic("fresh", [subscription("s")])],
    )
    code, output = serve_failing(redis_url, seeded, changed, tmp_path, *workers)
    line = one_error_line(output)
    print(line)
    assert code == EXIT_CONFIG
    assert "queue 'orders'" in line and "RequiresSession" in line and "3 messages" in line
    # `other`'s new LockDuration, written before `orders` were it applied piecemeal, is not
    assert stored(redis_url, seeded) == before


def test_requires_session_flipped_on_an_empty_queue_is_the_file_s(redis_url, tmp_path, seeded):
    """The file wins where nothing would be stranded: drained, the queue takes sessions."""
    busd = launch_busd(redis_url, tmp_path / "first.json", tmp_path, prefix=seeded)
    try:
        with (
            ServiceBusClient.from_connection_string(busd.connection_string) as client,
            client.get_queue_receiver("orders", max_wait_time=2) as receiver,
        ):
            got = []
            while len(got) < 3:
                batch = receiver.receive_messages(max_message_count=3, max_wait_time=2)
                assert batch, "the messages did not come"
                for message in batch:
                    receiver.complete_message(message)
                got += batch
    finally:
        busd.stop()
    changed = write_config(
        tmp_path / "changed.json", [queue("orders", RequiresSession=True), queue("other")]
    )
    busd = launch_busd(redis_url, changed, tmp_path, prefix=seeded)
    busd.stop()
    records, active = stored(redis_url, seeded)
    assert active == 0
    assert records["queue:orders"]["requires_session"] is True


def test_a_queue_redeclared_as_a_topic_changes_nothing(redis_url, tmp_path, seeded):
    before = stored(redis_url, seeded)
    changed = write_config(
        tmp_path / "changed.json",
        [queue("other", LockDuration="PT2M")],
        [topic("orders", [subscription("s")])],
    )
    code, output = serve_failing(redis_url, seeded, changed, tmp_path)
    line = one_error_line(output)
    print(line)
    assert code == EXIT_CONFIG
    assert "topic 'orders' is a queue in the store" in line
    assert stored(redis_url, seeded) == before
