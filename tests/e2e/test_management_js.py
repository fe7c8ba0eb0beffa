"""The JavaScript SDK (`@azure/service-bus` under node, trusting busd's certificate through
NODE_EXTRA_CA_CERTS): the administration client's round trip over HTTPS, then messages through
the AMQP client. The node script (js/admin_roundtrip.mjs) prints one JSON line per step."""

from __future__ import annotations

import shutil
import uuid

import pytest

from tests.e2e.conftest import queue, run_node

pytestmark = pytest.mark.timeout(300)

if not (shutil.which("node") and shutil.which("npm")):
    pytest.skip("needs node and npm (.ci/run installs them)", allow_module_level=True)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("js-file-queue")])


def test_javascript_administration_client_round_trip(busd, node_modules):
    prefix = f"js{uuid.uuid4().hex[:6]}"
    steps = run_node(
        "admin_roundtrip.mjs",
        busd.admin_connection_string,
        busd.connection_string,
        prefix,
        cert_path=busd.cert_path,
    )

    q, t = f"{prefix}-q", f"{prefix}-t"
    assert steps["namespace"] == {"name": "sbemulatorns", "sku": "Premium"}
    assert steps["createQueue"] == {
        "name": q,
        "lockDuration": "PT30S",
        "maxDeliveryCount": 5,
        "userMetadata": "from js",
    }
    assert steps["createQueueAgain"]["code"] == "MessageEntityAlreadyExistsError"
    assert steps["queueExists"] is True and steps["queueExistsMissing"] is False
    assert steps["getQueueMissing"]["code"] == "MessageEntityNotFoundError"
    assert steps["updateQueue"] == {"maxDeliveryCount": 7, "lockDuration": "PT30S"}
    assert {q, "js-file-queue"} <= set(steps["listQueues"])
    assert steps["runtime"] == {"active": 2, "total": 2, "deadLetter": 0, "scheduled": 0}
    assert steps["createTopic"] == {"name": t, "ttl": "PT1H"}
    assert steps["createSubscription"] == {
        "topic": t,
        "name": "sub1",
        "requiresSession": True,
        "maxDeliveryCount": 4,
    }
    assert steps["getSubscription"] == {"topic": t, "name": "sub1"}
    assert steps["subscriptionRuntime"] == {"active": 0, "total": 0}
    assert steps["listSubscriptions"] == ["sub1"]
    assert steps["createRule"] == {
        "name": "jr1",
        "filter": "color = @c",
        "parameters": {"@c": "red"},
        "action": "SET seen = 1",
    }
    assert steps["createCorrelationRule"] == {
        "name": "jr2",
        "sessionId": "s-1",
        "properties": {"kind": "blue", "n": 3},
    }
    assert steps["getRule"] == {"name": "jr1", "filter": "color = @c"}
    assert steps["listRules"] == ["$Default", "jr1", "jr2"]
    assert steps["getRuleDeleted"]["code"] == "MessageEntityNotFoundError"
    assert steps["subscriptionExistsAfterDelete"] is False
    assert steps["topicExistsAfterDelete"] is False
    assert steps["queueExistsAfterDelete"] is False
    assert steps["deleteMissing"]["code"] == "MessageEntityNotFoundError"


def test_one_connection_string_serves_both_javascript_clients(busd, node_modules):
    """The emulator string of the AMQP port: the administration client speaks HTTPS to it."""
    name = f"js1p{uuid.uuid4().hex[:6]}"
    steps = run_node("one_port.mjs", busd.connection_string, name, cert_path=busd.cert_path)
    assert steps == {
        "createQueue": 4,
        "active": 2,
        "received": ["one", "two"],
        "total": 0,
        "exists": False,
        "done": True,
    }
