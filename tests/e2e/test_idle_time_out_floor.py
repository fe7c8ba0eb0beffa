"""An `open` asking for a tiny idle-time-out costs busd nothing (docs/wire.md §1.3): it is
kept at a floor of 1 s, so busd sends an empty frame every half second, not one per turn of
its event loop.

Written as the attack, on a raw socket against a real busd process: SASL ANONYMOUS, then an
`open` with idle-time-out 1 ms, then nothing but reading what busd sends."""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest

from tests.e2e.conftest import queue
from tests.e2e.hostile import AMQP_HEADER, SASL_HEADER, SASL_INIT

pytestmark = pytest.mark.timeout(120)

WATCH_S = 3.0
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # an AMQP frame with no body: a heartbeat


def open_with_idle_time_out(millis: int) -> bytes:
    """An AMQP open: container-id, hostname, max-frame-size and channel-max absent, then
    idle-time-out `millis`."""
    container, host = b"idle", b"localhost"
    items = (
        b"\xa1" + bytes([len(container)]) + container
        + b"\xa1" + bytes([len(host)]) + host
        + b"\x40\x40"  # max-frame-size, channel-max: null
        + b"\x70" + struct.pack(">I", millis)
    )  # fmt: skip
    body = b"\x00\x53\x10\xc0" + bytes([1 + len(items), 5]) + items
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_open_asking_for_a_1_ms_idle_time_out_is_kept_at_1_s(busd_factory):
    busd = busd_factory([queue("idle")])
    sock = socket.create_connection(("127.0.0.1", busd.port), timeout=5)
    try:
        sock.sendall(SASL_HEADER + SASL_INIT + AMQP_HEADER + open_with_idle_time_out(1))
        received = b""
        while b"\x00\x53\x10" not in received:  # busd's open: the handshake is done
            chunk = sock.recv(65536)
            assert chunk, "busd closed the connection"
            received += chunk
        sock.settimeout(0.2)
        cpu_before, started = cpu_seconds(busd.proc.pid), time.monotonic()
        heartbeats = b""
        while time.monotonic() - started < WATCH_S:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            assert chunk, "busd closed the connection"
            heartbeats += chunk
        watched = time.monotonic() - started
        cpu = cpu_seconds(busd.proc.pid) - cpu_before
    finally:
        sock.close()
    frames = heartbeats.count(EMPTY_FRAME)
    # two a second at the floor (a spinning timer sent thousands); at least one: the client's
    # wish is still honoured as far as the floor allows
    assert 1 <= frames <= 2 * watched + 2, (frames, watched)
    assert cpu < 0.2 * watched, f"busd used {cpu:.2f} CPU-s in {watched:.1f} s"
