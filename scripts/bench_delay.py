"""A TCP proxy that delays every byte by a fixed time each way: scripts/bench --store-rtt puts
it between busd and its store, so each round trip to the store takes that much longer, as a
store across a network does (this kernel has no netem to do it below the sockets).

  python3 scripts/bench_delay.py --to 127.0.0.1:6379 --delay-ms 0.5
  -> prints "listening on 127.0.0.1:PORT", then forwards each connection made to PORT;
     a line "carried" on its stdin is answered with what it forwarded so far (JSON)

Delay, not bandwidth: each chunk read is written to the other side `delay` after it arrived,
whatever is still in flight before it, so pipelined calls stream through at full speed, each
one late by the delay, in the order each connection sent them.

It uses a thread per direction of each connection rather than asyncio: asyncio's epoll waits
in whole milliseconds (rounded up), which would turn a 0.5 ms delay into about 1 ms, while a
thread's timed wait on a lock wakes within tens of microseconds. busd keeps a handful of
store connections, so the threads are few. It runs until stdin closes or SIGTERM (the bench
that started it stops it by PID).
"""

from __future__ import annotations

import argparse
import collections
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

CHUNK = 256 * 1024
CARRIED = {"connections": 0, "bytes": 0}  # what the proxy forwarded so far (both ways)


class Direction:
    """One way of one connection: a reader queues (due time, bytes), a writer sends each
    chunk once its time comes, joining every chunk already due into one write."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay_s: float) -> None:
        self.src, self.dst, self.delay_s = src, dst, delay_s
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.cond = threading.Condition()
        self.eof = False

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(CHUNK)
                if not data:
                    break
                with self.cond:
                    self.queue.append((time.monotonic() + self.delay_s, data))
                    self.cond.notify()
                CARRIED["bytes"] += len(data)  # one reader at a time holds the GIL
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.eof:
                        self.cond.wait()
                    if not self.queue:  # eof and all sent
                        break
                    wait = self.queue[0][0] - time.monotonic()
                    if wait > 0:
                        self.cond.wait(wait)  # a new chunk notifies too: look again
                        continue
                    now = time.monotonic()
                    parts = []
                    while self.queue and self.queue[0][0] <= now:
                        parts.append(self.queue.popleft()[1])
                self.dst.sendall(b"".join(parts))
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            # Either side gone: end both ways of the connection.
            for sock in (self.src, self.dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def serve(listener: socket.socket, to: tuple[str, int], delay_s: float) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(to)
        except OSError as exc:
            print(f"bench_delay: cannot reach {to[0]}:{to[1]}: {exc}", file=sys.stderr)
            client.close()
            continue
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        CARRIED["connections"] += 1
        Direction(client, upstream, delay_s).start()
        Direction(upstream, client, delay_s).start()


# --- the bench's side ---------------------------------------------------------------------------
class DelayedStore:
    """What --store-rtt puts under busd: the store (a Valkey started here with the embedded
    store's configuration, or --redis-url's server) behind a proxy process adding half of
    `rtt_ms` each way. busd is given `url` (the proxy's), the bench's probe `store_url` (the
    server itself: INFO is not slowed)."""

    def __init__(self, rtt_ms: float, directory: Path, redis_url: str | None) -> None:
        self.rtt_ms = rtt_ms
        self.directory = directory
        self.redis_url = redis_url
        self.valkey = None
        self.proc: subprocess.Popen | None = None
        self.store_url = ""
        self.url = ""

    def start(self) -> None:
        if self.redis_url:
            self.store_url = self.redis_url
        else:
            from busd.storage.redis.embedded import EmbeddedValkey

            self.valkey = EmbeddedValkey(self.directory / "store")
            self.valkey.start()
            self.store_url = self.valkey.url
        parts = urlsplit(self.store_url)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--to",
                f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}",
                "--delay-ms",
                str(self.rtt_ms / 2),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("listening on "):
            self.stop()
            raise SystemExit(f"bench: the delaying proxy did not start: {line!r}")
        where = line.split()[-1]
        netloc = (parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else "") + where
        self.url = parts._replace(netloc=netloc).geturl()

    def measured_rtt_ms(self, pings: int = 50) -> tuple[float, float]:
        """Median PING round trip (ms) through the proxy and straight to the server."""
        import redis

        def median(url: str) -> float:
            with redis.Redis.from_url(url, socket_timeout=5) as client:
                client.ping()  # connected before the clock runs
                times = []
                for _ in range(pings):
                    t0 = time.perf_counter()
                    client.ping()
                    times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1000

        return median(self.url), median(self.store_url)

    def carried(self) -> dict[str, int]:
        """What the proxy forwarded so far: {"connections": n, "bytes": n} (both ways)."""
        if self.proc is None or self.proc.stdin is None or self.proc.stdout is None:
            return {}
        self.proc.stdin.write("carried\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline() or "{}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # it ends when its stdin does
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--to", required=True, metavar="HOST:PORT", help="where to forward")
    p.add_argument("--delay-ms", type=float, required=True, help="added each way (ms)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    args = p.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    # A thread woken from its timed wait needs the GIL: hand it over sooner than every 5 ms.
    sys.setswitchinterval(0.0002)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    threading.Thread(
        target=serve, args=(listener, (host, int(port)), args.delay_ms / 1000), daemon=True
    ).start()
    print(f"listening on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    try:
        for line in sys.stdin:  # until the bench closes our stdin (or is gone)
            if line.strip() == "carried":
                print(json.dumps(CARRIED), flush=True)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
