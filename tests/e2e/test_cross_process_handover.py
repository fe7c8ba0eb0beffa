"""A session held in another busd process gets its messages from the send's wake-up
(docs/design.md §3.5): the holder's standing offer lets the send lock the message for it,
and the wake-up carries the message, so the holder's process delivers it with no receive
call. A holder whose wake-ups were lost (its subscription cut) finds them with one receive.

Two busd processes over one store of this module's own; the store's `MONITOR` names the
functions each call ran. The clients are python-qpid-proton on real sockets.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import pytest
import redis
from proton import Message

from tests.e2e.amqp_client import SEQUENCE_NUMBER, ProtonCbsClient
from tests.e2e.conftest import queue
from tests.e2e.test_multiprocess import start_pair
from tests.e2e.test_session_handover import NO_SWEEP, redis_url

pytestmark = pytest.mark.timeout(120)
__all__ = ["redis_url"]  # the module's own store, as the in-process hand-over's tests have


@pytest.fixture(scope="module")
def pair(busd_factory):
    return start_pair(
        busd_factory,
        [queue(name, RequiresSession=True) for name in ("counted", "missed")],
        extra_env=NO_SWEEP,
    )


@contextlib.contextmanager
def held_elsewhere(pair, name: str):
    """A receiver on the first process holding session "s" of queue `name`, and a sender on
    the second, after a first message: filed, its holder woken, whose receive leaves the
    standing offer."""
    a, b = pair
    with ProtonCbsClient(a.port) as holding, ProtonCbsClient(b.port) as sending:
        holding.authorize(name)
        sending.authorize(name)
        receiver = holding.receiver(name, credit=50, session="s")
        sender = sending.sender(name)
        sender.send(Message(body="first", group_id="s"))
        assert receiver.receive(timeout=10).body == "first"
        receiver.accept()
        time.sleep(0.3)
        yield receiver, sender


class Functions:
    """The store functions called while it runs, by name (MONITOR)."""

    def __init__(self, url: str) -> None:
        self.calls: Counter[str] = Counter()
        self._client = redis.Redis.from_url(url)
        self._monitor = self._client.monitor()
        self._connection = self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                words = self._connection.next_command()["command"].split()
                if words and words[0].upper() in ("FCALL", "PUBLISH"):
                    self.calls[words[1] if words[0].upper() == "FCALL" else "PUBLISH"] += 1
        except Exception:
            return  # closed

    def named(self, part: str) -> int:
        return sum(n for name, n in self.calls.items() if part in name)

    def stop(self) -> None:
        time.sleep(0.3)  # what is under way reaches the monitor
        self._connection.connection.disconnect()
        self._thread.join(5)
        self._client.close()


def test_a_message_for_a_session_held_in_another_process_needs_no_receive(pair, redis_url):
    count = 20
    with held_elsewhere(pair, "counted") as (receiver, sender):
        functions = Functions(redis_url)
        try:
            seqs = []
            for i in range(count):
                sender.send(Message(body=f"m{i}", group_id="s"))
                got = receiver.receive(timeout=10)
                assert got.body == f"m{i}"
                seqs.append(got.annotations[SEQUENCE_NUMBER])
                receiver.accept()
        finally:
            functions.stop()
    assert seqs == sorted(seqs)
    assert functions.named("receiveSessionMessages") == 0, functions.calls
    assert functions.named("sendMessages") == count, functions.calls
    assert functions.calls["PUBLISH"] == count, functions.calls  # each carried its message


def test_a_holder_that_missed_its_wake_ups_gets_its_messages_in_order(pair, redis_url):
    store = redis.Redis.from_url(redis_url)
    with held_elsewhere(pair, "missed") as (receiver, sender):
        # the processes' subscriptions are cut: the wake-ups carrying these are lost, and
        # each process looks again once it has subscribed again
        store.client_kill_filter(_type="pubsub")
        for i in range(5):
            sender.send(Message(body=f"m{i}", group_id="s"))
        bodies = []
        for _ in range(5):
            got = receiver.receive(timeout=15)
            bodies.append(got.body)
            receiver.accept()
        assert bodies == [f"m{i}" for i in range(5)]
        # and the session goes on: the next message comes too
        sender.send(Message(body="after", group_id="s"))
        assert receiver.receive(timeout=15).body == "after"
        receiver.accept()
    store.close()
