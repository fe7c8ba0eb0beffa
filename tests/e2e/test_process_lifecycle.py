"""The busd process as an operator meets it: restarts, shutdown, the embedded store, tracing."""

from __future__ import annotations

import signal
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from tests.e2e.conftest import queue, receive

pytestmark = pytest.mark.timeout(120)

QUEUES = [queue("jobs"), queue("sessions", RequiresSession=True)]


def test_messages_survive_a_restart_of_the_embedded_store(busd_factory, tmp_path):
    data_dir = tmp_path / "data"
    first = busd_factory(QUEUES, embedded=True, data_dir=data_dir, prefix="restart")
    with ServiceBusClient.from_connection_string(first.connection_string) as client:
        with client.get_queue_sender("jobs") as sender:
            sender.send_messages([ServiceBusMessage("kept-1"), ServiceBusMessage("kept-2")])
    first.stop(signal.SIGTERM)
    assert first.proc.returncode == 0, first.log_text()
    second = busd_factory(QUEUES, embedded=True, data_dir=data_dir, prefix="restart")
    with ServiceBusClient.from_connection_string(second.connection_string) as client:
        with client.get_queue_receiver(
            "jobs", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=3
        ) as receiver:
            # one receive call may return fewer than are on their way: ask until both came
            bodies = [str(m) for m in receive(receiver, 2)]
    assert bodies == ["kept-1", "kept-2"]


def test_graceful_shutdown_releases_session_locks(busd_factory):
    prefix = f"shutdown-{uuid.uuid4().hex[:8]}"  # both processes share one store namespace
    first = busd_factory(QUEUES, prefix=prefix)
    with ServiceBusClient.from_connection_string(first.connection_string, retry_total=0) as client:
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages(ServiceBusMessage("held", session_id="s"))
        receiver = client.get_queue_receiver("sessions", session_id="s")
        receiver.__enter__()
        assert [str(m) for m in receiver.receive_messages(max_wait_time=3)] == ["held"]
        first.stop(signal.SIGTERM)  # the lock (60 s) must not outlive the process
        assert first.proc.returncode == 0, first.log_text()
    second = busd_factory(QUEUES, prefix=prefix)
    with ServiceBusClient.from_connection_string(second.connection_string, retry_total=0) as client:
        with client.get_queue_receiver("sessions", session_id="s") as again:
            (message,) = again.receive_messages(max_wait_time=3)
            assert str(message) == "held" and message.delivery_count == 0
            again.complete_message(message)


def test_trace_level_logs_every_frame(busd_factory):
    busd = busd_factory(QUEUES, log_level="trace")
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("jobs") as sender:
            sender.send_messages(ServiceBusMessage("traced"))
    text = busd.log_text()
    for frame in ("@sasl-init", "@open", "@begin", "@attach", "@transfer", "@disposition"):
        assert frame in text, frame
