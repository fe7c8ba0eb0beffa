"""A send hands a session's next message to the receiver holding it (docs/design.md §3.5).

A holder with credit and nothing under way is offered the messages of its session that a send
on the same process brings: the send's own store script locks them for it, and busd delivers
them without a wake-up or a receive of the holder's. Counted with Valkey's `INFO commandstats`
on a store of this module's own: a wake-up is a PUBLISH, a receive a script run of its own.
Order, credit and settlement are the client's to see.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from proton import Message, Timeout

from tests.e2e.amqp_client import SEQUENCE_NUMBER, ProtonCbsClient
from tests.e2e.conftest import command_calls, queue

pytestmark = pytest.mark.timeout(120)

NO_SWEEP = {"BUSD_SWEEP_INTERVAL": "3600"}


@pytest.fixture(scope="module")
def redis_url(own_redis_url):
    return own_redis_url


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [queue(name, RequiresSession=True) for name in ("one", "many", "credit", "first")],
        extra_env=NO_SWEEP,
    )


def test_a_waiting_holder_gets_each_message_with_no_wake_up_and_no_receive(busd, redis_url):
    store = redis.Redis.from_url(redis_url)
    count = 20
    with ProtonCbsClient(busd.port) as client:
        client.authorize("one")
        receiver = client.receiver("one", credit=50, session="s")
        sender = client.sender("one")
        time.sleep(0.2)  # the accept's first look is done
        before = command_calls(store)
        for i in range(count):
            sender.send(Message(body=f"m{i}", group_id="s"))  # answered once stored
            got = receiver.receive(timeout=10)
            assert got.body == f"m{i}"
            receiver.accept()
        time.sleep(0.3)  # the last settlement is stored
        after = command_calls(store)
    calls = {name: after[name] - before.get(name, 0) for name in after}
    calls.pop("cmdstat_info", None)
    assert calls.get("cmdstat_publish", 0) == 0, calls  # nobody was woken
    # a send and a settlement per message; a receive would be a third
    scripts = sum(calls.get(f"cmdstat_{c}", 0) for c in ("fcall", "evalsha", "eval"))
    assert count <= scripts <= 2 * count, calls


def test_a_send_before_the_first_credit_goes_out_with_it_with_no_wake_up_and_no_receive(
    busd, redis_url
):
    """A receiver that let its session go attaches for the next and grants credit only once
    the attach is answered (as the SDKs do): what is sent to its session meanwhile joins the
    messages its accept took and goes out with the first credit."""
    store = redis.Redis.from_url(redis_url)
    with ProtonCbsClient(busd.port) as client:
        client.authorize("first")
        # The connection's first session receiver tells busd how much credit they grant.
        client.receiver("first", credit=10, session="earlier").close()
        receiver = client.receiver("first", credit=0, session="s")  # answered, no credit yet
        sender = client.sender("first")
        time.sleep(0.2)  # the accept's look is done
        before = command_calls(store)
        for i in range(2):
            sender.send(Message(body=f"m{i}", group_id="s"))  # answered once stored
        time.sleep(0.2)  # a wake-up, had there been one, is in
        receiver.link.flow(5)
        got = []
        for _ in range(2):
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
        time.sleep(0.3)  # the settlements are stored
        after = command_calls(store)
    assert got == ["m0", "m1"]
    calls = {name: after[name] - before.get(name, 0) for name in after}
    calls.pop("cmdstat_info", None)
    assert calls.get("cmdstat_publish", 0) == 0, calls  # nobody was woken
    # the two sends and the settlements; a receive of the holder's own would be one more
    scripts = sum(calls.get(f"cmdstat_{c}", 0) for c in ("fcall", "evalsha", "eval"))
    assert scripts <= 4, calls


def test_concurrent_senders_hand_over_in_the_session_s_order(busd, redis_url):
    senders, each = 4, 50
    with ProtonCbsClient(busd.port) as client:
        client.authorize("many")
        receiver = client.receiver("many", credit=senders * each, session="s")
        time.sleep(0.2)

        def send(k: int) -> None:
            with ProtonCbsClient(busd.port) as own:
                own.authorize("many")
                link = own.sender("many")
                for i in range(each):
                    link.send(Message(body=f"{k}:{i}", group_id="s"))

        threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
        for thread in threads:
            thread.start()
        got = []
        for _ in range(senders * each):
            message = receiver.receive(timeout=20)
            got.append((message.annotations[SEQUENCE_NUMBER], message.body))
            receiver.accept()
        for thread in threads:
            thread.join(timeout=30)
    seqs = [seq for seq, _ in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # the session's order
    for k in range(senders):
        assert [b for _, b in got if b.startswith(f"{k}:")] == [f"{k}:{i}" for i in range(each)]


def test_a_holder_is_never_handed_more_than_its_credit(busd):
    with ProtonCbsClient(busd.port) as client:
        client.authorize("credit")
        receiver = client.receiver("credit", credit=0, session="s")  # no prefetch top-ups
        receiver.link.flow(2)
        time.sleep(0.2)
        sender = client.sender("credit")
        for i in range(5):
            sender.send(Message(body=f"m{i}", group_id="s"))
        arrived = receiver.fetcher
        client.conn.wait(lambda: arrived.has_message >= 2, timeout=10)
        with pytest.raises(Timeout):  # a while longer: nothing beyond the credit comes
            client.conn.wait(lambda: arrived.has_message > 2, timeout=0.5)
        assert receiver.link.credit == 0
        got = []
        for _ in range(5):  # a receive with no credit left grants one
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
    assert got == [f"m{i}" for i in range(5)]
