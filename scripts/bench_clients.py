"""Load-generating AMQP 1.0 clients for scripts/bench: python-qpid-proton reactor handlers that
speak to any Service Bus-like broker (SASL ANONYMOUS, CBS put-token with a SAS token, queues,
session filter), or without CBS to a broker that has none (a peer, e.g. RabbitMQ). Nothing here
imports busd.

Each client is one connection with its own handler. Handlers work on raw engine events (no
MessagingHandler), so no message is decoded on the hot path: the client must not be what is
being measured.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote_plus, urlencode

from proton import Delivery, Endpoint, Handler, Link, Message, Terminus, symbol, uint
from proton.reactor import Filter, LinkOption

SESSION_FILTER = symbol("com.microsoft:session-filter")
TIMEOUT = symbol("com.microsoft:timeout")


def sas_token(audience: str, key_name: str, key: str, valid_s: int = 3600) -> str:
    """A Shared Access Signature token as the Service Bus SDKs build it."""
    expiry = str(int(time.time()) + valid_s)
    resource = quote_plus(audience)
    digest = hmac.new(key.encode(), f"{resource}\n{expiry}".encode(), hashlib.sha256).digest()
    signature = base64.b64encode(digest).decode()
    return "SharedAccessSignature " + urlencode(
        {"sr": audience, "sig": signature, "se": expiry, "skn": key_name}
    )


class Settle(LinkOption):
    """Settle modes of a link: peek-lock receivers settle second (the broker confirms each
    complete); receive-and-delete receivers ask for pre-settled deliveries."""

    def __init__(self, snd: int, rcv: int) -> None:
        self.snd, self.rcv = snd, rcv

    def apply(self, link: Link) -> None:
        link.snd_settle_mode = self.snd
        link.rcv_settle_mode = self.rcv


class Properties(LinkOption):
    def __init__(self, properties: dict) -> None:
        self.properties = properties

    def apply(self, link: Link) -> None:
        link.properties = self.properties


@dataclass
class Target:
    """Where to connect and how to authenticate."""

    host: str
    port: int
    key_name: str = "RootManageSharedAccessKey"
    key: str = "SAS_KEY_VALUE"
    cbs: bool = True  # False: SASL ANONYMOUS is all (a broker without CBS)

    @property
    def url(self) -> str:
        return f"amqp://{self.host}:{self.port}"

    def audience(self, entity: str) -> str:
        return f"sb://localhost:{self.port}/{entity}"


@dataclass
class Stats:
    """Shared by the clients of one phase."""

    expected: int
    done_count: int = 0  # messages sent-and-accepted, or received (and completed)
    errors: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    accept_latencies_s: list[float] = field(default_factory=list)  # session attach -> answer
    accept_timeouts: int = 0
    error_texts: list[str] = field(default_factory=list)

    def started(self) -> None:
        if self.first_ns is None:
            self.first_ns = time.perf_counter_ns()

    def progress(self, n: int = 1) -> None:
        self.done_count += n
        self.last_ns = time.perf_counter_ns()

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_texts) < 5:
            self.error_texts.append(text)

    @property
    def finished(self) -> bool:
        return self.done_count + self.errors >= self.expected

    @property
    def seconds(self) -> float:
        if self.first_ns is None or self.last_ns is None:
            return 0.0
        return (self.last_ns - self.first_ns) / 1e9

    @property
    def rate(self) -> float:
        return self.done_count / self.seconds if self.seconds > 0 else 0.0


class Client(Handler):
    """One connection: SASL ANONYMOUS, then a CBS put-token for `entity` (unless the target has
    no CBS), then `start()`."""

    def __init__(self, container, target: Target, entity: str, stats: Stats, phase) -> None:
        super().__init__()
        self.container = container
        self.target = target
        self.entity = entity
        self.stats = stats
        self.phase = phase  # told when this client is done
        self.closed = False
        self.conn = container.connect(
            target.url, handler=self, allowed_mechs="ANONYMOUS", sasl_enabled=True
        )
        self._cbs_out = None
        self._cbs_in = None

    def _name(self, kind: str) -> str:
        return f"{kind}-{os.urandom(6).hex()}"

    # --- CBS ------------------------------------------------------------------------------
    def on_connection_remote_open(self, event) -> None:
        if not self.target.cbs:
            self.start()
        elif self._cbs_out is None:
            self._cbs_out = self.container.create_sender(self.conn, "$cbs", name=self._name("cbs"))
            self._cbs_in = self.container.create_receiver(
                self.conn, "$cbs", name=self._name("cbs-reply")
            )
            self._cbs_in.flow(1)
            token = sas_token(
                self.target.audience(self.entity), self.target.key_name, self.target.key
            )
            request = Message(
                id=self._name("put-token"),
                reply_to="$cbs",
                body=token,
                properties={
                    "operation": "put-token",
                    "type": "jwt",
                    "name": self.target.audience(self.entity),
                },
            )
            self._cbs_out.send(request)

    def _cbs_answer(self, delivery: Delivery) -> None:
        answer = Message()
        answer.decode(delivery.link.recv(delivery.pending))
        delivery.link.advance()
        delivery.settle()
        status = (answer.properties or {}).get("status-code")
        if status != 202:
            self.fail(f"put-token answered {status}: {answer.properties}")
            return
        self.start()

    # --- engine events ----------------------------------------------------------------------
    def on_delivery(self, event) -> None:
        delivery = event.delivery
        link = delivery.link
        if link == self._cbs_in:
            if delivery.readable and not delivery.partial:
                self._cbs_answer(delivery)
            return
        if link == self._cbs_out:
            if delivery.updated:
                delivery.settle()
            return
        if link.is_sender:
            self.on_outcome(delivery)
        elif delivery.readable and not delivery.partial:
            self.on_transfer(delivery)
        elif delivery.updated and delivery.settled:
            self.on_confirmed(delivery)

    def on_link_remote_close(self, event) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.close()
        self.on_detached(link, link.remote_condition)

    def on_connection_remote_close(self, event) -> None:
        if event.connection.remote_condition is not None:
            self.fail(f"connection closed by the broker: {event.connection.remote_condition}")
        event.connection.close()

    def on_transport_error(self, event) -> None:
        if not self.closed:
            self.fail(f"transport error: {event.transport.condition}")

    # --- for subclasses ------------------------------------------------------------------------
    def start(self) -> None: ...

    def on_outcome(self, delivery: Delivery) -> None: ...

    def on_transfer(self, delivery: Delivery) -> None: ...

    def on_confirmed(self, delivery: Delivery) -> None: ...

    def on_detached(self, link: Link, condition) -> None: ...

    def fail(self, text: str) -> None:
        self.stats.error(text)
        self.stats.expected = self.stats.done_count + self.stats.errors  # stop the phase
        self.finish()

    def finish(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.close()
            self.phase.client_done(self)


class Sender(Client):
    """Sends `count` copies of pre-encoded messages (cycling through `payloads`, e.g. one per
    session) as fast as the broker's credit allows, and with `window` at most that many not
    answered yet (as a producer waiting for its sends would); done when every one is
    accepted. With `rate`, at most that many a second from the first credit on (a steady
    producer: sends that fall behind catch up, none run ahead); `stamp` turns a payload into
    the one sent, at the moment it is sent (e.g. writing the send time into it)."""

    def __init__(
        self,
        container,
        target,
        entity,
        stats,
        phase,
        *,
        count: int,
        payloads: list[bytes],
        window: int | None = None,
        rate: float | None = None,
        stamp: Callable[[bytes], bytes] | None = None,
        acked: Callable[[bytes], None] | None = None,
    ) -> None:
        super().__init__(container, target, entity, stats, phase)
        self.count = count
        self.payloads = payloads
        self.window = window
        self.rate = rate
        self.stamp = stamp
        self.acked = acked  # told of each payload the broker accepted, as the answer comes
        self.began: float | None = None  # the first credit (rate: sends are due from then)
        self.sent = 0
        self.answered = 0
        self.link = None

    def start(self) -> None:
        self.link = self.container.create_sender(self.conn, self.entity, name=self._name("send"))

    def on_link_flow(self, event) -> None:
        if event.link == self.link:
            self.stats.started()
            if self.began is None:
                self.began = time.monotonic()
                if self.rate:
                    self.container.schedule(0, self)
            self._send()

    def on_timer_task(self, event) -> None:
        """rate: send what is due, and wake when the next one is (2 ms at the least: a few
        sent together then, each stamped when it goes)."""
        if self.closed or self.sent >= self.count or self.began is None or not self.rate:
            return
        self._send()
        due = self.began + (self.sent + 1) / self.rate
        self.container.schedule(max(0.002, due - time.monotonic()), self)

    def _send(self) -> None:
        link, payloads, stamp = self.link, self.payloads, self.stamp
        limit = self.count if self.window is None else min(self.count, self.answered + self.window)
        if self.rate and self.began is not None:
            limit = min(limit, int((time.monotonic() - self.began) * self.rate) + 1)
        while link.credit > 0 and self.sent < limit:
            payload = payloads[self.sent % len(payloads)]
            link.delivery(str(self.sent).encode())
            link.send(stamp(payload) if stamp else payload)
            link.advance()
            self.sent += 1

    def on_outcome(self, delivery: Delivery) -> None:
        if not delivery.updated:
            return
        if delivery.remote_state == Delivery.ACCEPTED:
            self.stats.progress()
            if self.acked is not None:
                self.acked(self.payloads[int(delivery.tag) % len(self.payloads)])
        else:
            self.stats.error(f"send outcome {delivery.remote_state}: {delivery.remote.condition}")
        delivery.settle()
        self.answered += 1
        if self.answered >= self.count:
            self.finish()
        elif self.window is not None:
            self._send()

    def on_detached(self, link, condition) -> None:
        if link == self.link and self.answered < self.count:
            self.fail(f"sender detached: {condition}")


class Receiver(Client):
    """Receives from a queue with a credit window. Peek-lock: accept each message and count it
    when the broker confirms the complete; receive-and-delete: count each arrival."""

    def __init__(
        self,
        container,
        target,
        entity,
        stats,
        phase,
        *,
        count: int,
        window: int,
        receive_and_delete: bool,
    ) -> None:
        super().__init__(container, target, entity, stats, phase)
        self.count = count
        self.window = window
        self.rad = receive_and_delete
        self.link = None
        self.got = 0

    def start(self) -> None:
        mode = (
            Settle(Link.SND_SETTLED, Link.RCV_FIRST)
            if self.rad
            else Settle(Link.SND_UNSETTLED, Link.RCV_SECOND)
        )
        self.link = self.container.create_receiver(
            self.conn, self.entity, name=self._name("recv"), options=[mode]
        )
        self.stats.started()
        self.link.flow(min(self.window, self.count))

    def _refill(self, link) -> None:
        # Never more credit than messages still expected: a link left with credit would
        # take (and for peek-lock, lock) messages meant for the next phase.
        wanted = min(self.window, self.count - self.got)
        if link.credit < wanted // 2 or (wanted and link.credit == 0):
            link.flow(wanted - link.credit)

    def on_transfer(self, delivery: Delivery) -> None:
        link = delivery.link
        link.recv(delivery.pending)
        link.advance()
        self.got += 1
        if self.rad:
            delivery.settle()
            self.stats.progress()
            if self.got >= self.count:
                self.finish()
        else:
            delivery.update(Delivery.ACCEPTED)
        self._refill(link)

    def on_confirmed(self, delivery: Delivery) -> None:
        if delivery.remote_state == Delivery.ACCEPTED:
            self.stats.progress()
        else:
            self.stats.error(f"complete answered {delivery.remote_state}")
        delivery.settle()
        if self.stats.finished:
            self.finish()

    def on_detached(self, link, condition) -> None:
        if link == self.link and not self.stats.finished:
            self.fail(f"receiver detached: {condition}")


class SessionReceiver(Client):
    """Takes next-available sessions one after the other; drains and completes each one (it
    knows how many messages each session holds), closes the link, attaches again. Records
    the time from attach sent to attach answered."""

    def __init__(
        self,
        container,
        target,
        entity,
        stats,
        phase,
        *,
        per_session: dict[str, int],
        window: int,
        timeout_ms: int,
    ) -> None:
        super().__init__(container, target, entity, stats, phase)
        self.per_session = per_session
        self.window = window
        self.timeout_ms = timeout_ms
        self.link = None
        self.session_id = None
        self.left = 0
        self.attached_ns = 0

    def start(self) -> None:
        self.attach()

    def attach(self) -> None:
        if self.closed:
            return
        if self.stats.finished:
            self.finish()
            return
        self.session_id = None
        self.attached_ns = time.perf_counter_ns()
        self.stats.started()
        self.link = self.container.create_receiver(
            self.conn,
            self.entity,
            name=self._name("session"),
            options=[
                Filter({SESSION_FILTER: None}),
                Properties({TIMEOUT: uint(self.timeout_ms)}),
                Settle(Link.SND_UNSETTLED, Link.RCV_SECOND),
            ],
        )

    def on_link_remote_open(self, event) -> None:
        link = event.link
        if link != self.link or link.remote_source.type == Terminus.UNSPECIFIED:
            return  # refused: the detach with the reason follows
        self.stats.accept_latencies_s.append((time.perf_counter_ns() - self.attached_ns) / 1e9)
        data = link.remote_source.filter
        data.rewind()
        filters = data.get_object() if data.next() is not None else {}
        self.session_id = filters.get(SESSION_FILTER)
        self.left = self.per_session.get(self.session_id, 0)
        if self.left == 0:
            self.stats.error(f"accepted session {self.session_id!r}, which has nothing to take")
            link.close()
            return
        link.flow(min(self.window, self.left))

    def on_transfer(self, delivery: Delivery) -> None:
        link = delivery.link
        link.recv(delivery.pending)
        link.advance()
        delivery.update(Delivery.ACCEPTED)

    def on_confirmed(self, delivery: Delivery) -> None:
        if delivery.remote_state == Delivery.ACCEPTED:
            self.stats.progress()
        else:
            self.stats.error(f"complete answered {delivery.remote_state}")
        delivery.settle()
        self.left -= 1
        link = delivery.link
        if self.left <= 0:
            link.close()  # the session is drained: release it, take the next
        elif link.credit == 0:
            link.flow(min(self.window, self.left))

    def on_detached(self, link, condition) -> None:
        if link != self.link:
            return
        if condition is not None and condition.name == "com.microsoft:timeout":
            self.stats.accept_timeouts += 1
        elif condition is not None:
            self.stats.error(f"session link detached: {condition}")
        elif self.left > 0:
            self.stats.error(f"session {self.session_id!r} detached with {self.left} left")
        self.attach()

    def on_link_remote_detach(self, event) -> None:
        self.on_link_remote_close(event)


def encoded_message(body: bytes, group_id: str | None = None) -> bytes:
    message = Message(body=body)
    if group_id is not None:
        message.group_id = group_id
    return message.encode()
