"""A queue's or topic's own shared access rules (docs/design.md §2.10): a token signed with one
of a rule's keys opens that entity only, with that rule's rights, for the official SDK (with and
without `EntityPath`) and over HTTP; keys the entities file leaves out survive a restart."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from azure.servicebus.management import (
    AccessRights,
    AuthorizationRule,
    ServiceBusAdministrationClient,
)

from busd.auth.sas import generate_sas_token
from tests.e2e.conftest import cbs_refusal, queue, receive, subscription, topic

pytestmark = pytest.mark.timeout(120)

ORDERS_RULES = [
    {
        "KeyName": "orders-send",
        "PrimaryKey": "send-primary",
        "SecondaryKey": "send-secondary",
        "Rights": ["Send"],
    },
    {"KeyName": "orders-listen", "PrimaryKey": "listen-primary", "Rights": ["Listen"]},
    {
        "KeyName": "orders-manage",
        "PrimaryKey": "manage-primary",
        "Rights": ["Manage", "Send", "Listen"],
    },
]
QUEUES = [
    queue("orders", AuthorizationRules=ORDERS_RULES),
    queue("other"),
    queue(
        "rotated",
        AuthorizationRules=[
            {"KeyName": "app", "PrimaryKey": "old-key", "Rights": ["Send", "Listen"]}
        ],
    ),
    queue("made", AuthorizationRules=[{"KeyName": "made", "Rights": ["Send", "Listen"]}]),
]
TOPICS = [
    topic(
        "events",
        [subscription("all")],
        AuthorizationRules=[
            {"KeyName": "events-app", "PrimaryKey": "events-key", "Rights": ["Send", "Listen"]}
        ],
    )
]


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(QUEUES, topics=TOPICS)


def conn_str(busd, name: str, key: str, entity: str | None = None) -> str:
    return (
        f"Endpoint=sb://localhost:{busd.port};SharedAccessKeyName={name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
        + (f"EntityPath={entity};" if entity else "")
    )


def sdk(busd, name: str, key: str, entity: str | None = None) -> ServiceBusClient:
    # retry_total=0: refusals are not retried anyway; other failures show at once
    return ServiceBusClient.from_connection_string(conn_str(busd, name, key, entity), retry_total=0)


def send_one(client: ServiceBusClient, queue_name: str, body: str) -> None:
    with client.get_queue_sender(queue_name) as sender:
        sender.send_messages(ServiceBusMessage(body))


def bodies(client: ServiceBusClient, queue_name: str, count: int) -> list[str]:
    with client.get_queue_receiver(queue_name, max_wait_time=5) as receiver:
        got = receive(receiver, count)
        for message in got:
            receiver.complete_message(message)
    return [str(message) for message in got]


def administration(busd) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        busd.admin_connection_string, connection_verify=busd.cert_path
    )


# --- the SDK --------------------------------------------------------------------------------
def test_an_entity_path_connection_string_sends_and_receives_with_its_rules(busd):
    with sdk(busd, "orders-send", "send-primary", entity="orders") as client:
        send_one(client, "orders", "by the primary key")
    with sdk(busd, "orders-send", "send-secondary", entity="orders") as client:
        send_one(client, "orders", "by the secondary key")
    with sdk(busd, "orders-listen", "listen-primary", entity="orders") as client:
        assert sorted(bodies(client, "orders", 2)) == ["by the primary key", "by the secondary key"]


def test_an_entity_key_opens_no_other_entity(busd):
    with sdk(busd, "orders-manage", "manage-primary") as client:
        send_one(client, "orders", "its own queue")  # the SDK signs for sb://host/orders
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            send_one(client, "other", "another queue")
        assert cbs_refusal(caught.value) == (401, "unknown shared access key name 'orders-manage'")
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            with client.get_topic_sender("events") as sender:
                sender.send_messages(ServiceBusMessage("another entity"))
        assert cbs_refusal(caught.value)[0] == 401
        assert bodies(client, "orders", 1) == ["its own queue"]
    # a wrong key under the rule's name is refused as well
    with sdk(busd, "orders-send", "not-the-key") as client:
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            send_one(client, "orders", "refused")
        status, description = cbs_refusal(caught.value)
        assert status == 401 and "signature does not match" in description


def test_a_rules_rights_are_its_own(busd):
    with sdk(busd, "orders-listen", "listen-primary", entity="orders") as client:
        with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
            send_one(client, "orders", "refused")
    with sdk(busd, "orders-send", "send-primary", entity="orders") as client:
        with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
            with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
                receiver.receive_messages(max_wait_time=1)


def test_a_topic_rule_covers_its_subscriptions(busd):
    with sdk(busd, "events-app", "events-key") as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("to the topic"))
        with client.get_subscription_receiver("events", "all", max_wait_time=5) as receiver:
            got = receive(receiver, 1)
            receiver.complete_message(got[0])
        assert [str(m) for m in got] == ["to the topic"]


def test_a_changed_key_refuses_new_tokens_signed_with_the_old_one(busd):
    """New put-tokens are checked against the rule as it is now; a link already attached keeps
    the grant it got until its token expires, as Service Bus does."""
    with sdk(busd, "app", "old-key") as client, client.get_queue_sender("rotated") as attached:
        attached.send_messages(ServiceBusMessage("before"))
        with administration(busd) as admin:
            props = admin.get_queue("rotated")
            (rule,) = props.authorization_rules
            rule.primary_key = "new-key"
            admin.update_queue(props)
        # this process's catalog view took the change before the update was answered
        with sdk(busd, "app", "old-key") as refused:
            with pytest.raises(ServiceBusAuthenticationError) as caught:
                send_one(refused, "rotated", "after")
            assert cbs_refusal(caught.value)[0] == 401
        attached.send_messages(ServiceBusMessage("on the link attached before"))
    with sdk(busd, "app", "new-key") as client:
        send_one(client, "rotated", "with the new key")
        assert sorted(bodies(client, "rotated", 3)) == [
            "before",
            "on the link attached before",
            "with the new key",
        ]


def test_a_namespaces_entity_keys_are_its_own(busd):
    """A rule lives in its entity's namespace (docs/design.md §2.16): its key, named
    `<namespace>/<KeyName>`, opens that namespace's queue and not the default namespace's queue
    of the same name."""
    namespace = f"keys-{uuid.uuid4().hex[:8]}"
    root = f"{namespace}/RootManageSharedAccessKey"
    with ServiceBusAdministrationClient.from_connection_string(
        conn_str(busd, root, "SAS_KEY_VALUE"), connection_verify=busd.cert_path
    ) as admin:
        admin.create_queue(
            "orders",
            authorization_rules=[
                AuthorizationRule(
                    key_name="team",
                    primary_key="team-key",
                    rights=[AccessRights.SEND, AccessRights.LISTEN],
                )
            ],
        )
    with sdk(busd, f"{namespace}/team", "team-key", entity="orders") as client:
        send_one(client, "orders", "in the namespace")
        assert bodies(client, "orders", 1) == ["in the namespace"]
    with sdk(busd, "team", "team-key", entity="orders") as client:
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            send_one(client, "orders", "in the default namespace")
        assert cbs_refusal(caught.value)[0] == 401


# --- HTTP -----------------------------------------------------------------------------------
def http(busd, method: str, path: str, token: str, body: bytes | None = None) -> int:
    """The status of a management (ATOM) request."""
    return status_of(
        urllib.request.Request(
            f"http://127.0.0.1:{busd.http_port}/{path}?api-version=2021-05",
            data=body,
            method=method,
            headers={"Authorization": token, "Content-Type": "application/atom+xml"},
        )
    )


def admin_api(busd, method: str, path: str, token: str) -> int:
    return status_of(
        urllib.request.Request(
            f"http://127.0.0.1:{busd.http_port}/admin/{path}",
            method=method,
            headers={"Authorization": token},
        )
    )


def status_of(request: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def entity_token(
    busd, path: str, key_name: str = "orders-manage", key: str = "manage-primary"
) -> str:
    return generate_sas_token(
        f"http://localhost:{busd.http_port}/{path}", key_name, key, int(time.time()) + 300
    )


NEW_QUEUE = (
    b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
    b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/'
    b'servicebus/connect"/></content></entry>'
)


def test_an_entity_key_manages_its_entity_only_over_http(busd):
    assert http(busd, "GET", "orders", entity_token(busd, "orders")) == 200
    # the namespace: listing queues, with the namespace's audience or the list's own
    assert http(busd, "GET", "$Resources/queues", entity_token(busd, "")) == 401
    assert http(busd, "GET", "$Resources/queues", entity_token(busd, "$Resources/queues")) == 401
    # another entity, signed for it or for the key's own entity
    assert http(busd, "GET", "other", entity_token(busd, "other")) == 401
    assert http(busd, "GET", "other", entity_token(busd, "orders")) == 401
    name = f"made-{uuid.uuid4().hex[:6]}"
    assert http(busd, "PUT", name, entity_token(busd, name), NEW_QUEUE) == 401
    # a rule without Manage cannot read its own entity's description either
    assert (
        http(busd, "GET", "orders", entity_token(busd, "orders", "orders-send", "send-primary"))
        == 401
    )


def test_an_entity_key_opens_the_admin_api_for_its_queue_only(busd):
    assert admin_api(busd, "GET", "queues/orders", entity_token(busd, "orders")) == 200
    assert admin_api(busd, "GET", "queues/other", entity_token(busd, "other")) == 401
    assert admin_api(busd, "GET", "queues/other", entity_token(busd, "orders")) == 401
    assert admin_api(busd, "GET", "queues", entity_token(busd, "")) == 401
    assert admin_api(busd, "POST", "queues/other/purge", entity_token(busd, "other")) == 401


# --- restarts -------------------------------------------------------------------------------
def made_key(busd) -> str:
    with administration(busd) as admin:
        (rule,) = admin.get_queue("made").authorization_rules
    assert rule.key_name == "made" and rule.primary_key
    return rule.primary_key


def test_a_key_the_entities_file_leaves_out_survives_a_restart(busd_factory):
    prefix = f"e2e-keys-{uuid.uuid4().hex[:8]}"
    first = busd_factory(QUEUES, topics=TOPICS, prefix=prefix)
    key = made_key(first)
    with sdk(first, "made", key, entity="made") as client:
        send_one(client, "made", "before the restart")
    first.stop()
    second = busd_factory(QUEUES, topics=TOPICS, prefix=prefix)
    assert made_key(second) == key
    with sdk(second, "made", key, entity="made") as client:
        send_one(client, "made", "after the restart")
        assert sorted(bodies(client, "made", 2)) == ["after the restart", "before the restart"]
