"""Slow HTTP clients cost their own address, never another's `/health` (docs/management.md §1).

Written as the attack, on raw sockets against a real busd process: clients of one address
that each start a request busd must wait for (a `POST /health` announcing a 64 KiB body, a
dashboard login doing the same, a head never finished) and trickle it a byte at a time,
reconnecting whenever busd closes them. Before, 40 of them against a cap of 40 (or 256
against the default cap) held every HTTP slot for a minute, and `/health` answered 503 to
every address. Now a new connection takes the place of the oldest unauthenticated one of
the address holding the most, so `/health` from another address, and a real request from the
same address, are answered 200 throughout. Loopback clients all come from 127.0.0.1: the
flood binds its sockets to other loopback addresses to be another address.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest

from tests.e2e.conftest import queue
from tests.e2e.test_handshake_deadlines import metric

pytestmark = pytest.mark.timeout(180)

FLOODER = "127.0.0.2"
BYSTANDER = "127.0.0.3"
# what each flooding client sends before trickling: a route without a key, a body announced
REQUESTS = (
    b"POST /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 65536\r\n\r\n",
    b"POST /dashboard/login HTTP/1.1\r\nHost: localhost\r\nContent-Length: 65536\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ",  # a head never finished
)
PROBE = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
PROBE_WAIT_S = 10.0  # generous: a probe answered later than this is a failure


class Flood:
    """`count` clients of `source` trickling their requests (one byte each per pass), each
    reconnecting (on the next pass) once busd closes or answers it, until the `with` ends."""

    def __init__(self, port: int, source: str, count: int, pass_s: float = 0.5) -> None:
        self.port = port
        self.source = source
        self.count = count
        self.pass_s = pass_s
        self.reconnects = 0
        self.connected = threading.Event()  # all `count` opened once
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        assert self.connected.wait(30), "the flood could not open its connections"
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._thread.join(30)

    def _open(self, i: int) -> socket.socket | None:
        try:
            raw = socket.create_connection(
                ("127.0.0.1", self.port), timeout=2, source_address=(self.source, 0)
            )
            raw.sendall(REQUESTS[i % len(REQUESTS)])
            raw.setblocking(False)
            return raw
        except OSError:
            return None

    def _run(self) -> None:
        socks = [self._open(i) for i in range(self.count)]
        self.connected.set()
        try:
            while not self._stopping.wait(self.pass_s):
                for i, raw in enumerate(socks):
                    if raw is not None and _still_held(raw):
                        continue
                    if raw is not None:
                        raw.close()
                        self.reconnects += 1
                    socks[i] = self._open(i)
        finally:
            for raw in socks:
                if raw is not None:
                    raw.close()


def _still_held(raw: socket.socket) -> bool:
    """Send one more byte; False once busd has answered or closed the connection."""
    raw.setblocking(False)  # (a socket's timeout would wait for an answer)
    try:
        raw.recv(65536)
        return False  # an answer (413, 408, 503) or the end: busd is done with it
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        raw.send(b"a")
        return True
    except OSError:
        return False


def probe(port: int, source: str) -> tuple[int, float]:
    """GET /health from `source`: (status, seconds to the answer)."""
    started = time.monotonic()
    with socket.create_connection(
        ("127.0.0.1", port), timeout=PROBE_WAIT_S, source_address=(source, 0)
    ) as raw:
        raw.sendall(PROBE)
        answer = b""
        while b"\r\n" not in answer and (chunk := raw.recv(65536)):
            answer += chunk
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12]), took


def probe_during(port: int, seconds: float) -> list[tuple[str, int, float]]:
    """Probe /health from another address and from the flooder's own, every 0.2 s."""
    results = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for source in (BYSTANDER, FLOODER):
            results.append((source, *probe(port, source)))
        time.sleep(0.2)
    return results


def report(results: list[tuple[str, int, float]], flood: Flood) -> str:
    """The probes' latencies per source, for the log (-s)."""
    lines = []
    for source in (BYSTANDER, FLOODER):
        took = [t * 1000 for s, _, t in results if s == source]
        lines.append(
            f"{source}: {len(took)} probes, median {statistics.median(took):.0f} ms, "
            f"max {max(took):.0f} ms"
        )
    return "; ".join(lines) + f"; the flood reconnected {flood.reconnects} times"


@pytest.fixture(scope="module")
def capped(busd_factory):
    return busd_factory([queue("q")], extra_env={"BUSD_MAX_HTTP_CONNECTIONS": "40"})


@pytest.fixture(scope="module")
def default(busd_factory):
    return busd_factory([queue("q")])


def test_forty_slow_requests_of_one_address_do_not_take_health_from_another(capped):
    with Flood(capped.http_port, FLOODER, 40) as flood:
        time.sleep(1)  # every slot taken, each request trickling
        results = probe_during(capped.http_port, 6)
    print(report(results, flood))
    assert [(s, code) for s, code, _ in results if code != 200] == []
    assert flood.reconnects > 0  # busd closed slow requests rather than keeping new ones out
    assert metric(capped, "busd_http_evicted_total", '{limit="process"}') > 0


def test_256_slow_requests_against_the_default_caps(default):
    with Flood(default.http_port, FLOODER, 256) as flood:
        time.sleep(1)
        results = probe_during(default.http_port, 6)
    print(report(results, flood))
    assert [(s, code) for s, code, _ in results if code != 200] == []


@pytest.fixture(scope="module")
def per_address(busd_factory):
    return busd_factory([queue("q")], extra_env={"BUSD_MAX_HTTP_CONNECTIONS_PER_ADDRESS": "10"})


def test_one_address_holds_no_more_than_its_cap(per_address):
    """30 unfinished heads from one address: only the newest 10 stay open."""
    port = per_address.http_port
    held = []
    try:
        for _ in range(30):
            raw = socket.create_connection(
                ("127.0.0.1", port), timeout=5, source_address=(FLOODER, 0)
            )
            raw.sendall(REQUESTS[2])
            held.append(raw)
            time.sleep(0.02)  # each handed to HTTP before the next
        time.sleep(0.5)
        open_now = [_still_held(raw) for raw in held]
        assert open_now == [False] * 20 + [True] * 10, open_now
        assert probe(port, BYSTANDER)[0] == 200
        assert metric(per_address, "busd_http_evicted_total", '{limit="address"}') == 20
    finally:
        for raw in held:
            raw.close()


def test_a_route_that_takes_no_body_refuses_one_from_the_head(default):
    """`POST /health` announcing 64 KiB is answered 413 at once, nothing of its body sent."""
    with socket.create_connection(("127.0.0.1", default.http_port), timeout=5) as raw:
        raw.sendall(REQUESTS[0])
        answer = raw.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"takes no request body" in answer


def test_a_trickled_body_without_a_key_is_cut_at_the_request_timeout(busd_factory):
    """A dashboard login (no key) trickling its body: 408 within the one request timeout,
    head and body together, not the minute an authenticated body has."""
    busd = busd_factory([queue("q")], extra_env={"BUSD_HTTP_REQUEST_TIMEOUT": "1"})
    with socket.create_connection(("127.0.0.1", busd.http_port), timeout=20) as raw:
        raw.sendall(REQUESTS[1])
        raw.setblocking(False)
        answer = b""
        give_up = time.monotonic() + 15
        while not answer and time.monotonic() < give_up:
            time.sleep(0.2)
            try:
                answer = raw.recv(65536)
                break
            except BlockingIOError:
                raw.send(b"a")
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
