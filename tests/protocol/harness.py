"""An AMQP 1.0 client pumped in memory against busd's real protocol object.

The broker side is busd's own `AmqpProtocol` (with the connection handler and broker the
fixture gives it) connected to a `MemorySocket`, a stand-in for the asyncio transport that
only buffers what the protocol writes. The client side is a python-qpid-proton `Transport` in
client mode, without reactor or socket: `pump()` moves the client's output into
`data_received` and the protocol's writes into the client's `Transport.push`, then handles the
client's events. Broker work that awaits the store runs between pumps, so every wait is a
bounded loop of pump-then-yield (`ProtocolClient.wait`).

Every frame either side writes is recorded as proton traces it (`frames`), so tests can check
fields proton's endpoint API does not show (drain, closed, nulls).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from cproton_ffi import ffi, lib
from proton import (
    UNDESCRIBED,
    Array,
    Collector,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Terminus,
    Transport,
    symbol,
)

from busd.auth.rights import LISTEN, MANAGE, SEND, SasKey
from busd.auth.sas import generate_sas_token

SAS_KEY_NAME = "RootManageSharedAccessKey"
SAS_KEY = "SAS_KEY_VALUE"
# The root key keeps every right; the others carry one right each (busd.auth.rights).
SAS_KEYS = {
    SAS_KEY_NAME: SAS_KEY,
    "sender": SasKey("send-key", {SEND}),
    "listener": SasKey("listen-key", {LISTEN}),
    "manager": SasKey("manage-key", {MANAGE}),
}
HOST = "localhost:5672"  # what the client names in its audiences; nothing listens there

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
TIMEOUT = symbol("com.microsoft:timeout")
MAX_BATCH_SIZE = symbol("com.microsoft:max-message-batch-size")
SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
ENQUEUED_TIME = symbol("x-opt-enqueued-time")
LOCKED_UNTIL = symbol("x-opt-locked-until")
TRACKING_ID = symbol("tracking-id")
DOTNET_EPOCH_TICKS = 621355968000000000  # docs/wire.md §4.2
NEXT_AVAILABLE = object()  # `session=` value: the filter value null (docs/wire.md §4.2)

REMOTE_ACTIVE = Endpoint.REMOTE_ACTIVE
REMOTE_CLOSED = Endpoint.REMOTE_CLOSED
_HANDLE = re.compile(r"\bhandle=(0x[0-9a-f]+)\b")


def ticks_to_unix(ticks: int) -> float:
    """Seconds since the Unix epoch from .NET ticks (docs/wire.md §4.2)."""
    return (ticks - DOTNET_EPOCH_TICKS) / 10_000_000


def token_of_tag(tag: bytes) -> uuid.UUID:
    """The lock token a peek-lock delivery tag carries (docs/wire.md §6.4: .NET Guid layout)."""
    return uuid.UUID(bytes_le=bytes(tag))


class MemorySocket:
    """What `AmqpProtocol` needs of an asyncio transport: writes are buffered for the client;
    closing reports the connection lost to the protocol, as asyncio would, on the next turn."""

    def __init__(self, proto, peer: tuple[str, int]) -> None:
        self.proto = proto
        self.peer = peer
        self.buffer = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "the protocol wrote after closing its socket"
        self.buffer += data

    def get_extra_info(self, name: str, default=None):
        return self.peer if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.proto.connection_lost, None)

    abort = close


@dataclass(eq=False)  # compared by identity: two frames may read the same
class Frame:
    """One traced frame: `incoming` when the broker wrote it."""

    incoming: bool
    channel: str
    performative: str  # "attach", "flow", ... ("" for protocol headers)
    text: str  # proton's rendering of the whole frame

    def has(self, *fields: str) -> bool:
        return all(f in self.text for f in fields)


@dataclass
class Received:
    """A transfer the client received on one of its receiver links."""

    delivery: Delivery
    message: Message
    payload: bytes  # the whole encoded message as sent by the broker

    @property
    def tag(self) -> bytes:
        # proton's Delivery.tag decodes the tag as UTF-8, which a binary tag is not
        raw = lib.pn_delivery_tag(self.delivery._impl)
        if not raw.size:  # an empty tag (receive-and-delete, docs/wire.md §6.4): no bytes
            return b""
        return bytes(ffi.unpack(raw.start, raw.size))

    @property
    def annotations(self) -> dict:
        return dict(self.message.annotations or {})


@dataclass
class LinkHandle:
    """A client link and what has arrived on it."""

    client: ProtocolClient
    link: Link
    received: list[Received] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.link.name

    @property
    def answered(self) -> bool:
        """The broker answered the attach (possibly to refuse it)."""
        return bool(self.link.state & (REMOTE_ACTIVE | REMOTE_CLOSED))

    @property
    def closed_by_broker(self) -> bool:
        return bool(self.link.state & REMOTE_CLOSED)

    @property
    def condition(self):
        return self.link.remote_condition

    @property
    def remote_filter(self) -> dict:
        """The source filter of the broker's attach, as a dict."""
        data = self.link.remote_source.filter
        data.rewind()
        return dict((data.get_object() if data.next() is not None else None) or {})

    @property
    def remote_properties(self) -> dict:
        return dict(self.link.remote_properties or {})

    def frames(self, performative: str, *, incoming: bool = True) -> list[Frame]:
        """This link's frames of one kind (matched by name for attach, by handle otherwise)."""
        return self.client.link_frames(self, performative, incoming=incoming)

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        await self.client.wait(
            lambda: len(self.received) >= count or self.closed_by_broker,
            f"{count} messages on {self.name} (have {len(self.received)})",
            timeout,
        )
        return self.received

    def flow(self, credit: int) -> None:
        self.link.flow(credit)

    def drain(self, credit: int) -> None:
        self.link.drain(credit)


class ProtocolClient:
    """One client connection to one `AmqpProtocol`, with SASL ANONYMOUS and one AMQP session."""

    def __init__(self, proto, *, peer: tuple[str, int] = ("memory", 1)) -> None:
        self.proto = proto
        self.sock = MemorySocket(proto, peer)
        self.frames: list[Frame] = []
        self.transport = Transport()  # client mode
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.transport.trace(Transport.TRACE_FRM)
        self.transport.tracer = self._trace
        self.conn = Connection()
        self.conn.container = f"protocol-test-{uuid.uuid4().hex[:8]}"
        self.conn.hostname = HOST.split(":")[0]
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.transport.bind(self.conn)
        self.session = self.conn.session()
        self._handles: dict[Link, LinkHandle] = {}
        # request/response node ($cbs, <entity>/$management) -> its (requests, responses) links
        self._nodes: dict[str, tuple[LinkHandle, LinkHandle]] = {}
        self._tail_closed = False
        proto.connection_made(self.sock)

    # --- I/O ---------------------------------------------------------------------------------
    def _trace(self, _transport, text: str) -> None:
        # "FRAME: 0 <- @attach(18) [...]"; "FRAME:   -> AMQP" for protocol headers
        body = text.removeprefix("FRAME:").strip()
        for arrow, incoming in ((" <- ", True), (" -> ", False)):
            if arrow in f" {body}":
                channel, _, rest = f" {body}".partition(arrow)
                performative = rest[1 : rest.index("(")] if rest.startswith("@") else ""
                self.frames.append(Frame(incoming, channel.strip(), performative, rest))
                return

    def pump(self) -> bool:
        """Move bytes both ways once and handle the client's events; True if any moved."""
        moved = False
        while (pending := self.transport.pending()) > 0:
            data = self.transport.peek(pending)
            self.transport.pop(pending)
            if not self.sock.closed:
                self.proto.data_received(data)
            moved = True
        if self.sock.buffer and self.transport.capacity() > 0:
            # as much as the engine takes; the rest stays buffered for the next pump
            n = min(len(self.sock.buffer), self.transport.capacity())
            self.transport.push(bytes(self.sock.buffer[:n]))
            del self.sock.buffer[:n]
            moved = True
        if self.sock.closed and not self.sock.buffer and not self._tail_closed:
            self._tail_closed = True
            self.transport.close_tail()
            moved = True
        self._events()
        return moved

    def _events(self) -> None:
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                link = event.link
                delivery = event.delivery
                handle = self._handles.get(link)
                if (
                    handle is not None
                    and link.is_receiver
                    and delivery.readable
                    and not delivery.partial
                ):
                    payload = link.recv(delivery.pending)
                    link.advance()
                    message = Message()
                    message.decode(payload)
                    handle.received.append(Received(delivery, message, payload))
            self.collector.pop()

    async def wait(self, done: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
        """Pump until `done()` holds, letting the broker's tasks run in between; fail after
        `timeout` seconds with the last frames for context."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            moved = self.pump()
            if done():
                return
            if loop.time() >= deadline:
                last = "\n".join(
                    ("<- " if f.incoming else "-> ") + f.text for f in self.frames[-12:]
                )
                raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{last}")
            # a store round trip takes a little while; while bytes move, just yield
            await asyncio.sleep(0 if moved else 0.001)

    async def settle_down(self, duration: float = 0.1) -> None:
        """Keep pumping for `duration` seconds: for checks that something did *not* happen."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration
        while loop.time() < deadline:
            moved = self.pump()
            await asyncio.sleep(0 if moved else 0.002)

    def link_frames(
        self, handle: LinkHandle, performative: str, *, incoming: bool = True
    ) -> list[Frame]:
        """Frames of one link: its attach by name; other frames by the handle number that
        side's attach gave the link, up to the next attach reusing that number."""
        frames = [f for f in self.frames if f.incoming == incoming]
        start = next(
            (
                i
                for i, f in enumerate(frames)
                if f.performative == "attach" and f.has(f'name="{handle.name}"')
            ),
            None,
        )
        if start is None:
            return []
        if performative == "attach":
            return [frames[start]]
        number = _HANDLE.search(frames[start].text).group(1)
        found = []
        for frame in frames[start + 1 :]:
            match = _HANDLE.search(frame.text)
            if match is None or match.group(1) != number:
                continue
            if frame.performative == "attach":
                break  # the number now names another link
            if frame.performative == performative:
                found.append(frame)
        return found

    def dispositions(self, since: int = 0, *, by_sender: bool | None = None) -> list[Frame]:
        """The dispositions the broker sent after frame number `since` (`len(frames)` taken
        earlier); `by_sender`: only those about deliveries it sent (role=false, settlements)
        or only those about deliveries it received (role=true, outcomes of transfers)."""
        found = [f for f in self.frames[since:] if f.incoming and f.performative == "disposition"]
        if by_sender is not None:
            found = [f for f in found if f.has(f"role={'false' if by_sender else 'true'}")]
        return found

    # --- connection ------------------------------------------------------------------------
    async def open(self) -> ProtocolClient:
        self.conn.open()
        self.session.open()
        await self.wait(lambda: bool(self.session.state & REMOTE_ACTIVE), "open and begin")
        return self

    async def close(self, timeout: float = 5.0) -> None:
        """Close the connection and wait for the broker's close and its socket to go."""
        if not (self.conn.state & Endpoint.LOCAL_CLOSED):
            self.conn.close()
        await self.wait(
            lambda: self.sock.closed and bool(self.conn.state & REMOTE_CLOSED), "the close", timeout
        )

    # --- links -----------------------------------------------------------------------------
    def _handle(self, link: Link) -> LinkHandle:
        handle = self._handles[link] = LinkHandle(self, link)
        return handle

    async def attach_receiver(
        self,
        address: str,
        *,
        session=None,
        properties: dict | None = None,
        filter: dict | None = None,
        receive_and_delete: bool = False,
        credit: int = 0,
        target: str | None = None,
        wait: bool = True,
        timeout: float = 5.0,
    ) -> LinkHandle:
        """A receiver on `address`. `session`: a session id or NEXT_AVAILABLE (a session
        receiver, docs/wire.md §4.2); `filter`: any other source filter. Peek-lock receivers
        attach with rcv-settle-mode *second*, as the Python SDK does (docs/wire.md §7.2)."""
        link = self.session.receiver(f"receiver-{uuid.uuid4()}")
        link.source.address = address
        link.target.address = target if target is not None else f"client-{uuid.uuid4().hex[:8]}"
        filters = dict(filter or {})
        if session is not None:
            filters[SESSION_FILTER] = None if session is NEXT_AVAILABLE else session
        if filters:
            link.source.filter.put_dict(filters)
        if properties:
            link.properties = properties
        if receive_and_delete:
            link.snd_settle_mode = Link.SND_SETTLED
        else:
            link.snd_settle_mode = Link.SND_UNSETTLED
            link.rcv_settle_mode = Link.RCV_SECOND
        link.open()
        if credit:
            link.flow(credit)
        handle = self._handle(link)
        if wait:
            await self.wait(lambda: handle.answered, f"the answer to attach {link.name}", timeout)
        return handle

    async def attach_sender(
        self,
        address: str,
        *,
        source: str | None = "client-out",
        rcv_settle_mode: int | None = None,
        wait: bool = True,
    ) -> LinkHandle:
        """A sender to `address`; with `wait`, until the attach is answered (and, when it is
        accepted, until the broker's credit has arrived)."""
        link = self.session.sender(f"sender-{uuid.uuid4()}")
        link.target.address = address
        if source is not None:
            link.source.address = source
        if rcv_settle_mode is not None:
            link.rcv_settle_mode = rcv_settle_mode
        link.open()
        handle = self._handle(link)
        if wait:
            await self.wait(
                lambda: handle.closed_by_broker or (handle.answered and link.credit > 0),
                f"the answer to attach {link.name}",
            )
        return handle

    async def detach(self, handle: LinkHandle, timeout: float = 5.0) -> None:
        handle.link.close()
        await self.wait(lambda: handle.closed_by_broker, f"the detach of {handle.name}", timeout)

    # --- sending ---------------------------------------------------------------------------
    def transfer(
        self, handle: LinkHandle, message: Message | bytes, *, settled: bool = False
    ) -> Delivery:
        """Queue one transfer (nothing moves until the next pump)."""
        link = handle.link
        delivery = link.delivery(uuid.uuid4().bytes)
        link.send(message if isinstance(message, bytes) else message.encode())
        link.advance()
        if settled:
            delivery.settle()
        return delivery

    async def send(self, handle: LinkHandle, *messages: Message | bytes) -> list[Delivery]:
        """Send and wait until the broker settled each delivery; returns them (their
        `remote_state` is the outcome)."""
        deliveries = [self.transfer(handle, m) for m in messages]
        await self.wait(
            lambda: all(d.settled for d in deliveries) or handle.closed_by_broker,
            f"the outcome of {len(deliveries)} transfers",
        )
        return deliveries

    async def send_to(self, entity: str, *messages: Message) -> None:
        """Send on a fresh sender link, check every outcome is accepted, detach."""
        sender = await self.attach_sender(entity)
        deliveries = await self.send(sender, *messages)
        states = [d.remote_state for d in deliveries]
        assert states == [Delivery.ACCEPTED] * len(states), f"sends answered {states}"
        for d in deliveries:
            d.settle()
        await self.detach(sender)

    # --- settling --------------------------------------------------------------------------
    async def dispose(
        self,
        item: Received,
        state: int,
        *,
        failed: bool | None = None,
        undeliverable: bool | None = None,
        condition=None,
        settled: bool = False,
        wait: bool = True,
    ) -> Delivery:
        """Send a disposition for a received delivery, unsettled unless `settled`; with
        `wait` (and unsettled), wait for the broker's settled echo (docs/wire.md §7.2)."""
        delivery = item.delivery
        if failed is not None:
            delivery.local.failed = failed
        if undeliverable is not None:
            delivery.local.undeliverable = undeliverable
        if condition is not None:
            delivery.local.condition = condition
        delivery.update(state)
        if settled:
            delivery.settle()
        if wait and not settled:
            await self.wait(lambda: delivery.settled, "the settled echo")
        else:
            self.pump()
        return delivery

    # --- CBS (docs/wire.md §3) ---------------------------------------------------------------
    @staticmethod
    def audience(entity: str) -> str:
        return f"sb://{HOST}/{entity}"

    async def put_token(
        self, entity: str, *, key: str = SAS_KEY, key_name: str = SAS_KEY_NAME, valid_s: int = 3600
    ) -> Message:
        """Put a SAS token for `entity` on `$cbs`; returns the response message."""
        audience = self.audience(entity)
        token = generate_sas_token(audience, key_name, key, int(time.time()) + valid_s)
        request = Message(
            id=uuid.uuid4(),
            reply_to="$cbs",
            body=token,
            properties={"operation": "put-token", "type": "jwt", "name": audience},
        )
        return await self._round_trip("$cbs", request)

    def node_links(self, node: str) -> tuple[LinkHandle, LinkHandle]:
        """The (requests, responses) link pair of a node this client has used."""
        return self._nodes[node]

    async def _round_trip(self, node: str, request: Message) -> Message:
        """Send a request to a request/response node over its link pair (attached on first
        use) and return the response that correlates with it."""
        if node not in self._nodes:
            requests = await self.attach_sender(node, source=node)
            responses = await self.attach_receiver(node, target=node, credit=100)
            self._nodes[node] = (requests, responses)
        requests, responses = self._nodes[node]
        before = len(responses.received)
        self.transfer(requests, request)
        await responses.wait_for(before + 1)
        response = responses.received[-1].message
        assert response.correlation_id == request.id
        return response

    async def authorize(self, *entities: str) -> None:
        for entity in entities:
            status = (await self.put_token(entity)).properties["status-code"]
            assert status == 202, f"put-token for {entity} answered {status}"

    # --- $management (docs/wire.md §8) --------------------------------------------------------
    async def request(
        self, entity: str, operation: str, body: dict | None = None, **application_properties
    ) -> Message:
        """One `$management` request on `<entity>/$management`; returns the response."""
        node = f"{entity}/$management"
        request = Message(
            id=uuid.uuid4(),
            reply_to=node,
            body=body or {},
            properties={"operation": f"com.microsoft:{operation}", **application_properties},
        )
        return await self._round_trip(node, request)


class StoreCalls:
    """Counts the broker's calls of some Store methods (the real store still runs them)."""

    def __init__(self, store, *names: str) -> None:
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            setattr(store, name, self._counted(name, getattr(store, name)))

    def _counted(self, name, method):
        async def call(*args, **kwargs):
            self.counts[name] += 1
            return await method(*args, **kwargs)

        return call


def uuid_array(tokens: list[uuid.UUID]) -> Array:
    """An AMQP array of uuid, as `$management` takes lock tokens (docs/wire.md §8.4.1)."""
    return Array(UNDESCRIBED, Data.UUID, *tokens)


def is_null(terminus: Terminus) -> bool:
    """proton reports a null source or target in the peer's attach as UNSPECIFIED."""
    return terminus.type == Terminus.UNSPECIFIED
