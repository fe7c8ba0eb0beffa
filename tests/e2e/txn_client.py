"""Local transactions from python-qpid-proton, on its blocking API: the coordinator link, and
the transactional transfer and disposition states, built as proton's own
`Container.declare_transaction` / `Transaction.send` / `Transaction.accept` build them."""

from __future__ import annotations

import uuid

from proton import Delivery, Described, Message, Terminus, Timeout, symbol, ulong
from proton.reactor import LinkOption
from proton.utils import BlockingReceiver, BlockingSender

from tests.e2e.amqp_client import ProtonCbsClient

TRANSACTIONAL_STATE = 0x34
ACCEPTED = Described(ulong(0x24), [])


class Coordinator(LinkOption):
    """The coordinator target, with proton's capability (or none, as .NET sends it)."""

    def __init__(self, capability: bool = True) -> None:
        self.capability = capability

    def apply(self, link) -> None:
        link.target.type = Terminus.COORDINATOR
        if self.capability:
            link.target.capabilities.put_object(symbol("amqp:local-transactions"))


class Refused(Exception):
    def __init__(self, condition) -> None:
        super().__init__(
            f"{condition.name if condition else None}: {condition.description if condition else ''}"
        )
        self.condition = condition.name if condition else None


def settled(client: ProtonCbsClient, delivery, timeout: float = 10) -> Delivery:
    client.conn.wait(lambda: delivery.settled, timeout=timeout, msg="waiting for settlement")
    return delivery


def outcome(delivery) -> Delivery:
    """The settled delivery; Refused when it was rejected."""
    if delivery.remote_state == Delivery.REJECTED:
        raise Refused(delivery.remote.condition)
    return delivery


class Transactions:
    """A coordinator link on a client's connection."""

    def __init__(self, client: ProtonCbsClient, *, capability: bool = True) -> None:
        self.client = client
        self.ctrl: BlockingSender = client.conn.create_sender(
            None, name=f"txn-ctrl-{uuid.uuid4()}", options=Coordinator(capability)
        )

    def _control(self, descriptor, fields) -> Delivery:
        delivery = self.ctrl.link.send(Message(body=Described(descriptor, fields)))
        return outcome(settled(self.client, delivery))

    def declare(self, *, numeric: bool = False) -> bytes:
        descriptor = ulong(0x31) if numeric else symbol("amqp:declare:list")
        delivery = self._control(descriptor, [None])
        assert delivery.remote_state == 0x33, delivery.remote_state
        return bytes(delivery.remote.data[0])

    def commit(self, txn: bytes) -> None:
        self._control(symbol("amqp:discharge:list"), [txn, False])

    def rollback(self, txn: bytes) -> None:
        self._control(symbol("amqp:discharge:list"), [txn, True])

    def close(self) -> None:
        self.ctrl.close()


def send(
    client: ProtonCbsClient,
    sender: BlockingSender,
    txn: bytes,
    message: Message,
    *,
    wait: bool = True,
) -> Delivery:
    """A transactional send; with `wait` its settled answer (Refused when rejected)."""
    delivery = sender.link.send(message)
    delivery.local.data = [txn]
    delivery.update(TRANSACTIONAL_STATE)
    if not wait:
        return delivery
    return outcome(settled(client, delivery))


def take(receiver: BlockingReceiver, timeout: float = 10) -> tuple[Message, Delivery]:
    """The next message and its (unsettled) delivery."""
    message = receiver.receive(timeout=timeout)
    return message, receiver.fetcher.unsettled.popleft()


def settle(
    client: ProtonCbsClient, delivery: Delivery, txn: bytes, state=ACCEPTED, *, wait: bool = True
) -> Delivery:
    """A transactional disposition (unsettled, as proton's `Transaction.accept`); with `wait`
    busd's settled answer (Refused when rejected)."""
    delivery.local.data = [txn, state]
    delivery.update(TRANSACTIONAL_STATE)
    if not wait:
        return delivery
    return outcome(settled(client, delivery))


def lock_token(delivery: Delivery) -> uuid.UUID:
    """The lock token of a peek-lock delivery: its tag, a GUID in .NET byte layout."""
    from cproton_ffi import ffi, lib  # proton's Python tag reads it as text

    tag = lib.pn_delivery_tag(delivery._impl)
    return uuid.UUID(bytes_le=bytes(ffi.unpack(tag.start, tag.size)))


class ReplyAddress(LinkOption):
    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link) -> None:
        link.target.address = self.address


class Management:
    """An `<entity>/$management` link pair; requests may carry a transaction."""

    def __init__(self, client: ProtonCbsClient, entity: str) -> None:
        self.client = client
        self.reply_to = f"reply-{uuid.uuid4()}"
        node = f"{entity}/$management"
        self.requests = client.conn.create_sender(node, name=f"mgmt-{uuid.uuid4()}")
        self.responses = client.conn.create_receiver(
            node,
            credit=10,
            name=f"mgmt-reply-{uuid.uuid4()}",
            options=ReplyAddress(self.reply_to),
        )

    def request(self, operation: str, body: dict, txn: bytes | None = None) -> Message:
        message = Message(
            id=str(uuid.uuid4()),
            reply_to=self.reply_to,
            body=body,
            properties={"operation": f"com.microsoft:{operation}"},
        )
        delivery = self.requests.link.send(message)
        if txn is not None:
            delivery.local.data = [txn]
            delivery.update(TRANSACTIONAL_STATE)
        delivery.settle()  # requests go pre-settled, as the SDKs send them
        return self.responses.receive(timeout=10)


def peek_all(client: ProtonCbsClient, entity: str) -> list[Message]:
    """Every message of `entity` in any state (locked ones too), without locking any."""
    node = Management(client, entity)
    out: list[Message] = []
    start = 1
    while True:
        response = node.request(
            "peek-message", {"from-sequence-number": start, "message-count": 100}
        )
        if response.properties["statusCode"] == 204:
            return out
        for item in response.body["messages"]:
            message = Message()
            message.decode(bytes(item["message"]))
            out.append(message)
        start = max(m.annotations["x-opt-sequence-number"] for m in out) + 1


def drain(client: ProtonCbsClient, entity: str, wait: float = 0.5) -> list:
    """The bodies of every message now available on `entity`, completed."""
    receiver = client.receiver(entity, credit=200)
    got = []
    try:
        while True:
            got.append(receiver.receive(timeout=wait).body)
            receiver.accept()
    except Timeout:
        pass
    receiver.close()
    return got
