"""A plain AMQP 1.0 client for tests: python-qpid-proton with claims-based security, as
Service Bus wants it (SASL ANONYMOUS, then a CBS put-token per entity)."""

from __future__ import annotations

import time
import uuid

from proton import Message, symbol, uint
from proton.reactor import Filter, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from busd.auth.sas import generate_sas_token

SAS_KEY_NAME = "RootManageSharedAccessKey"
SAS_KEY = "SAS_KEY_VALUE"
SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
TIMEOUT = symbol("com.microsoft:timeout")
SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
DOTNET_EPOCH_TICKS = 621355968000000000
NEXT_AVAILABLE = object()  # `session=` value: the next available session (filter value null)


class LinkProperties(LinkOption):
    """Attach properties, e.g. `com.microsoft:timeout` for a next-available session receiver."""

    def __init__(self, properties: dict) -> None:
        self.properties = properties

    def apply(self, link) -> None:
        link.properties = self.properties


class ProtonCbsClient:
    """A blocking proton client with claims-based security, as Service Bus wants it:
    SASL ANONYMOUS, then one `put-token` on `$cbs` per entity (audience
    `sb://localhost:<port>/<entity>`), then ordinary links to the entity."""

    def __init__(
        self,
        port: int,
        *,
        timeout: float = 10,
        heartbeat: float | None = None,
        host: str | None = None,
    ) -> None:
        """`host`: the open frame's hostname (a namespace's `<name>.localhost`), still
        connecting to 127.0.0.1."""
        self.port = port
        self.conn = BlockingConnection(
            f"amqp://127.0.0.1:{port}",
            timeout=timeout,
            allowed_mechs="ANONYMOUS",
            heartbeat=heartbeat,
            **({"virtual_host": host} if host else {}),
        )
        self._cbs: tuple[BlockingSender, BlockingReceiver] | None = None

    def __enter__(self) -> ProtonCbsClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def audience(self, entity: str) -> str:
        return f"sb://localhost:{self.port}/{entity}"

    def put_token(
        self, entity: str, *, key: str = SAS_KEY, key_name: str = SAS_KEY_NAME, valid_s: int = 3600
    ) -> Message:
        """Put a SAS token for `entity`; returns the CBS response (status-code 202: granted)."""
        if self._cbs is None:
            self._cbs = (
                self.conn.create_sender("$cbs"),
                self.conn.create_receiver("$cbs", credit=10),
            )
        requests, responses = self._cbs
        audience = self.audience(entity)
        token = generate_sas_token(audience, key_name, key, int(time.time()) + valid_s)
        requests.send(
            Message(
                id=str(uuid.uuid4()),
                reply_to="$cbs",
                body=token,
                properties={"operation": "put-token", "type": "jwt", "name": audience},
            )
        )
        return responses.receive(timeout=10)  # responses arrive settled: nothing to accept

    def authorize(self, entity: str) -> None:
        status = self.put_token(entity).properties["status-code"]
        assert status == 202, f"put-token for {entity} answered {status}"

    def sender(self, entity: str) -> BlockingSender:
        return self.conn.create_sender(entity, name=f"sender-{uuid.uuid4()}")

    def receiver(
        self, entity: str, *, credit: int = 10, session=None, timeout_ms: int | None = None
    ) -> BlockingReceiver:
        """A peek-lock receiver. `session`: a session id, or NEXT_AVAILABLE; None for a plain
        queue. The attach is answered once busd has locked the session."""
        options = []
        if session is not None:
            value = None if session is NEXT_AVAILABLE else session
            options.append(Filter({SESSION_FILTER: value}))
        if timeout_ms is not None:
            options.append(LinkProperties({TIMEOUT: uint(timeout_ms)}))
        # A fresh link name every time: proton would reuse `<container>-<address>` otherwise.
        return self.conn.create_receiver(
            entity, credit=credit, name=f"receiver-{uuid.uuid4()}", options=options or None
        )


class Management:
    """Requests on one `$management` node with a proton client. An operation without a
    namespace is Service Bus's (`com.microsoft:`)."""

    def __init__(self, client: ProtonCbsClient, entity: str) -> None:
        client.authorize(entity)
        self.reply_to = node = f"{entity}/$management"
        self.sender = client.conn.create_sender(node, name=f"mgmt-{uuid.uuid4()}")
        self.receiver = client.conn.create_receiver(node, credit=10, name=f"r-{uuid.uuid4()}")

    def request(self, operation: str, body: dict) -> Message:
        if ":" not in operation:
            operation = f"com.microsoft:{operation}"
        message_id = str(uuid.uuid4())
        self.sender.send(
            Message(
                id=message_id,
                reply_to=self.reply_to,
                body=body,
                properties={"operation": operation},
            )
        )
        answer = self.receiver.receive(timeout=10)
        assert answer.correlation_id == message_id
        return answer
