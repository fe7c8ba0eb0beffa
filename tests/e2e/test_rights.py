"""Keys with rights, token audiences and expiry, end to end (docs/design.md §2.10): the official
SDK gets the exceptions Service Bus gives it, and the admin HTTP API checks the audience and the
Manage right."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from azure.core.credentials import AccessToken, AzureSasCredential
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)
from click.testing import CliRunner
from proton import Message
from proton.utils import LinkDetached

from busd.auth.sas import generate_sas_token
from busd.cli.main import cli
from tests.e2e.amqp_client import ProtonCbsClient
from tests.e2e.conftest import cbs_refusal, launch_busd, queue, receive, write_config

pytestmark = pytest.mark.timeout(120)

KEYS = (
    "RootManageSharedAccessKey=SAS_KEY_VALUE reader=listen-key:Listen "
    "writer=send-key:Send ops=manage-key:Manage"
)


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [queue("authq"), queue("other"), queue("rights"), queue("busy"), queue("idle")],
        extra_env={"BUSD_SAS_KEY": KEYS},
    )


class ShortLivedTokens:
    """An SDK credential whose SAS tokens live `ttl` seconds: the SDK puts a new one when a
    tenth of the lifetime is left, while user code drives the client."""

    token_type = b"servicebus.windows.net:sastoken"

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl
        self.issued = 0

    def get_token(self, *scopes: str, **kwargs) -> AccessToken:
        self.issued += 1
        expiry = int(time.time()) + self.ttl
        return AccessToken(
            generate_sas_token(scopes[0], "RootManageSharedAccessKey", "SAS_KEY_VALUE", expiry),
            expiry,
        )


def expiry_detaches(busd, entity: str) -> int:
    return busd.log_text().count(f"token for '{entity}' expired: detaching link")


def conn_str(busd, name: str, key: str) -> str:
    return (
        f"Endpoint=sb://localhost:{busd.port};SharedAccessKeyName={name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
    )


def sdk(busd, name: str = "RootManageSharedAccessKey", key: str = "SAS_KEY_VALUE"):
    # retry_total=0: the refusals under test are not retried anyway; other failures show at once
    return ServiceBusClient.from_connection_string(conn_str(busd, name, key), retry_total=0)


# --- the SDK --------------------------------------------------------------------------------
def test_a_listen_only_key_cannot_send(busd):
    with sdk(busd, "reader", "listen-key") as client:
        with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
            with client.get_queue_sender("rights") as sender:
                sender.send_messages(ServiceBusMessage("refused"))
        # ...but receives and peeks
        with client.get_queue_receiver("rights", max_wait_time=1) as receiver:
            assert receiver.receive_messages(max_wait_time=1) == []
            assert receiver.peek_messages() == []


async def test_the_async_sdk_gets_the_same_refusals(busd):
    async with AsyncServiceBusClient.from_connection_string(
        conn_str(busd, "reader", "listen-key"), retry_total=0
    ) as client:
        with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
            async with client.get_queue_sender("rights") as sender:
                await sender.send_messages(ServiceBusMessage("refused"))
    async with AsyncServiceBusClient.from_connection_string(
        conn_str(busd, "writer", "send-key"), retry_total=0
    ) as client:
        with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
            async with client.get_queue_receiver("rights", max_wait_time=1) as receiver:
                await receiver.receive_messages(max_wait_time=1)


def test_a_send_only_key_cannot_receive(busd):
    with sdk(busd, "writer", "send-key") as client:
        with client.get_queue_sender("rights") as sender:
            sender.send_messages(ServiceBusMessage("sent by the writer"))
        with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
            with client.get_queue_receiver("rights", max_wait_time=1) as receiver:
                receiver.receive_messages(max_wait_time=1)
    with sdk(busd, "ops", "manage-key") as client:  # Manage implies Listen
        with client.get_queue_receiver("rights", max_wait_time=2) as receiver:
            (message,) = receive(receiver, 1)
            assert str(message) == "sent by the writer"
            receiver.complete_message(message)


def test_a_token_for_a_missing_entity_fails_authentication(busd):
    with sdk(busd) as client:
        with pytest.raises(ServiceBusAuthenticationError) as caught:
            with client.get_queue_sender("nosuch") as sender:
                sender.send_messages(ServiceBusMessage("nowhere"))
    status, description = cbs_refusal(caught.value)
    assert status == 404 and "could not be found" in description


def test_a_namespace_token_learns_that_an_entity_does_not_exist_at_attach(busd):
    token = generate_sas_token(
        f"sb://localhost:{busd.port}/",
        "RootManageSharedAccessKey",
        "SAS_KEY_VALUE",
        int(time.time()) + 300,
    )
    client = ServiceBusClient(
        f"localhost:{busd.port}", AzureSasCredential(token), use_tls=False, retry_total=0
    )
    with client:
        with pytest.raises(MessagingEntityNotFoundError):
            with client.get_queue_sender("nosuch") as sender:
                sender.send_messages(ServiceBusMessage("nowhere"))
        with client.get_queue_sender("authq") as sender:
            sender.send_messages(ServiceBusMessage("namespace-wide"))
    with sdk(busd) as root, root.get_queue_receiver("authq", max_wait_time=2) as receiver:
        (message,) = receive(receiver, 1)
        assert str(message) == "namespace-wide"
        receiver.complete_message(message)


def test_a_wrong_key_gets_the_same_answer_for_existing_and_missing_entities(busd):
    answers = []
    for entity in ("authq", "nosuch"):
        with sdk(busd, key="WRONG") as client:
            with pytest.raises(ServiceBusAuthenticationError) as caught:
                with client.get_queue_sender(entity) as sender:
                    sender.send_messages(ServiceBusMessage("probe"))
            status, description = cbs_refusal(caught.value)
            answers.append((status, description.replace(entity, "<name>")))
    assert answers[0] == answers[1] and answers[0][0] == 401


def test_a_receiver_that_refreshes_its_token_keeps_its_link(busd):
    tokens = ShortLivedTokens(ttl=20)  # refreshed in its last 2 s
    client = ServiceBusClient(f"localhost:{busd.port}", tokens, use_tls=False)
    with client, client.get_queue_receiver("busy", max_wait_time=1) as receiver:
        deadline = time.monotonic() + 23
        while time.monotonic() < deadline:
            receiver.receive_messages(max_wait_time=1)
        with sdk(busd) as other, other.get_queue_sender("busy") as sender:
            sender.send_messages(ServiceBusMessage("after the refresh"))
        (message,) = receive(receiver, 1)
        assert str(message) == "after the refresh"
        receiver.complete_message(message)
    assert tokens.issued >= 2
    assert expiry_detaches(busd, "busy") == 0


def test_an_idle_client_past_its_token_is_detached_and_reattaches(busd):
    tokens = ShortLivedTokens(ttl=10)
    client = ServiceBusClient(f"localhost:{busd.port}", tokens, use_tls=False)
    with client, client.get_queue_receiver("idle", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_wait_time=1) == []
        deadline = time.monotonic() + 15
        while expiry_detaches(busd, "idle") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)  # idle: the SDK puts no new token
        assert expiry_detaches(busd, "idle") == 1
        # The SDK sees the detach on its next call and attaches again with a new token.
        with sdk(busd) as other, other.get_queue_sender("idle") as sender:
            sender.send_messages(ServiceBusMessage("after the expiry"))
        # Re-opening (a new connection, token and attach) may take a while on a busy machine.
        (message,) = receive(receiver, 1, wait=10, patience=30)
        assert str(message) == "after the expiry"
        receiver.complete_message(message)
    assert tokens.issued >= 2


def test_a_token_for_the_management_node_covers_that_node_only(busd):
    # The JavaScript SDK signs its $management link's token for `<entity>/$management`.
    with ProtonCbsClient(busd.port) as client:
        assert client.put_token("authq/$management").properties["status-code"] == 202
        requests = client.conn.create_sender("authq/$management", name=f"m-{uuid.uuid4()}")
        answers = client.conn.create_receiver(
            "authq/$management", credit=5, name=f"r-{uuid.uuid4()}"
        )
        request_id = str(uuid.uuid4())
        requests.send(
            Message(
                id=request_id,
                reply_to="authq/$management",
                properties={"operation": "com.microsoft:peek-message"},
                body={"from-sequence-number": 1, "message-count": 1},
            )
        )
        answer = answers.receive(timeout=10)
        assert answer.correlation_id == request_id
        assert answer.properties["statusCode"] in (200, 204), answer.properties
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            client.conn.create_receiver("authq", name=f"q-{uuid.uuid4()}")


def test_keys_declared_in_the_entities_file_join_the_default_key(redis_url, tmp_path):
    config = write_config(tmp_path / "Config.json", [queue("filed")])
    document = json.loads(config.read_text())
    document["UserConfig"]["Namespaces"][0]["SharedAccessKeys"] = [
        {"KeyName": "filereader", "Key": "file-key", "Rights": ["Listen"]}
    ]
    config.write_text(json.dumps(document))
    process = launch_busd(redis_url, config, tmp_path)
    try:
        with sdk(process, "filereader", "file-key") as client:
            with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
                with client.get_queue_sender("filed") as sender:
                    sender.send_messages(ServiceBusMessage("refused"))
            with sdk(process) as root, root.get_queue_sender("filed") as sender:
                sender.send_messages(ServiceBusMessage("from the root key"))
            with client.get_queue_receiver("filed", max_wait_time=2) as receiver:
                (message,) = receive(receiver, 1)
                assert str(message) == "from the root key"
                receiver.complete_message(message)
    finally:
        process.stop()


# --- the admin HTTP API -----------------------------------------------------------------------
def admin(
    busd, method: str, path: str, audience: str = "", key_name: str = "ops", key: str = "manage-key"
) -> tuple[int, object]:
    token = generate_sas_token(f"sb://localhost/{audience}", key_name, key, int(time.time()) + 300)
    request = urllib.request.Request(
        busd.http_url + path, method=method, data=b"" if method == "POST" else None
    )
    request.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_admin_tokens_act_only_on_the_entities_their_audience_covers(busd):
    with sdk(busd) as client, client.get_queue_sender("other") as sender:
        sender.send_messages(ServiceBusMessage("keep me"))
    code, answer = admin(busd, "POST", "/admin/queues/other/purge", audience="authq")
    assert code == 401 and "does not cover 'other'" in answer["error"]
    assert admin(busd, "GET", "/admin/queues/other", audience="authq")[0] == 401
    assert admin(busd, "GET", "/admin/queues", audience="authq")[0] == 401  # the namespace
    assert admin(busd, "POST", "/admin/queues/authq/purge", audience="authq")[0] == 200
    assert admin(busd, "GET", "/admin/queues/authq", audience="authq")[0] == 200
    # nothing was purged from `other`; a namespace-wide token covers every queue
    code, info = admin(busd, "GET", "/admin/queues/other")
    assert code == 200 and info["counts"]["active"] == 1, info
    assert admin(busd, "GET", "/admin/queues")[0] == 200


def test_the_tools_sign_with_the_first_key_holding_manage(busd, monkeypatch):
    monkeypatch.setenv("BUSD_SAS_KEY", "reader=listen-key:Listen ops=manage-key:Manage")
    result = CliRunner().invoke(cli, ["queues", "--url", busd.http_url], prog_name="busd")
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("BUSD_SAS_KEY", "reader=listen-key:Listen")
    result = CliRunner().invoke(cli, ["queues", "--url", busd.http_url], prog_name="busd")
    assert result.exit_code == 65 and "'Manage' claim" in result.output, result.output


def test_admin_requests_need_the_manage_right(busd):
    for key_name, key in (("reader", "listen-key"), ("writer", "send-key")):
        for method, path in (
            ("GET", "/admin/queues/authq"),
            ("GET", "/admin/queues"),
            ("POST", "/admin/queues/authq/purge"),
        ):
            code, answer = admin(busd, method, path, key_name=key_name, key=key)
            assert code == 401 and "'Manage' claim" in answer["error"], (key_name, path)
    assert (
        admin(
            busd, "GET", "/admin/queues", key_name="RootManageSharedAccessKey", key="SAS_KEY_VALUE"
        )[0]
        == 200
    )
