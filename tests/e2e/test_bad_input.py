"""Bad input gets a clear error and loses nothing.

Garbage and malformed frames arrive on raw TCP sockets: the offending connection is closed
(with an AMQP framing error where the protocol allows one), the process keeps serving, other
connections go on working. Messages refused by the broker are not stored. At the end every
message stored before the abuse is still there and receivable, unchanged.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
)
from azure.servicebus.exceptions import ServiceBusError
from proton import Connection, Endpoint, Message, Transport

from tests.e2e.conftest import queue
from tests.e2e.test_proton_client import ProtonCbsClient

pytestmark = pytest.mark.timeout(120)

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
FRAMING_ERROR = b"amqp:connection:framing-error"
BUSD_MAX_FRAME = 256 * 1024  # what busd advertises in its open (busd.amqp.protocol)

PLAIN = [f"plain-{i}" for i in range(5)]
SESSIONS = {"s1": [f"s1-{i}" for i in range(3)], "s2": [f"s2-{i}" for i in range(3)]}


def frame(body: bytes, *, frame_type: int = 0, channel: int = 0) -> bytes:
    """An AMQP frame: 4-byte size, data offset 2 (words), type, channel, then the body."""
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


class RawConnection:
    """A TCP socket to busd. `handshake()` runs a real client engine (SASL ANONYMOUS, open,
    begin) so that the bytes written afterwards with `send_raw` land on an established
    connection with a session on channel 0."""

    def __init__(self, port: int, cert_path: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if cert_path is not None:  # TLS first, trusting busd's certificate
            context = ssl.create_default_context(cafile=cert_path)
            self.sock = context.wrap_socket(self.sock, server_hostname="localhost")
        self.engine: Transport | None = None
        self.connection: Connection | None = None

    def handshake(self) -> RawConnection:
        self.engine = Transport()
        self.engine.sasl().allowed_mechs("ANONYMOUS")
        self.connection = Connection()
        self.connection.container = "bad-input"
        self.connection.hostname = "localhost"
        self.engine.bind(self.connection)
        self.connection.open()
        session = self.connection.session()  # channel 0, for frames that need a session
        session.open()
        deadline = time.monotonic() + 5
        while not session.state & Endpoint.REMOTE_ACTIVE:
            assert time.monotonic() < deadline, "busd did not answer the open"
            while (pending := self.engine.pending()) > 0:
                self.sock.sendall(self.engine.peek(pending))
                self.engine.pop(pending)
            data = self.sock.recv(65536)
            assert data, "busd closed the socket during the handshake"
            self.engine.push(data)
        return self

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # busd may close before reading it all: that is the point

    def read_until_closed(self, wait: float = 5) -> tuple[bytes, bool]:
        """Everything busd writes until it closes the socket; (data, closed within `wait`)."""
        data = b""
        deadline = time.monotonic() + wait
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
                if not chunk:
                    return data, True
                data += chunk
        except (ConnectionResetError, ssl.SSLError):  # e.g. closed without a TLS close_notify
            return data, True
        except TimeoutError:
            pass
        return data, False

    def close(self) -> None:
        self.sock.close()


def close_condition(raw: RawConnection, data: bytes):
    """busd's close frame as read by the client engine of a handshaken connection."""
    if data:
        try:
            raw.engine.push(data)
        except Exception:
            pass  # what follows the close frame does not matter
    return raw.connection.remote_condition


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory(
        [
            queue("keep"),
            queue("keep-sessions", RequiresSession=True),
            queue("scratch"),
            queue("probe"),
        ]
    )


@pytest.fixture(scope="module")
def stored(busd):
    """The messages stored before any abuse: plain ones with their sequence numbers."""
    with ServiceBusClient.from_connection_string(busd.connection_string) as client:
        with client.get_queue_sender("keep") as sender:
            sender.send_messages([ServiceBusMessage(body) for body in PLAIN])
        with client.get_queue_sender("keep-sessions") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(body, session_id=sid)
                    for sid, bodies in SESSIONS.items()
                    for body in bodies
                ]
            )
        with client.get_queue_receiver("keep") as receiver:
            peeked = receiver.peek_messages(max_message_count=len(PLAIN) + 5)
    assert [str(m) for m in peeked] == PLAIN
    return [(m.sequence_number, str(m)) for m in peeked]


@pytest.fixture(scope="module")
def bystander(busd, stored):
    """A client connected before the abuse, with a sender and receiver attached throughout."""
    client = ProtonCbsClient(busd.port)
    client.authorize("scratch")
    sender = client.sender("scratch")
    receiver = client.receiver("scratch")
    yield sender, receiver
    client.close()


def assert_bystander_works(bystander, body: str) -> None:
    sender, receiver = bystander
    sender.send(Message(body=body))
    assert receiver.receive(timeout=5).body == body
    receiver.accept()


def assert_serving(busd) -> None:
    assert busd.proc.poll() is None, f"busd exited:\n{busd.log_text()[-3000:]}"
    with ProtonCbsClient(busd.port) as client:
        client.authorize("probe")
        sender = client.sender("probe")
        sender.send(Message(body="still serving"))
        receiver = client.receiver("probe")
        assert receiver.receive(timeout=5).body == "still serving"
        receiver.accept()


# What busd answers garbage with on a port that serves AMQP and HTTP, told apart by the first
# byte (docs/management.md §1): an HTTP request line gets HTTP, bytes that cannot start one get
# the AMQP header and a framing error, a TLS hello the handshake; each then closes the socket.
HTTP_OK = b"HTTP/1.1 200 "
HTTP_BAD_REQUEST = b"HTTP/1.1 400 "
TLS_ALERT = 0x15  # the record type of a TLS alert, as a failed handshake may send before closing
# A whole ClientHello record (512 bytes, as its header says) that says nothing a TLS server
# can use: version 3.3, then zeros (no cipher suites, no compression methods).
BAD_CLIENT_HELLO = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03").ljust(5 + 512, b"\x00")
GARBAGE = {
    "http": (b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", HTTP_OK),
    "http-bad-request-line": (b"HELLO\r\n\r\n", HTTP_BAD_REQUEST),
    "zeros": (b"\x00" * 64, AMQP_HEADER),
    "amqp-tls-header": (b"AMQP\x01\x01\x00\x00", AMQP_HEADER),  # a protocol id busd lacks
    "amqp-wrong-version": (b"AMQP\x00\x02\x00\x00", AMQP_HEADER),  # no such AMQP version
    "tls-client-hello": (BAD_CLIENT_HELLO, None),
}
PLAIN_PORTS = {"amqp-port": lambda b: b.port, "http-port": lambda b: b.http_port}


def assert_answered(garbage: bytes, answer: bytes | None, data: bytes, closed: bool) -> None:
    assert closed, f"busd kept the connection open after {garbage[:16]!r}; it sent {data!r}"
    if answer is None:  # a failed TLS handshake: at most an alert
        assert data == b"" or data[0] == TLS_ALERT, data
    elif answer == AMQP_HEADER:
        # The protocol header busd speaks, then open + close with the error, so the peer can
        # tell what went wrong.
        assert data.startswith(answer), data
        assert FRAMING_ERROR in data, data
    else:
        assert data.startswith(answer), data


@pytest.mark.parametrize("port_of", PLAIN_PORTS.values(), ids=PLAIN_PORTS.keys())
@pytest.mark.parametrize("garbage, answer", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_gets_the_answer_of_the_protocol_it_resembles_and_the_socket_closed(
    busd, stored, bystander, port_of, garbage, answer
):
    raw = RawConnection(port_of(busd))
    raw.send_raw(garbage)
    data, closed = raw.read_until_closed()
    raw.close()
    assert_answered(garbage, answer, data, closed)
    assert_bystander_works(bystander, f"after {garbage[:8]!r}")


@pytest.mark.parametrize(
    "garbage, answer",
    [g for name, g in GARBAGE.items() if name != "tls-client-hello"],
    ids=[name for name in GARBAGE if name != "tls-client-hello"],
)
def test_garbage_inside_tls_gets_the_same_answers_on_the_tls_port(
    busd, stored, bystander, garbage, answer
):
    raw = RawConnection(busd.tls_port, cert_path=busd.cert_path)
    raw.send_raw(garbage)
    data, closed = raw.read_until_closed()
    raw.close()
    assert_answered(garbage, answer, data, closed)
    assert_bystander_works(bystander, f"after {garbage[:8]!r} over TLS")


@pytest.mark.parametrize("garbage", [g for g, _ in GARBAGE.values()], ids=GARBAGE.keys())
def test_plain_garbage_on_the_tls_port_is_closed_unanswered(busd, stored, bystander, garbage):
    """The TLS port takes nothing but TLS: plain bytes get no answer (a TLS client could not
    read one), a malformed hello fails its handshake."""
    raw = RawConnection(busd.tls_port)
    raw.send_raw(garbage)
    data, closed = raw.read_until_closed()
    raw.close()
    assert_answered(garbage, None, data, closed)
    assert_bystander_works(bystander, f"after {garbage[:8]!r} on the TLS port")


@pytest.mark.parametrize("header", [SASL_HEADER, AMQP_HEADER], ids=["sasl", "amqp"])
@pytest.mark.parametrize(
    "bad_frame",
    [
        struct.pack(">IBBH", 4, 2, 0, 0),  # size below the 8-byte frame header
        struct.pack(">IBBH", 16, 1, 0, 0) + b"\x00" * 8,  # data offset below 2 words
        struct.pack(">IBBH", 0xFFFFFFF0, 2, 0, 0) + b"\x00" * 64,  # a 4 GiB frame
    ],
    ids=["size-4", "doff-1", "size-4g"],
)
def test_malformed_frame_after_a_header_closes_only_that_connection(
    busd, stored, bystander, header, bad_frame
):
    raw = RawConnection(busd.port)
    raw.send_raw(header + bad_frame)
    data, closed = raw.read_until_closed()
    raw.close()
    assert closed, f"busd kept the connection open; it sent {data!r}"
    assert data.startswith(header), data
    if header == AMQP_HEADER:
        assert FRAMING_ERROR in data, data  # open + close(framing-error)
    # (SASL has no error frame of its own: busd's SASL header, then the socket closes.)
    assert_bystander_works(bystander, f"after a bad frame on {header!r}")


def test_oversized_frame_on_an_open_connection_is_a_framing_error(busd, stored, bystander):
    raw = RawConnection(busd.port).handshake()
    assert raw.engine.remote_max_frame_size == BUSD_MAX_FRAME
    # A transfer-sized frame twice busd's limit: the header alone says it is too large.
    raw.send_raw(struct.pack(">IBBH", 2 * BUSD_MAX_FRAME, 2, 0, 0) + b"\x00\x53\x14" + b"x" * 1000)
    data, closed = raw.read_until_closed()
    condition = close_condition(raw, data)
    raw.close()
    assert closed, "busd kept the connection open after an oversized frame"
    assert condition is not None and condition.name == "amqp:connection:framing-error", condition
    assert_bystander_works(bystander, "after an oversized frame")


@pytest.mark.parametrize(
    "bad_frame",
    [
        frame(b"\x00\x53\x99\x45"),  # performative 0x99: no such thing
        frame(b"\x00\xa1\x03abc"),  # a descriptor that is a string
    ],
    ids=["unknown-performative", "string-descriptor"],
)
def test_malformed_performative_on_an_open_connection_closes_it(busd, stored, bystander, bad_frame):
    raw = RawConnection(busd.port).handshake()
    raw.send_raw(bad_frame)
    data, closed = raw.read_until_closed(wait=5)
    condition = close_condition(raw, data)
    raw.close()
    assert_bystander_works(bystander, "after a malformed performative")
    # An engine that stops reading must not leave the peer hanging on a half-dead connection:
    # busd answers with a close carrying the error, then closes the socket.
    assert closed, (
        f"busd stopped reading after {bad_frame!r} but neither sent a close nor closed the "
        f"socket within 5 s (it sent {data!r})"
    )
    assert condition is not None, "the socket was closed without an AMQP close frame"
    assert condition.name in ("amqp:connection:framing-error", "amqp:decode-error"), condition


def test_attach_without_its_fields_is_refused_and_the_connection_lives_on(busd, stored, bystander):
    raw = RawConnection(busd.port).handshake()
    raw.send_raw(frame(b"\x00\x53\x12\x45"))  # attach(): no name, no address, nothing
    data, closed = raw.read_until_closed(wait=1)
    assert not closed
    # busd answers attach + detach (descriptor 0x16) with an error naming the problem.
    assert b"\x00\x53\x16" in data and b"amqp:not-found" in data, data
    assert b"an entity address is required" in data, data
    # The connection still works: an empty frame (a heartbeat) is fine, a close is answered.
    raw.send_raw(struct.pack(">IBBH", 8, 2, 0, 0))
    raw.connection.close()
    while (pending := raw.engine.pending()) > 0:
        raw.send_raw(raw.engine.peek(pending))
        raw.engine.pop(pending)
    data, closed = raw.read_until_closed()
    raw.close()
    assert closed and b"\x00\x53\x18" in data, data  # busd's close (descriptor 0x18)


def test_message_without_session_id_on_a_session_queue_is_refused(busd, stored):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with client.get_queue_sender("keep-sessions") as sender:
            with pytest.raises(ServiceBusError) as refused:
                sender.send_messages(ServiceBusMessage("no session id"))
            assert "SessionId" in str(refused.value)
            # A batch with one bad message is refused whole: the good ones are not stored.
            with pytest.raises(ServiceBusError):
                sender.send_messages(
                    [ServiceBusMessage("good", session_id="s1"), ServiceBusMessage("bad")]
                )


def test_wrong_kind_of_receiver_is_refused(busd, stored):
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with pytest.raises(ServiceBusError) as refused:
            with client.get_queue_receiver("keep", session_id="s1") as receiver:
                receiver.receive_messages(max_wait_time=1)
        assert "session" in str(refused.value).lower()
        with pytest.raises(ServiceBusError) as refused:
            with client.get_queue_receiver("keep-sessions") as receiver:
                receiver.receive_messages(max_wait_time=1)
        assert "session" in str(refused.value).lower()
        with pytest.raises(ServiceBusError):
            with client.get_queue_receiver(
                "keep", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
            ) as receiver:
                receiver.receive_messages(max_wait_time=1)


def test_after_all_that_every_stored_message_is_still_there(busd, stored):
    assert_serving(busd)
    with ServiceBusClient.from_connection_string(busd.connection_string, retry_total=0) as client:
        with client.get_queue_receiver("keep", max_wait_time=2) as receiver:
            got = []
            deadline = time.monotonic() + 15
            while len(got) < len(PLAIN) + 1 and time.monotonic() < deadline:
                batch = receiver.receive_messages(max_message_count=10, max_wait_time=1)
                if not batch:
                    break
                got.extend(batch)
            assert [(m.sequence_number, str(m)) for m in got] == stored
            assert all(m.delivery_count == 0 for m in got)
            for m in got:
                receiver.complete_message(m)

        received: dict[str, list[str]] = {}
        for _ in range(len(SESSIONS) + 1):
            try:
                receiver = client.get_queue_receiver(
                    "keep-sessions",
                    session_id=NEXT_AVAILABLE_SESSION,
                    max_wait_time=1,
                    receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                )
                receiver.__enter__()
            except ServiceBusError:
                break  # no session left
            try:
                sid = receiver.session.session_id
                messages = receiver.receive_messages(max_message_count=10, max_wait_time=1)
                assert all(m.delivery_count == 0 for m in messages)
                received[sid] = [str(m) for m in messages]
            finally:
                receiver.__exit__(None, None, None)
    # Nothing refused was stored ("good" of the refused batch included), nothing was lost.
    assert received == SESSIONS
    assert busd.proc.poll() is None
    assert "Traceback" not in busd.log_text(), busd.log_text()[-3000:]
