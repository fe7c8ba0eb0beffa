"""HTTP as a hostile client uses it, against a real busd over TCP: large bodies before any key
is checked, slow heads, more connections than the cap, and web pages of other sites (a foreign
Host after DNS rebinding, a foreign Origin on the WebSocket port). Each is refused before busd
holds anything for it, and a real client is still served (docs/management.md §1,
docs/design.md §3.2)."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from busd.auth.sas import generate_sas_token
from tests.e2e.conftest import queue

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def busd(busd_factory):
    return busd_factory([queue("q"), queue("other")])


@pytest.fixture(scope="module")
def capped(busd_factory):
    """A busd with a small HTTP cap and deadline, a host name and an allowed origin."""
    return busd_factory(
        [queue("q")],
        extra_env={
            "BUSD_MAX_HTTP_CONNECTIONS": "8",
            "BUSD_HTTP_REQUEST_TIMEOUT": "2",
            "BUSD_HOSTNAME": "busd.internal",
            "BUSD_ALLOWED_ORIGIN": "https://app.example:8443",
        },
    )


def token(key: str = "SAS_KEY_VALUE") -> str:
    return generate_sas_token(
        "sb://localhost/", "RootManageSharedAccessKey", key, int(time.time()) + 300
    )


def memory_mib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of a process, in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) // 1024, int(fields["VmHWM"].split()[0]) // 1024


def head(method: str, path: str, host: str = "localhost", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def answer_to_head(port: int, request_head: bytes, wait: float = 5) -> bytes:
    """Send a request's head only (its body announced, never sent): busd's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as raw:
        raw.sendall(request_head)
        return raw.recv(65536)


def exchange(port: int, data: bytes, wait: float = 5) -> bytes:
    """Everything busd writes to `data` until it closes the connection."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as raw:
        raw.sendall(data)
        try:
            while chunk := raw.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
    return got


def stream_body(port: int, request_head: bytes, size: int, chunked: bool = False) -> bytes:
    """A request whose body of `size` bytes is streamed as fast as busd takes it; busd's
    answer (what it wrote before it closed)."""
    block = b"x" * MIB
    if chunked:
        block = b"%x\r\n%s\r\n" % (len(block), block)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(request_head)
        try:
            for _ in range(size // MIB):
                raw.sendall(block)
        except OSError:
            pass  # busd closed it: the rest was never read
        try:
            return raw.recv(65536)
        except OSError as exc:
            return repr(exc).encode()


def test_four_large_bodies_before_any_key_are_refused_unread(busd):
    """Four POST /health with 64 MiB bodies at once (one chunked, so no length up front):
    each is answered 413 and busd's memory does not grow by anything like the bodies."""
    _, peak_before = memory_mib(busd.proc.pid)
    answers: list[bytes] = []

    def attack(i: int) -> None:
        chunked = i == 3
        framing = {"Transfer_Encoding": "chunked"} if chunked else {"Content_Length": 64 * MIB}
        answers.append(
            stream_body(
                busd.http_port, head("POST", "/health", **framing), 64 * MIB, chunked=chunked
            )
        )

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _, peak_after = memory_mib(busd.proc.pid)
    # 256 MiB were sent at it; before bodies were bounded its peak grew by more than that
    assert peak_after - peak_before < 16, (peak_before, peak_after)
    assert [status_of(a) for a in answers] == [413] * 4, answers
    assert status_of(exchange(busd.http_port, head("GET", "/health", Connection="close"))) == 200


def test_a_wrong_key_or_route_is_answered_before_the_body(busd):
    """The head alone decides: 401 for a wrong key, 404 for no route, before a byte of the
    64 MiB body announced is sent (busd would wait for it otherwise)."""
    wrong = token("WRONG")
    for request_head, status in [
        (
            head("POST", "/admin/queues/q/messages", Authorization=wrong, Content_Length=64 * MIB),
            401,
        ),
        (head("PUT", "/q2?api-version=2021-05", Authorization=wrong, Content_Length=64 * MIB), 401),
        (head("POST", "/admin/queues/q/purge", Content_Length=64 * MIB), 401),
        (head("POST", "/nothing-here", Content_Length=64 * MIB), 404),
        (head("POST", "/dashboard/login", Content_Length=64 * MIB), 413),
    ]:
        started = time.monotonic()
        assert status_of(answer_to_head(busd.http_port, request_head)) == status, request_head
        assert time.monotonic() - started < 2
    # a refusal of a request without a body keeps the connection for the next one
    got = exchange(
        busd.http_port,
        head("GET", "/admin/queues", Authorization=wrong)
        + head("GET", "/health", Connection="close"),
    )
    assert got.startswith(b"HTTP/1.1 401 ") and b"HTTP/1.1 200 OK" in got, got


def _count(busd, name: str) -> int:
    got = exchange(
        busd.http_port,
        head("GET", f"/admin/queues/{name}", Authorization=token(), Connection="close"),
    )
    assert status_of(got) == 200, got
    return json.loads(got.partition(b"\r\n\r\n")[2])["counts"]["active"]


def test_a_send_larger_than_its_queue_takes_is_413_and_stores_nothing(busd):
    """The queue takes messages of 1 MiB (busd's default): a send announcing 8 MiB is refused
    unread, a chunked one once past what the queue takes, one just over its size by the
    message's own check; the queue stays empty. A management PUT is bounded too."""
    send = "/admin/queues/other/messages"
    announced = head("POST", send, Authorization=token(), Content_Length=8 * MIB)
    assert status_of(answer_to_head(busd.http_port, announced)) == 413
    chunked = head("POST", send, Authorization=token(), Transfer_Encoding="chunked")
    assert status_of(stream_body(busd.http_port, chunked, 8 * MIB, chunked=True)) == 413
    just_over = json.dumps({"body_base64": base64.b64encode(b"x" * (MIB + 1)).decode()}).encode()
    got = exchange(
        busd.http_port,
        head("POST", send, Authorization=token(), Content_Length=len(just_over), Connection="close")
        + just_over,
    )
    assert status_of(got) == 413 and b"exceeds the limit" in got, got
    assert _count(busd, "other") == 0
    fits = json.dumps({"body_base64": base64.b64encode(b"x" * (MIB - 4096)).decode()}).encode()
    got = exchange(
        busd.http_port,
        head("POST", send, Authorization=token(), Content_Length=len(fits), Connection="close")
        + fits,
    )
    assert status_of(got) == 201, got
    assert _count(busd, "other") == 1
    atom_put = head(
        "PUT", "/big?api-version=2021-05", Authorization=token(), Content_Length=4 * MIB
    )
    assert status_of(answer_to_head(busd.http_port, atom_put)) == 413


ROUTES = [
    "/health",
    "/",
    "/admin/queues",
    "/$Resources/queues?api-version=2021-05",
    "/q?api-version=2021-05",
]


@pytest.mark.parametrize("path", ROUTES)
def test_a_foreign_host_is_refused_on_every_route(busd, path):
    """A page whose DNS name was rebound to 127.0.0.1 sends its own name as Host: refused
    (421) with a token that works, while the names busd serves are answered."""
    port = busd.http_port
    for host in ("evil.example", f"evil.example:{port}", "localhost.evil.example", "x"):
        got = exchange(
            port, head("GET", path, host=host, Authorization=token(), Connection="close")
        )
        assert status_of(got) == 421 and b"does not serve the host" in got, (host, got)
    for host in (
        f"localhost:{port}",
        "localhost",
        f"127.0.0.1:{port}",
        f"[::1]:{port}",
        "10.1.2.3",
    ):
        got = exchange(
            port, head("GET", path, host=host, Authorization=token(), Connection="close")
        )
        assert status_of(got) == 200, (host, got)


def test_a_namespace_host_is_served(busd):
    got = exchange(
        busd.http_port,
        head(
            "GET",
            "/$Resources/queues?api-version=2021-05",
            host=f"team-h.localhost:{busd.http_port}",
            Authorization=token(),
            Connection="close",
        ),
    )
    assert status_of(got) == 200, got


def upgrade(port: int, origin: str | None) -> int:
    """The status of a WebSocket upgrade to busd's AMQP endpoint from a page of `origin`."""
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec_WebSocket_Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec_WebSocket_Version": "13",
        "Sec_WebSocket_Protocol": "AMQPWSB10",
    }
    if origin is not None:
        headers["Origin"] = origin
    return status_of(answer_to_head(port, head("GET", "/$servicebus/websocket", **headers)))


def test_a_websocket_from_a_page_of_another_site_is_refused(busd):
    port = busd.ws_port
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", "http://10.1.2.3"):
        assert upgrade(port, origin) == 403, origin
    for origin in (
        None,
        f"http://localhost:{port}",
        "https://team-h.localhost",
        "http://127.0.0.1",
    ):
        assert upgrade(port, origin) == 101, origin


def test_configured_hostnames_and_origins_are_served(capped):
    assert upgrade(capped.ws_port, "https://app.example:8443") == 101
    assert upgrade(capped.ws_port, "http://busd.internal:8080") == 101
    assert upgrade(capped.ws_port, "https://app.example") == 403  # another port: another origin
    assert (
        status_of(
            exchange(
                capped.http_port,
                head("GET", "/health", host="busd.internal:5300", Connection="close"),
            )
        )
        == 200
    )
    assert (
        status_of(
            exchange(
                capped.http_port, head("GET", "/health", host="app.example", Connection="close")
            )
        )
        == 421
    )


def _half_heads(port: int, count: int) -> list[socket.socket]:
    """Connections that start a request and never finish its head (slowloris)."""
    held = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        held.append(raw)
    time.sleep(0.3)  # each is handed to HTTP by its first bytes
    return held


def _closed_by_busd(raw: socket.socket) -> bool:
    raw.settimeout(0.05)
    try:
        while raw.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def _authenticated_bodies(port: int, count: int) -> list[socket.socket]:
    """Connections inside an authenticated request: a send whose key was checked and whose
    body has not arrived yet."""
    held = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        raw.sendall(
            head("POST", "/admin/queues/q/messages", Authorization=token(), Content_Length=100)
        )
        held.append(raw)
    time.sleep(0.3)  # each is admitted, its body awaited
    return held


def test_slow_heads_yield_to_a_new_client_and_are_closed(capped):
    """Eight half-sent heads fill the cap of 8: a ninth connection takes the place of the
    oldest. busd closes the rest after the request timeout (2 s)."""
    port = capped.http_port
    held = _half_heads(port, 8)
    try:
        assert status_of(exchange(port, head("GET", "/health", Connection="close"))) == 200
        assert [_closed_by_busd(raw) for raw in held] == [True] + [False] * 7
        time.sleep(3)
        assert [_closed_by_busd(raw) for raw in held] == [True] * 8
    finally:
        for raw in held:
            raw.close()
    assert status_of(exchange(port, head("GET", "/health", Connection="close"))) == 200


def test_the_cap_holds_against_authenticated_requests_and_idle_ones_yield(capped):
    port = capped.http_port
    # eight connections inside authenticated requests: none is closed for a newcomer
    held = _authenticated_bodies(port, 8)
    assert status_of(exchange(port, head("GET", "/health", Connection="close"))) == 503
    for raw in held:
        raw.close()
    time.sleep(0.3)
    assert status_of(exchange(port, head("GET", "/health", Connection="close"))) == 200
    # eight kept-alive connections, each between requests: a new client takes an idle one's place
    idle = []
    for _ in range(8):
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        raw.sendall(head("GET", "/health"))
        assert status_of(raw.recv(65536)) == 200
        idle.append(raw)
    try:
        assert status_of(exchange(port, head("GET", "/health", Connection="close"))) == 200
        assert sum(_closed_by_busd(raw) for raw in idle) == 1
    finally:
        for raw in idle:
            raw.close()
