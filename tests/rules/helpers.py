"""Messages as the official SDK encodes them, for the rules tests."""

from __future__ import annotations

from azure.servicebus import ServiceBusMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport


def sdk_bytes(message) -> bytes:
    """The payload the SDK puts on the wire for one message."""
    outgoing = transform_outbound_messages(
        message, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message
    )
    return bytes(PyamqpTransport.encode_message(outgoing))
