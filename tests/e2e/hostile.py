"""Hostile clients that stop part-way through a handshake, on raw sockets.

Each `KIND` names where it stops: inside or right after the AMQP/SASL headers on the AMQP
port, the same inside TLS on the TLS port, and inside or after the WebSocket upgrade on the
WebSocket port. `open_partial` opens one such connection and leaves it hanging; `still_open`
tells whether busd has closed it yet (reading and dropping whatever busd wrote meanwhile).
Used by tests/e2e/test_handshake_deadlines.py, and run as a module to measure a running busd
(`python -m tests.e2e.hostile --help`).
"""

from __future__ import annotations

import base64
import os
import select
import socket
import ssl
import struct
from dataclasses import dataclass

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
# sasl-init (descriptor 0x41) choosing ANONYMOUS: a SASL frame (type 1) on channel 0
_INIT_BODY = b"\x00\x53\x41\xc0\x0c\x01\xa3\x09ANONYMOUS"
SASL_INIT = struct.pack(">IBBH", 8 + len(_INIT_BODY), 2, 1, 0) + _INIT_BODY


def _str(value: bytes) -> bytes:
    """An AMQP string of the bytes given, whatever they are (UTF-8 or not)."""
    return b"\xb1" + struct.pack(">I", len(value)) + value


def open_frame(container: bytes, hostname: bytes | None = None) -> bytes:
    """An AMQP open frame whose container-id and hostname are the bytes given, as is."""
    fields = [container] + ([hostname] if hostname is not None else [])
    items = b"".join(_str(f) for f in fields)
    body = b"\x00\x53\x10\xd0" + struct.pack(">II", 4 + len(items), len(fields)) + items
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


# What each kind writes after its transport is up (TLS done, WebSocket upgraded).
STOPS = {
    "A": b"A",
    "AMQ": b"AMQ",
    "sasl-header": SASL_HEADER,
    "sasl-init": SASL_HEADER + SASL_INIT,
    "amqp-header": SASL_HEADER + SASL_INIT + AMQP_HEADER,  # SASL done, then no open
    "bare-amqp-header": AMQP_HEADER,  # no SASL, no open
    # the whole handshake, then no put-token: closed at the auth time-out, not the handshake's
    "open": SASL_HEADER + SASL_INIT + AMQP_HEADER + open_frame(b"hostile", b"localhost"),
    "silent": b"",
}


@dataclass(frozen=True)
class Ports:
    amqp: int
    tls: int | None = None
    ws: int | None = None


# kind -> (port, how it stops); ws-upgrade stops inside the upgrade request, tls-hello inside
# the ClientHello, the others after their transport is up.
KINDS = (
    [f"amqp:{stop}" for stop in STOPS if stop != "silent"]
    + ["tls:hello"]
    + [f"tls:{stop}" for stop in STOPS]
    + ["ws:upgrade"]
    + [f"ws:{stop}" for stop in STOPS]
)


def _connect(port: int, source: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source is not None:  # another loopback address (127.0.0.0/8 all reaches 127.0.0.1)
        sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def _tls(sock: socket.socket) -> ssl.SSLSocket:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(sock, server_hostname="localhost")


def ws_frame(payload: bytes) -> bytes:
    """One masked binary WebSocket message, as a client sends it."""
    mask = os.urandom(4)
    size = len(payload)
    head = b"\x82" + (bytes([0x80 | size]) if size < 126 else b"\xfe" + struct.pack(">H", size))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_upgrade(complete: bool = True) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /$servicebus/websocket HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: AMQPWSB10\r\n"
    )
    return (request + "\r\n").encode() if complete else request.encode()


def _read_response_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the upgrade")
        data += chunk
    if not data.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(f"upgrade refused: {data[:40]!r}")
    return data


def open_partial(kind: str, ports: Ports, source: str | None = None) -> socket.socket:
    """A connection of `kind` (one of KINDS), left hanging where that kind stops."""
    where, stop = kind.split(":", 1)
    if where == "amqp":
        sock = _connect(ports.amqp, source)
        sock.sendall(STOPS[stop])
        return sock
    if where == "tls":
        assert ports.tls is not None
        sock = _connect(ports.tls, source)
        if stop == "hello":
            sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes, no more
            return sock
        tls = _tls(sock)
        if STOPS[stop]:
            tls.sendall(STOPS[stop])
        return tls
    assert where == "ws" and ports.ws is not None
    sock = _connect(ports.ws, source)
    if stop == "upgrade":
        sock.sendall(ws_upgrade(complete=False))
        return sock
    sock.sendall(ws_upgrade())
    _read_response_head(sock)
    if STOPS[stop]:
        sock.sendall(ws_frame(STOPS[stop]))
    return sock


def still_open(sock: socket.socket) -> bool:
    """Whether busd has not closed `sock` yet; what busd wrote is read and dropped."""
    try:
        sock.setblocking(False)
        while True:
            if isinstance(sock, ssl.SSLSocket):
                try:
                    data = sock.recv(65536)
                except ssl.SSLWantReadError:
                    return True
            else:
                if not select.select([sock], [], [], 0)[0]:
                    return True
                data = sock.recv(65536)
            if not data:
                return False
    except BlockingIOError:
        return True
    except (OSError, ssl.SSLError):  # reset, or TLS torn down
        return False


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        try:
            sock.close()
        except OSError:
            pass


def main() -> None:
    """`python -m tests.e2e.hostile --amqp P --tls P --ws P`: open `--count` connections of
    each kind against a running busd, wait `--wait` seconds, print how many are still open.
    (Raise busd's caps on unauthenticated connections first, or most are refused at once.)"""
    import argparse
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--amqp", type=int, required=True)
    parser.add_argument("--tls", type=int)
    parser.add_argument("--ws", type=int)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--wait", type=float, default=15.0)
    args = parser.parse_args()
    ports = Ports(args.amqp, args.tls, args.ws)
    kinds = [k for k in KINDS if getattr(ports, k.split(":")[0]) is not None]
    started = time.monotonic()
    opened = {kind: [open_partial(kind, ports) for _ in range(args.count)] for kind in kinds}
    time.sleep(max(0.0, args.wait - (time.monotonic() - started)))
    total = 0
    for kind, socks in opened.items():
        left = sum(still_open(s) for s in socks)
        total += left
        print(f"{kind:22} {left}/{len(socks)} still open after {args.wait:g} s")
        close_all(socks)
    print(f"total {total}/{sum(len(s) for s in opened.values())} still open")


if __name__ == "__main__":
    main()
