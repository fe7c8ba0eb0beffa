"""Key scopes, written as the attacks (docs/design.md §2.10, §2.16): an entity's own key opens
that entity and what Service Bus scopes under it, never another entity whose name starts with
it (`orders` and `orders/secret` are two queues); a dead-letter sub-queue's `$management` node
never writes into its parent; only a Manage key makes a namespace, a process serves a bounded
number of them, and requests without a valid token keep none alive, while a namespace made
once takes every key of its own on any process; the admin API refuses session ids and cursors
the store must not see."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import quote

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError
from azure.servicebus.management import (
    AccessRights,
    AuthorizationRule,
    ServiceBusAdministrationClient,
)
from proton import Message
from proton.utils import LinkDetached

from busd.auth.sas import generate_sas_token
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import cbs_refusal, queue, receive

pytestmark = pytest.mark.timeout(120)

ROOT = "RootManageSharedAccessKey"


def owner(key: str) -> list[dict]:
    """One rule named `owner`, with every right: the same KeyName on both queues, as two teams
    would name theirs, so only the key tells them apart."""
    return [{"KeyName": "owner", "PrimaryKey": key, "Rights": ["Manage", "Send", "Listen"]}]


QUEUES = [
    queue("orders", AuthorizationRules=owner("orders-key")),
    queue("orders/secret", AuthorizationRules=owner("secret-key")),
    queue("other"),
]


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(QUEUES)


def sdk_string(busd, key_name: str, key: str) -> str:
    return (
        f"Endpoint=sb://localhost:{busd.port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
    )


def sdk(busd, key_name: str, key: str) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(sdk_string(busd, key_name, key), retry_total=0)


def root(busd) -> ServiceBusClient:
    return sdk(busd, ROOT, "SAS_KEY_VALUE")


def send(client: ServiceBusClient, name: str, *bodies: str) -> None:
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(b) for b in bodies])


def drain(client: ServiceBusClient, name: str, count: int) -> list[str]:
    with client.get_queue_receiver(name, max_wait_time=2) as receiver:
        got = receive(receiver, count, patience=4)
        for message in got:
            receiver.complete_message(message)
    return [str(m) for m in got]


def token(busd, path: str, key_name: str = "owner", key: str = "orders-key") -> str:
    return generate_sas_token(
        f"http://localhost:{busd.http_port}/{path}", key_name, key, int(time.time()) + 300
    )


def status(
    busd, method: str, path: str, auth: str, body: bytes | None = None, host: str | None = None
) -> tuple[int, bytes]:
    headers = {"Authorization": auth, "Content-Type": "application/atom+xml"}
    if host is not None:
        headers["Host"] = host
    request = urllib.request.Request(
        f"http://127.0.0.1:{busd.http_port}{path}", data=body, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def atom(busd, method: str, name: str, auth: str, body: bytes | None = None) -> int:
    return status(busd, method, f"/{name}?api-version=2021-05", auth, body)[0]


NEW_QUEUE = (
    b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
    b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/'
    b'servicebus/connect"/></content></entry>'
)


# --- an entity key and the entities whose names start with its entity's ----------------------
def test_an_entity_key_does_not_reach_an_entity_that_shares_its_name_prefix(busd):
    with root(busd) as client:
        send(client, "orders/secret", "secret-1", "secret-2")
    with sdk(busd, "owner", "orders-key") as attacker:
        # the SDK signs for sb://host/orders/secret with orders' key
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            drain(attacker, "orders/secret", 2)
        assert cbs_refusal(caught.value)[0] == 401
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            send(attacker, "orders/secret", "planted")
        assert cbs_refusal(caught.value)[0] == 401
        # its own queue, its dead-letter sub-queue and its management node still open
        send(attacker, "orders", "own")
        with attacker.get_queue_receiver("orders", max_wait_time=2) as receiver:
            assert [str(m) for m in receiver.peek_messages(5)] == ["own"]
        assert drain(attacker, "orders", 1) == ["own"]
        with attacker.get_queue_receiver("orders", sub_queue="deadletter", max_wait_time=1) as dlq:
            assert dlq.receive_messages(max_wait_time=1) == []
    with sdk(busd, "owner", "secret-key") as own:  # orders/secret's own key opens it
        send(own, "orders/secret", "own-secret")
        assert sorted(drain(own, "orders/secret", 3)) == ["own-secret", "secret-1", "secret-2"]


def test_a_token_for_the_keys_own_entity_covers_no_longer_name(busd):
    """A token signed for `orders` with orders' key is valid, but its audience is a prefix of
    `orders/secret`: the key's entity, not the audience, bounds what it opens."""
    with ProtonCbsClient(busd.port) as client:
        granted = client.put_token("orders", key_name="owner", key="orders-key")
        assert granted.properties["status-code"] == 202
        client.sender("orders").send(Message(body="own"))
        for name in ("orders/secret", "orders/secret/$DeadLetterQueue"):
            with pytest.raises(LinkDetached, match="amqp:unauthorized-access"):
                client.receiver(name)
        with pytest.raises(LinkDetached, match="amqp:unauthorized-access"):
            client.sender("orders/secret")
        # a put-token for the other entity, signed with this key, is refused outright
        refused = client.put_token("orders/evil", key_name="owner", key="orders-key")
        assert refused.properties["status-code"] == 401
    with root(busd) as client:
        assert len(drain(client, "orders", 1)) == 1  # only its own queue got the message


def test_an_entity_key_does_not_reach_its_name_prefix_over_http(busd):
    with root(busd) as client:
        send(client, "orders/secret", "peek me")
    # whether signed for the other entity or for its own (whose audience is a prefix)
    for audience in ("orders/secret", "orders"):
        auth = token(busd, audience)
        assert status(busd, "GET", "/admin/queues/orders%2Fsecret/messages", auth)[0] == 401
        assert status(busd, "POST", "/admin/queues/orders%2Fsecret/purge", auth)[0] == 401
        # the description holds the rule's PrimaryKey
        assert atom(busd, "GET", "orders/secret", auth) == 401
        assert atom(busd, "DELETE", "orders/secret", auth) == 401
    for audience in ("orders/evil", "orders"):
        assert atom(busd, "PUT", "orders/evil", token(busd, audience), NEW_QUEUE) == 401
    root_auth = generate_sas_token(
        f"http://localhost:{busd.http_port}/", ROOT, "SAS_KEY_VALUE", int(time.time()) + 300
    )
    assert atom(busd, "PUT", "orders/evil", root_auth, NEW_QUEUE) == 201
    for audience in ("orders/evil", "orders"):
        assert atom(busd, "DELETE", "orders/evil", token(busd, audience)) == 401
    assert atom(busd, "DELETE", "orders/evil", root_auth) == 200
    # each queue's own key works on its own queue
    own = token(busd, "orders/secret", key="secret-key")
    code, body = status(busd, "GET", "/admin/queues/orders%2Fsecret/messages", own)
    assert code == 200 and [m["body"] for m in json.loads(body)] == ["peek me"]
    code, body = status(busd, "GET", "/orders/secret?api-version=2021-05", own)
    assert code == 200 and b"secret-key" in body
    assert atom(busd, "GET", "orders", token(busd, "orders")) == 200
    assert status(busd, "GET", "/admin/queues/orders/messages", token(busd, "orders"))[0] == 200
    assert status(busd, "POST", "/admin/queues/orders%2Fsecret/purge", own)[0] == 200


# --- a dead-letter sub-queue's management node -----------------------------------------------
def test_a_dead_letter_token_cannot_schedule_into_its_parent(busd):
    dlq = "other/$DeadLetterQueue"
    with ProtonCbsClient(busd.port) as client:
        assert client.put_token(dlq).properties["status-code"] == 202
        node = f"{dlq}/$management"
        sender = client.conn.create_sender(node, name=f"mgmt-{uuid.uuid4()}")
        replies = client.conn.create_receiver(node, credit=10, name=f"r-{uuid.uuid4()}")

        def request(operation: str, body: dict) -> Message:
            message_id = str(uuid.uuid4())
            sender.send(
                Message(
                    id=message_id,
                    reply_to=node,
                    body=body,
                    properties={"operation": f"com.microsoft:{operation}"},
                )
            )
            answer = replies.receive(timeout=10)
            assert answer.correlation_id == message_id
            return answer

        planted = Message(body="planted")
        planted.message_id = "planted"
        encoded = planted.encode()
        when = int((time.time() + 3600) * 1000)
        answer = request("schedule-message", {"messages": [{"message": encoded}], "when": when})
        assert answer.properties["statusCode"] == 400
        assert answer.properties["errorCondition"] == "amqp:not-allowed"
        answer = request("cancel-scheduled-message", {"sequence-numbers": [1]})
        assert answer.properties["statusCode"] == 400
        answer = request("get-message-sessions", {"skip": 0, "top": 10})
        assert answer.properties["statusCode"] == 400
        # what acts on the sub-queue's own messages is served
        answer = request("peek-message", {"from-sequence-number": 1, "message-count": 5})
        assert answer.properties["statusCode"] == 204
    with root(busd) as client, client.get_queue_receiver("other") as receiver:
        assert receiver.peek_messages(10) == []  # nothing scheduled into `other`


# --- admin input -----------------------------------------------------------------------------
def root_http(busd) -> str:
    return generate_sas_token(
        f"http://localhost:{busd.http_port}/", ROOT, "SAS_KEY_VALUE", int(time.time()) + 300
    )


@pytest.mark.parametrize("session_id", ["a\0b", "x" * 129])
def test_the_admin_api_refuses_session_ids_the_amqp_side_refuses(busd, session_id):
    path = f"/admin/queues/other/sessions/{quote(session_id, safe='')}/state"
    code, body = status(busd, "PUT", path, root_http(busd), b"state")
    assert code == 400 and "128 characters" in json.loads(body)["error"]
    assert status(busd, "GET", path, root_http(busd))[0] == 400


@pytest.mark.parametrize(
    "sort, after", [("locked", "garbage"), ("waiting", "abc:def"), ("updated", "1e999x:s")]
)
def test_a_malformed_inspector_cursor_is_a_bad_request(busd, sort, after):
    path = f"/admin/queues/other/sessions?sort={sort}&after={quote(after)}"
    code, body = status(busd, "GET", path, root_http(busd))
    assert code == 400
    assert "X-Next-After" in json.loads(body)["error"]
    assert status(busd, "GET", "/health", "")[0] == 200


# --- namespaces ------------------------------------------------------------------------------
@pytest.fixture
def capped(busd_factory):
    """A busd of its own per test (the namespaces it serves count), serving at most two."""
    return busd_factory(
        [queue("q")],
        extra_env={
            "BUSD_SAS_KEY": f"{ROOT}=SAS_KEY_VALUE reader=listen-key:Listen",
            "BUSD_MAX_NAMESPACES": "2",
        },
    )


def namespace_token(busd, namespace: str, key_name: str = ROOT, key: str = "SAS_KEY_VALUE"):
    return generate_sas_token(
        f"http://{namespace}.localhost:{busd.http_port}/",
        f"{namespace}/{key_name}",
        key,
        int(time.time()) + 300,
    )


def list_queues(busd, namespace: str, auth: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", busd.http_port, timeout=10)
    try:
        connection.request(
            "GET",
            "/$Resources/queues?api-version=2021-05",
            headers={"Host": f"{namespace}.localhost", "Authorization": auth},
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_a_listen_key_does_not_make_a_namespace(capped):
    namespace = f"listen-{uuid.uuid4().hex[:8]}"
    with ProtonCbsClient(capped.port) as client:
        refused = client.put_token("", key_name=f"{namespace}/reader", key="listen-key")
        assert refused.properties["status-code"] == 401
        assert "holding Manage" in refused.properties["status-description"]
    reader = namespace_token(capped, namespace, "reader", "listen-key")
    assert list_queues(capped, namespace, reader) == 401
    assert f"namespace {namespace}: serving it" not in capped.log_text()
    # once a Manage key made it, the Listen key reaches it
    with ProtonCbsClient(capped.port) as maker:
        assert maker.put_token("", key_name=f"{namespace}/{ROOT}").properties["status-code"] == 202
        with ProtonCbsClient(capped.port) as client:
            granted = client.put_token("", key_name=f"{namespace}/reader", key="listen-key")
            assert granted.properties["status-code"] == 202


def test_the_namespace_cap_holds_and_unauthenticated_requests_keep_none_alive(capped):
    tag = uuid.uuid4().hex[:6]
    held, idle, third, fourth = (f"{n}-{tag}" for n in ("held", "idle", "third", "fourth"))
    with ProtonCbsClient(capped.port) as holder:  # a connection bound to `held` holds it
        assert holder.put_token("", key_name=f"{held}/{ROOT}").properties["status-code"] == 202
        assert list_queues(capped, idle, namespace_token(capped, idle)) == 200
        # requests naming `idle`'s host without a valid token, for longer than a namespace
        # counts as in use (namespaces.IN_USE_S)
        deadline = time.monotonic() + 10.5
        while time.monotonic() < deadline:
            assert list_queues(capped, idle, "") == 401
            assert list_queues(capped, idle, namespace_token(capped, idle, key="WRONG")) == 401
            time.sleep(0.5)
        # at the cap: `idle` is let go for `third`, `held` stays
        assert list_queues(capped, third, namespace_token(capped, third)) == 200
        log = capped.log_text()
        assert f"namespace {idle}: let go to make room" in log
        assert f"namespace {held}: let go" not in log
        # every namespace served is in use: the next one is refused, over HTTP and AMQP
        assert list_queues(capped, fourth, namespace_token(capped, fourth)) == 403
        with ProtonCbsClient(capped.port) as client:
            refused = client.put_token("", key_name=f"{fourth}/{ROOT}")
            assert refused.properties["status-code"] == 403
            assert "at most 2 namespaces" in refused.properties["status-description"]
        assert f"namespace {fourth}: serving it" not in capped.log_text()
        # the one held still serves
        assert list_queues(capped, held, namespace_token(capped, held)) == 200


def test_a_namespace_made_once_takes_its_every_key_on_a_process_that_does_not_serve_it(
    busd_factory,
):
    """A namespace's data outlives a process's broker for it: after a restart (as after an idle
    release, or on another worker) its Send and Listen keys and its entities' keys reach it as
    they did before; a namespace never made still takes only a Manage key."""
    namespace, never = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("made", "never"))
    env = {"BUSD_SAS_KEY": f"{ROOT}=SAS_KEY_VALUE reader=listen-key:Listen writer=send-key:Send"}
    first = busd_factory([queue("q")], extra_env=env)
    with ServiceBusAdministrationClient.from_connection_string(
        sdk_string(first, f"{namespace}/{ROOT}", "SAS_KEY_VALUE"),
        connection_verify=first.cert_path,
    ) as admin:
        rule = AuthorizationRule(
            rights=[AccessRights.MANAGE, AccessRights.SEND, AccessRights.LISTEN],
            key_name="app",
            primary_key="app-key",
        )
        admin.create_queue("jobs", authorization_rules=[rule])
    with sdk(first, f"{namespace}/{ROOT}", "SAS_KEY_VALUE") as manager:
        send(manager, "jobs", "from the manager")
    first.stop()
    # restarted: processes over the same store, none of which has served the namespace
    reading, writing, owning, managing = (
        busd_factory([queue("q")], extra_env=env, prefix=first.prefix) for _ in range(4)
    )
    with sdk(reading, f"{namespace}/reader", "listen-key") as reader:
        assert drain(reader, "jobs", 1) == ["from the manager"]
    # a token that does not verify makes nothing, even for a namespace the store knows
    with ProtonCbsClient(writing.port) as client:
        refused = client.put_token("", key_name=f"{namespace}/reader", key="WRONG")
        assert refused.properties["status-code"] == 401
    assert f"namespace {namespace}: serving it" not in writing.log_text()
    with sdk(writing, f"{namespace}/writer", "send-key") as writer:
        send(writer, "jobs", "from the Send key")
    with sdk(owning, f"{namespace}/app", "app-key") as app:  # the queue's own key
        assert drain(app, "jobs", 1) == ["from the Send key"]
    # over HTTP: the queue's own key (holding Manage) reads the queue
    entity_token = generate_sas_token(
        f"http://{namespace}.localhost:{managing.http_port}/jobs",
        f"{namespace}/app",
        "app-key",
        int(time.time()) + 300,
    )
    host = f"{namespace}.localhost"
    code, body = status(managing, "GET", "/jobs?api-version=2021-05", entity_token, host=host)
    assert code == 200 and b"QueueDescription" in body
    for process in (reading, writing, owning, managing):
        assert f"namespace {namespace}: serving it" in process.log_text()
    # a namespace never made: its Send and Listen keys, and a key of an entity it would hold,
    # are refused, and nothing is made
    with ProtonCbsClient(reading.port) as client:
        for key_name, key, entity in (
            ("reader", "listen-key", ""),
            ("writer", "send-key", "jobs"),
            ("app", "app-key", "jobs"),
        ):
            refused = client.put_token(entity, key_name=f"{never}/{key_name}", key=key)
            assert refused.properties["status-code"] == 401
            assert "holding Manage" in refused.properties["status-description"]
    listen_token = namespace_token(reading, never, "reader", "listen-key")
    assert list_queues(reading, never, listen_token) == 401
    assert f"namespace {never}: serving it" not in reading.log_text()
