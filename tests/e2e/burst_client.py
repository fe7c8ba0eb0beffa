"""An AMQP 1.0 client on proton's engine, pumped by hand over a plain socket, for tests that
need to control what goes out in which TCP write.

`EngineClient` owns one socket, one `proton.Transport`/`Connection`/`Collector` and one AMQP
session. Nothing leaves the process until `flush()`, which takes *all* the output the engine
has produced and hands it to the kernel in one `sendall` - so settling a batch of deliveries
and closing the link (or the connection) before one `flush()` puts the dispositions and the
detach (or close) frame in one TCP write. With `trace=True` every outgoing frame is recorded
with the number of the write that carried it (`frames_of_write`), so a test can check that.

Run as a script it is a load generator (`python burst_client.py load --port P --queue Q ...`):
one connection that, until told to stop (stdin closed, or its deadline), sends a batch to one
of its own sessions, accepts that session, receives and completes the batch and detaches,
round after round; it prints a JSON line with what it did when it stops.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field

from proton import (
    Collector,
    Connection,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Transport,
    uint,
)

# Run as a script (the load generator) from anywhere: the repository root must be importable.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from busd.auth.sas import generate_sas_token  # noqa: E402
from tests.e2e.amqp_client import (  # noqa: E402
    LOCKED_UNTIL,
    SAS_KEY,
    SAS_KEY_NAME,
    SEQUENCE_NUMBER,
    SESSION_FILTER,
    TIMEOUT,
)

CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
NO_SESSION = "com.microsoft:timeout"
NEXT_AVAILABLE = object()

REMOTE_ACTIVE = Endpoint.REMOTE_ACTIVE
REMOTE_CLOSED = Endpoint.REMOTE_CLOSED


class Refused(Exception):
    """The broker answered an attach with a detach carrying an error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


@dataclass
class Received:
    delivery: Delivery
    message: Message
    at: float  # time.monotonic() when the client had it

    @property
    def body(self):
        return self.message.body

    @property
    def seq(self) -> int | None:
        return (self.message.annotations or {}).get(SEQUENCE_NUMBER)


@dataclass
class SessionReceiver:
    """A session receiver link and what has come in on it."""

    client: EngineClient
    link: Link
    received: list[Received] = field(default_factory=list)
    attached_at: float = 0.0  # monotonic time the client saw the broker's attach
    session_id: str | None = None

    def wait_for(self, count: int, timeout: float = 15) -> list[Received]:
        self.client.wait(
            lambda: len(self.received) >= count or self.gone,
            timeout,
            f"{count} messages on {self.link.name} (have {len(self.received)})",
        )
        return self.received

    @property
    def gone(self) -> bool:
        return bool(self.link.state & REMOTE_CLOSED)

    @property
    def locked(self) -> bool:
        """The broker answered the attach: it holds the session's lock for us."""
        link = self.link
        return (
            not self.gone
            and bool(link.state & REMOTE_ACTIVE)
            and LOCKED_UNTIL in (link.remote_properties or {})
        )

    def refusal(self) -> Refused:
        """The error the broker detached this (never locked) link with; closes our end."""
        cond = self.link.remote_condition
        if not (self.link.state & Endpoint.LOCAL_CLOSED):
            self.link.close()
        return Refused(cond.name if cond else "?", cond.description if cond else "")

    def mark_locked(self) -> None:
        self.attached_at = time.monotonic()
        self.session_id = _filter_value(self.link)


class EngineClient:
    """One AMQP connection whose writes the test controls (see the module docstring)."""

    def __init__(
        self, port: int, *, timeout: float = 15, trace: bool = False, container: str | None = None
    ) -> None:
        self.port = port
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.transport = Transport()
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.writes = 0  # sendall calls so far
        self.frames: list[tuple[int, str]] = []  # (number of the write carrying it, frame)
        if trace:
            self.transport.trace(Transport.TRACE_FRM)
            self.transport.tracer = self._trace
        self.conn = Connection()
        self.conn.container = container or f"burst-{uuid.uuid4().hex[:8]}"
        self.conn.hostname = "localhost"
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.transport.bind(self.conn)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()
        self.eof = False
        self._inbox: dict[Link, list[Received]] = {}
        self._cbs: tuple[Link, Link] | None = None
        self._authorized: set[str] = set()

    # --- I/O -----------------------------------------------------------------------------
    def _trace(self, _transport, message: str) -> None:
        # `FRAME: <channel> -> @detach(22) [...]`: outgoing, so it goes out with the next write
        if " -> " in message:
            self.frames.append((self.writes + 1, message.split(" -> ", 1)[1]))

    def flush(self) -> int:
        """Write everything the engine has produced, in one sendall; returns the byte count."""
        out = bytearray()
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                break
            out += self.transport.peek(pending)
            self.transport.pop(pending)
        if out:
            self.sock.setblocking(True)
            try:
                self.sock.sendall(out)
            finally:
                self.sock.setblocking(False)
            self.writes += 1
        return len(out)

    def frames_of_write(self, number: int) -> list[str]:
        return [frame for n, frame in self.frames if n == number]

    def fileno(self) -> int:
        return self.sock.fileno()

    def pump(self, timeout: float) -> None:
        """Write what is pending, then take in what arrives within `timeout` (at most one read
        after waiting) and handle the engine's events."""
        self.flush()
        if not self.eof:
            readable, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            if readable:
                self.read()
        self.transport.tick(time.monotonic())
        self._events()

    def read(self) -> None:
        """One non-blocking read into the engine (for callers that select themselves), then
        the engine's events."""
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            data = None
        except ConnectionResetError:
            data = b""
        if data is not None and not data:
            self.eof = True
            self.transport.close_tail()
        elif data:
            view = memoryview(data)
            while view:
                capacity = self.transport.capacity()
                if capacity <= 0:
                    break
                self.transport.push(bytes(view[:capacity]))
                view = view[capacity:]
        self._events()

    def _events(self) -> None:
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                link = event.link
                delivery = event.delivery
                if link.is_receiver and delivery.readable and not delivery.partial:
                    data = link.recv(delivery.pending)
                    link.advance()
                    message = Message()
                    message.decode(data)
                    self._inbox.setdefault(link, []).append(
                        Received(delivery, message, time.monotonic())
                    )
            self.collector.pop()

    def wait(self, done, timeout: float | None = None, what: str = "the broker") -> None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waited too long for {what}")
            if self.eof and not done():
                self._events()
                if not done():
                    raise ConnectionError(f"connection closed while waiting for {what}")
            self.pump(min(remaining, 0.5))

    def close(self, timeout: float = 5) -> None:
        """Close the connection, wait for the broker's close (or EOF), close the socket."""
        try:
            if not (self.conn.state & Endpoint.LOCAL_CLOSED):
                self.conn.close()
            self.wait(
                lambda: bool(self.conn.state & REMOTE_CLOSED) or self.eof, timeout, "the close"
            )
        except (OSError, TimeoutError, ConnectionError):
            pass
        finally:
            self.sock.close()

    def drain_and_close(self, timeout: float = 5) -> None:
        """For a socket already shut for writing: read until the broker closes, then close."""
        deadline = time.monotonic() + timeout
        try:
            while not self.eof and time.monotonic() < deadline:
                self.pump(0.2)
        except OSError:
            pass
        finally:
            self.sock.close()

    # --- CBS -------------------------------------------------------------------------------
    def audience(self, entity: str) -> str:
        return f"sb://localhost:{self.port}/{entity}"

    def authorize(self, entity: str) -> None:
        if entity in self._authorized:
            return
        if self._cbs is None:
            requests = self.session.sender(f"cbs-out-{uuid.uuid4().hex[:8]}")
            requests.target.address = "$cbs"
            requests.source.address = "$cbs"
            requests.open()
            responses = self.session.receiver(f"cbs-in-{uuid.uuid4().hex[:8]}")
            responses.source.address = "$cbs"
            responses.target.address = "$cbs"
            responses.open()
            responses.flow(10)
            self._cbs = (requests, responses)
        requests, responses = self._cbs
        audience = self.audience(entity)
        token = generate_sas_token(audience, SAS_KEY_NAME, SAS_KEY, int(time.time()) + 3600)
        request = Message(
            id=str(uuid.uuid4()),
            reply_to="$cbs",
            body=token,
            properties={"operation": "put-token", "type": "jwt", "name": audience},
        )
        inbox = self._inbox.setdefault(responses, [])
        before = len(inbox)
        delivery = requests.delivery(uuid.uuid4().bytes)
        requests.send(request.encode())
        requests.advance()
        self.wait(lambda: len(inbox) > before, what="the put-token answer")
        status = inbox[-1].message.properties["status-code"]
        if status != 202:
            raise RuntimeError(f"put-token for {entity} answered {status}")
        delivery.settle()
        if responses.credit < 5:
            responses.flow(10)
        self._authorized.add(entity)

    # --- sending ---------------------------------------------------------------------------
    def send(self, entity: str, messages: list[Message], timeout: float = 30) -> None:
        """Send `messages` on a new sender link, pipelined; returns once each is accepted."""
        self.authorize(entity)
        link = self.session.sender(f"sender-{uuid.uuid4()}")
        link.target.address = entity
        link.open()
        deliveries = []
        for message in messages:
            delivery = link.delivery(uuid.uuid4().bytes)
            link.send(message.encode())
            link.advance()
            deliveries.append(delivery)
        self.wait(
            lambda: (
                all(d.remote_state or d.settled for d in deliveries)
                or bool(link.state & REMOTE_CLOSED)
            ),
            timeout,
            f"{len(messages)} sends",
        )
        bad = [d.remote_state for d in deliveries if d.remote_state != Delivery.ACCEPTED]
        if bad or link.state & REMOTE_CLOSED:
            raise RuntimeError(f"send refused: {bad[:3]} {link.remote_condition}")
        for d in deliveries:
            d.settle()
        link.close()
        self.flush()

    # --- receiving -------------------------------------------------------------------------
    def attach(
        self, entity: str, session=None, *, credit: int = 0, timeout_ms: int | None = None
    ) -> SessionReceiver:
        """Send a session receiver's attach (and its credit), without waiting for an answer.
        `session`: a session id or NEXT_AVAILABLE."""
        self.authorize(entity)
        link = self.session.receiver(f"receiver-{uuid.uuid4()}")
        link.source.address = entity
        link.target.address = f"client-{uuid.uuid4().hex[:8]}"
        value = None if session is NEXT_AVAILABLE else session
        link.source.filter.put_dict({SESSION_FILTER: value})
        if timeout_ms is not None:
            link.properties = {TIMEOUT: uint(timeout_ms)}
        link.open()
        if credit:
            link.flow(credit)
        receiver = SessionReceiver(self, link, self._inbox.setdefault(link, []))
        return receiver

    def accept(
        self,
        entity: str,
        session=None,
        *,
        credit: int = 0,
        timeout_ms: int | None = None,
        timeout: float | None = None,
    ) -> SessionReceiver:
        """Attach a session receiver and wait until the broker answers: returns it once the
        session is locked, raises Refused when the broker detaches it with an error."""
        receiver = self.attach(entity, session, credit=credit, timeout_ms=timeout_ms)
        self.wait(
            lambda: receiver.gone or receiver.locked,
            timeout,
            f"the answer to attach {receiver.link.name}",
        )
        if not receiver.locked:
            refused = receiver.refusal()
            self.flush()
            raise refused
        receiver.mark_locked()
        return receiver

    def detach(self, receiver: SessionReceiver, timeout: float | None = None) -> float:
        """Close the link, wait for the broker's detach; returns when the detach was sent."""
        sent_at = self.close_link(receiver)
        self.wait(lambda: receiver.gone, timeout, f"the detach answer on {receiver.link.name}")
        return sent_at

    def close_link(self, receiver: SessionReceiver) -> float:
        receiver.link.close()
        sent_at = time.monotonic()
        self.flush()
        return sent_at


def _filter_value(link: Link) -> str | None:
    source = link.remote_source
    if source is None or source.filter is None:
        return None
    data = source.filter
    data.rewind()
    if data.next() is None:
        return None
    value = (data.get_object() or {}).get(SESSION_FILTER)
    if hasattr(value, "value"):
        value = value.value
    return value if value is None else str(value)


def complete(items: list[Received]) -> None:
    """Settle each delivery as accepted (complete), client-settled; sends nothing yet."""
    for item in items:
        item.delivery.update(Delivery.ACCEPTED)
        item.delivery.settle()


# --- load generator (run as a script) ---------------------------------------------------------
def run_load(
    port: int, queue: str, worker: str, batch: int, sessions: int, deadline_s: float
) -> dict:
    """Send, accept, receive, complete, detach - on `sessions` sessions of this worker's own,
    round robin - until stdin is closed or the deadline passes."""
    stats = {"worker": worker, "rounds": 0, "sent": 0, "completed": 0, "refused": 0, "errors": 0}
    deadline = time.monotonic() + deadline_s
    client = EngineClient(port, timeout=15)
    client.authorize(queue)
    round_no = 0
    stdin = sys.stdin.fileno()
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([stdin], [], [], 0)
            if readable and not os.read(stdin, 4096):
                break  # the test closed our stdin: stop
            sid = f"load-{worker}-{round_no % sessions}"
            round_no += 1
            try:
                client.send(queue, [Message(body=f"{sid}:{i}", group_id=sid) for i in range(batch)])
                stats["sent"] += batch
                try:
                    receiver = client.accept(queue, sid, credit=batch, timeout=15)
                except Refused:
                    stats["refused"] += 1
                    continue
                items = receiver.wait_for(batch)
                complete(items)
                stats["completed"] += len(items)
                client.detach(receiver)
                stats["rounds"] += 1
            except (TimeoutError, ConnectionError, OSError):
                stats["errors"] += 1
                client.sock.close()
                client = EngineClient(port, timeout=15)
                client.authorize(queue)
    finally:
        client.close(timeout=2)
    return stats


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="burst_client")
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load")
    load.add_argument("--port", type=int, required=True)
    load.add_argument("--queue", required=True)
    load.add_argument("--worker", required=True)
    load.add_argument("--batch", type=int, default=10)
    load.add_argument("--sessions", type=int, default=4)
    load.add_argument("--deadline", type=float, default=120)
    args = parser.parse_args(argv)
    stats = run_load(args.port, args.queue, args.worker, args.batch, args.sessions, args.deadline)
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
