"""A client whose threads race on one AMQP session: the sync SDK's AutoLockRenewer renews the
session lock through `$management` while the receiving thread uses the same link, and the two
number their transfers out of order or alike (docs/wire.md §5.2). Service Bus carries on;
so does busd."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage

from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("sessions", RequiresSession=True, LockDuration="PT5S")])


def test_auto_lock_renewer_renewing_while_the_receiver_works(busd):
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", session_id="race") for i in range(40)])
        renewer = AutoLockRenewer(max_lock_renewal_duration=60)
        errors: list[BaseException] = []
        try:
            with client.get_queue_receiver(
                "sessions", session_id="race", max_wait_time=2, auto_lock_renewer=renewer
            ) as receiver:
                deadline = time.monotonic() + 8
                got = []
                while time.monotonic() < deadline:
                    # $management from this thread while the renewer's thread renews
                    receiver.session.get_state()
                    receiver.peek_messages(1)
                    for m in receiver.receive_messages(max_message_count=1, max_wait_time=1):
                        got.append(str(m))
                        receiver.complete_message(m)
                assert got and got == [f"m{i}" for i in range(len(got))]
                receiver.session.renew_lock()
        except BaseException as exc:  # noqa: BLE001 - reported with the log below
            errors.append(exc)
        finally:
            renewer.close()
        log = busd.log_text()
        assert "sequencing error" not in log, log[-3000:]
        assert not errors, (errors, log[-3000:])
