"""Many message locks held at once by the sync SDK's AutoLockRenewer, as the SDK's own
test_queue_receive_handler_with_autolockrenew_many_msgs does: 300 messages received on a queue
with 10 s locks, held for several lock durations while the renewer renews each lock, then
completed.

The renewer renews a lock once it has 0.75 of the lock duration left, so 300 locks of 10 s
ask for about 90 renewals a second, one at a time: the SDK's threads share one socket, and a
thread waiting for an answer holds its lock (docs/wire.md §8.3)."""

from __future__ import annotations

import os
import time

import pytest
from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(300)
MESSAGES = 300
LOCK_S = 10
# The SDK's test holds them 100 s; three lock durations are enough to renew each lock a few
# times over.
HOLD_S = float(os.environ.get("BUSD_TEST_RENEWALS_HOLD_S", "30"))


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("many", LockDuration=f"PT{LOCK_S}S")])


def test_a_renewer_keeps_300_locks(busd):
    failures: list = []
    renewals: list[float] = []
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("many") as sender:
            sender.send_messages([ServiceBusMessage(str(i)) for i in range(MESSAGES)])
        renewer = AutoLockRenewer()
        with client.get_queue_receiver("many", prefetch_count=10) as receiver:
            renew = receiver.renew_message_lock

            def timed(message, **kwargs):  # each renewal's time, for the report
                started = time.monotonic()
                try:
                    return renew(message, **kwargs)
                finally:
                    renewals.append(time.monotonic() - started)

            receiver.renew_message_lock = timed  # type: ignore[method-assign]
            messages = receive(receiver, MESSAGES, wait=5, patience=60)
            assert len(messages) == MESSAGES
            for message in messages:
                renewer.register(
                    receiver,
                    message,
                    max_lock_renewal_duration=HOLD_S + 60,
                    on_lock_renew_failure=lambda renewable, error: failures.append(error),
                )
            time.sleep(HOLD_S)
            # What went wrong while the locks were held. The renewer stops before the messages
            # are completed: a renewal task that found its message unsettled just before a
            # completion would otherwise renew a settled message and report that as a failure.
            held_failures = [(error, getattr(error, "inner_exception", None)) for error in failures]
            renewer.close()
            lost = [m.sequence_number for m in messages if m._lock_expired]
            for message in messages:
                if not message._lock_expired:
                    receiver.complete_message(message)
    times = sorted(renewals)
    print(
        f"\n{len(times)} renewals in {HOLD_S:.0f} s: median {times[len(times) // 2] * 1000:.1f} "
        f"ms, p90 {times[len(times) * 9 // 10] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms"
    )
    assert lost == [] and held_failures == []
