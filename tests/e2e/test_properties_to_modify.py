"""Application properties changed on abandon, defer and dead-letter ("properties to modify"),
as the .NET SDK sends them: in the `modified` outcome's message-annotations on the link, or as
`properties-to-modify` in a `$management` update-disposition. The Python SDK has no such
argument, so a plain proton client drives both paths."""

from __future__ import annotations

import uuid

import pytest
from cproton_ffi import ffi, lib
from proton import UNDESCRIBED, Array, Data, Delivery, Message, symbol

from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("modify")])


@pytest.fixture
def client(busd):
    with ProtonCbsClient(busd.port) as c:
        c.authorize("modify")
        yield c


def test_abandon_with_modified_annotations_changes_the_properties(client):
    client.sender("modify").send(Message(body="m1", properties={"stage": "new", "keep": "k"}))
    receiver = client.receiver("modify", credit=1)
    first = receiver.receive(timeout=5)
    assert first.properties == {"stage": "new", "keep": "k"}
    delivery = receiver.fetcher.unsettled[0]
    delivery.local.failed = True
    delivery.local.annotations = {symbol("stage"): "retried", symbol("attempt"): 2}
    receiver.settle(Delivery.MODIFIED)  # abandon with properties to modify
    again = receiver.receive(timeout=5)
    assert again.properties == {"stage": "retried", "keep": "k", "attempt": 2}
    assert again.delivery_count == 1
    receiver.accept()
    receiver.close()


def test_update_disposition_with_properties_to_modify(client):
    client.sender("modify").send(Message(body="m2", properties={"stage": "new"}))
    receiver = client.receiver("modify", credit=1)
    receiver.receive(timeout=5)
    # proton's Delivery.tag decodes the tag as UTF-8; read the 16 raw bytes instead.
    raw = lib.pn_delivery_tag(receiver.fetcher.unsettled[0]._impl)
    lock_token = uuid.UUID(bytes_le=bytes(ffi.buffer(raw.start, raw.size)))
    # Close the receiver first: its prefetch tops its credit up again, so an abandon while it is
    # open may hand the message straight back to it, locked past the end of this test. The lock
    # token stays valid on $management after the link is gone, as in Service Bus.
    receiver.close()
    requests = client.conn.create_sender("modify/$management", name=f"mgmt-{uuid.uuid4()}")
    responses = client.conn.create_receiver(
        "modify/$management", credit=5, name=f"mgmt-r-{uuid.uuid4()}"
    )
    request_id = uuid.uuid4()
    requests.send(
        Message(
            id=request_id,
            reply_to="modify/$management",
            properties={"operation": "com.microsoft:update-disposition", "type": "entity-mgmt"},
            body={
                "disposition-status": "abandoned",
                "lock-tokens": Array(UNDESCRIBED, Data.UUID, lock_token),
                "properties-to-modify": {"stage": "from-management"},
            },
        )
    )
    response = responses.receive(timeout=5)
    assert response.correlation_id == request_id
    assert response.properties["statusCode"] == 200, response.properties
    receiver = client.receiver("modify", credit=1)
    again = receiver.receive(timeout=5)
    assert again.body == "m2"
    assert again.properties == {"stage": "from-management"}
    assert again.delivery_count == 1
    receiver.accept()
