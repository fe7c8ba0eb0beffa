"""A listening socket whose connections are sniffed before anything reads them, and the
admission of connections that have not authenticated yet.

Every busd port serves more than one protocol: the AMQP, TLS and HTTP ports (busd.net.ports: AMQP
and HTTP, plain and over TLS) and the WebSocket port (busd.amqp.websocket: ws and wss). Each
tells TLS from the rest by a connection's first byte, left in the socket for whoever reads it
next (0x16 starts a TLS ClientHello). This class owns what they share: the socket, the accept
loop, the connection tasks and closing them; a subclass says what to do with a connection
given its first byte.

A connection is unauthenticated from its accept until its first valid put-token (an HTTP
connection: until its first byte says it is HTTP, whose requests carry their own keys). Such
connections are capped per process and per peer address, apart from the authenticated ones
(docs/design.md §3.12), so hostile half-open connections never take the place of clients that
authenticate. At a cap the new connection takes the place of the oldest unauthenticated one (of
its own address at the address cap; of the address holding the most at the process cap):
whoever opens half-open connections in a loop evicts its own, and a client of the same
address, which authenticates within milliseconds, still gets in. Each one must reach
its AMQP `open` within the handshake deadline, counted from its accept across every stage
(first byte, TLS handshake, WebSocket upgrade, SASL and AMQP headers); past it the socket is
closed, since proton writes no AMQP close before the header exchange is done.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from busd.net.host_certificates import prepare as prepare_tls

TLS_RECORD = 0x16  # the first byte of a TLS ClientHello
# A TLS handshake's limit when the handshake deadline is off (--handshake-timeout 0).
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# How much earlier than a deadline asyncio's own timer for it may fire.
TIMER_SLACK_S = 0.05
# A socket being closed whose peer does not read what is left to write (a close frame) is cut
# off after this long, so that a closing connection cannot be held open either.
CLOSE_GRACE_S = 2.0
# Evictions at a cap are logged at most this often (each is counted on /metrics).
EVICTION_LOG_INTERVAL_S = 10.0

log = logging.getLogger("busd.amqp")


class Admission:
    """This process's unauthenticated connections: how many (per process, per peer address),
    and the deadline of each (`Pending`)."""

    def __init__(
        self,
        handshake_timeout_s: float = 10.0,
        max_pending: int = 1000,
        max_per_address: int = 100,
        metrics: Any = None,  # busd.observability.metrics.Metrics, or None
    ) -> None:
        self.handshake_timeout_s = handshake_timeout_s  # 0: no deadline
        self.max_pending = max_pending  # 0: no cap
        self.max_per_address = max_per_address  # 0: no cap
        self.metrics = metrics
        # the connections of each address, oldest first: whom a cap evicts
        self.by_address: dict[str, dict[Pending, None]] = {}
        self.pending = 0
        self._logged_at = -EVICTION_LOG_INTERVAL_S

    def admit(self, address: str) -> Pending:
        """A connection just accepted from `address`: its admission. At a cap, the oldest
        unauthenticated connection of its address (the address cap) or of the address holding
        the most (the process cap) is closed to make room."""
        mine = self.by_address.get(address)
        if self.max_per_address and mine is not None and len(mine) >= self.max_per_address:
            self._evict(mine, "address", address)
        elif self.max_pending and self.pending >= self.max_pending:
            crowded = max(self.by_address.values(), key=len)
            self._evict(crowded, "process", address)
        self.pending += 1
        pending = Pending(self, address)
        self.by_address.setdefault(address, {})[pending] = None
        if self.metrics is not None:
            self.metrics.unauthenticated.inc()
        return pending

    def _evict(self, connections: dict[Pending, None], limit: str, address: str) -> None:
        oldest = next(iter(connections))
        if self.metrics is not None:
            self.metrics.unauthenticated_evicted(limit)
        now = time.monotonic()
        if now - self._logged_at >= EVICTION_LOG_INTERVAL_S:
            self._logged_at = now
            log.warning(
                "closing the oldest unauthenticated connections: %d open (%d from %s, the "
                "newest from %s); the caps are %d per process, %d per address",
                self.pending,
                len(connections),
                oldest.address,
                address,
                self.max_pending,
                self.max_per_address,
            )
        oldest.evict()

    def _release(self, pending: Pending) -> None:
        self.pending -= 1
        mine = self.by_address[pending.address]
        del mine[pending]
        if not mine:
            del self.by_address[pending.address]
        if self.metrics is not None:
            self.metrics.unauthenticated.dec()


class Pending:
    """One connection until it authenticates: counted by its `Admission`, and closed at its
    handshake deadline unless its AMQP `open` came (`opened`) or it left the count first
    (`release`: authenticated, handed to HTTP, or closed)."""

    def __init__(self, admission: Admission, address: str) -> None:
        self._admission = admission
        self.address = address
        timeout = admission.handshake_timeout_s
        self.deadline = time.monotonic() + timeout if timeout else None
        self.expired = False
        self._released = False
        self._transport: asyncio.BaseTransport | None = None
        self._task: asyncio.Task | None = None  # the listener's, until the transport is made
        self._timer: asyncio.TimerHandle | None = None
        if timeout:
            self._timer = asyncio.get_running_loop().call_later(timeout, self._expire)

    def remaining(self) -> float | None:
        """Seconds left before the handshake deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def attach(self, transport: asyncio.BaseTransport) -> None:
        """The connection's transport (the socket's, inside TLS or not): what the deadline
        closes. Before it, the listener's own waits end at the deadline."""
        self._transport = transport
        if self.expired:
            _cut_off(transport)

    def watch(self, task: asyncio.Task) -> None:
        """The listener's task reading the connection's first byte and doing its TLS
        handshake: what an eviction cancels before the transport is made."""
        if not self._released:
            self._task = task

    def opened(self) -> None:
        """The AMQP `open` came: the handshake is done (the put-token has its own time-out,
        busd.broker.links.connection)."""
        self._stop_timer()

    def release(self) -> None:
        """No longer an unauthenticated connection: authenticated, HTTP, or gone."""
        self._stop_timer()
        self._transport = None
        self._task = None
        if not self._released:
            self._released = True
            self._admission._release(self)

    def evict(self) -> None:
        """Close the connection to make room for a newer one (a cap of its `Admission`): its
        count is freed now, its socket dropped at once, as at its deadline."""
        transport, task = self._transport, self._task
        self.release()
        if transport is not None:
            _cut_off(transport)
        elif task is not None:
            task.cancel()  # still in the listener's hands: first byte or TLS handshake

    def timed_out(self) -> None:
        """The listener dropped the connection at the deadline (no first byte, TLS
        handshake unfinished): counted once, whichever of it and the timer came first."""
        if not self.expired:
            self.expired = True
            self._count_timeout()
        self.release()

    def _expire(self) -> None:
        self._timer = None
        self.expired = True
        self._count_timeout()
        if self._transport is not None:
            _cut_off(self._transport)

    def _count_timeout(self) -> None:
        admission = self._admission
        log.info(
            "connection from %s closed: no AMQP open within %g s",
            self.address,
            admission.handshake_timeout_s,
        )
        if admission.metrics is not None:
            admission.metrics.handshake_timed_out("handshake")

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _cut_off(transport: asyncio.BaseTransport) -> None:
    """Drop a connection at its deadline at once: it has said nothing worth an answer, and a
    graceful close could wait on the peer (a TLS close_notify, unread bytes)."""
    transport.abort()  # type: ignore[attr-defined]


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking listening socket on host:port (0: any free port); `reuse_port`: one of
    several sockets of the workers of one host on that port, the kernel spreading the
    connections over them (busd/server/workers.py)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128, reuse_port=reuse_port)
    sock.setblocking(False)
    return sock


class SniffingListener(abc.ABC):
    """One listening socket; `close()` stops accepting and ends every open connection."""

    def __init__(
        self,
        sock: socket.socket,
        log: logging.Logger,
        name: str,
        admission: Admission | None = None,
    ) -> None:
        self.sock = sock
        self._log = log
        self._name = name  # in log lines and the accept task's name
        # None: no caps and no deadline (a listener made outside a server)
        self.admission = admission or Admission(0, 0, 0)
        self._connections: set[asyncio.Task] = set()
        self._accepting = asyncio.create_task(self._accept(), name=f"busd-{name}-accept")

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    async def close(self) -> None:
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self.sock.close()
        self._closing()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def _closing(self) -> None:  # noqa: B027 - a hook; most listeners need nothing here
        """Called once the socket is closed, before the connection tasks are cancelled."""

    @abc.abstractmethod
    async def serve(self, conn: socket.socket, first: int, pending: Pending) -> None:
        """Serve one accepted connection whose first byte (still unread) is `first`; its
        `pending` is released once it authenticates or goes (`Pending.attach` its transport)."""

    async def hand_over(
        self,
        conn: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        tls: ssl.SSLContext | None,
        pending: Pending,
    ) -> None:
        """Hand an accepted socket to asyncio with the protocol `factory` makes, after a TLS
        handshake given `tls`, which must end by the connection's handshake deadline."""
        left = pending.remaining()
        if tls is None:
            handshake_timeout = None
        elif left is None:
            handshake_timeout = TLS_HANDSHAKE_TIMEOUT_S
        else:
            handshake_timeout = max(left, 0.001)
        try:
            if tls is not None:  # a new namespace host's certificate, made off the loop
                await prepare_tls(conn, tls)
                left = pending.remaining()
                if left is not None:
                    handshake_timeout = max(left, 0.001)
            await asyncio.get_running_loop().connect_accepted_socket(
                factory, conn, ssl=tls, ssl_handshake_timeout=handshake_timeout
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            self._log.debug("%s connection dropped before its handshake: %s", self._name, exc)
            conn.close()
            left = pending.remaining()
            if pending.expired or (left is not None and left < TIMER_SLACK_S):
                pending.timed_out()  # (the TLS handshake's own timer, set to end with ours)
            else:
                pending.release()
        except BaseException:  # cancelled: the listener is closing
            conn.close()
            pending.release()
            raise

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as exc:  # e.g. too many open files: keep the listener alive
                self._log.warning("%s accept failed: %s", self._name, exc)
                await asyncio.sleep(0.1)
                continue
            pending = self.admission.admit(peer[0] if isinstance(peer, tuple) else str(peer))
            conn.setblocking(False)
            task = asyncio.create_task(self._connection(conn, pending))
            pending.watch(task)
            task.add_done_callback(functools.partial(_close_if_cancelled, conn))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _connection(self, conn: socket.socket, pending: Pending) -> None:
        try:
            first = await _peek(asyncio.get_running_loop(), conn, pending.remaining())
        except TimeoutError:
            conn.close()
            pending.timed_out()
            return
        except OSError:
            conn.close()
            pending.release()
            return
        except BaseException:  # cancelled (the listener closing)
            conn.close()
            pending.release()
            raise
        if not first:
            conn.close()
            pending.release()
            return
        await self.serve(conn, first[0], pending)


def _close_if_cancelled(conn: socket.socket, task: asyncio.Task) -> None:
    """A connection's task cancelled (evicted) before it ran never reaches its own close."""
    if task.cancelled():
        conn.close()


async def _peek(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, timeout: float | None
) -> bytes:
    """The connection's first byte, left in the socket for whoever reads it next; TimeoutError
    after `timeout` seconds (None: none)."""
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), readable)
    try:
        await asyncio.wait_for(ready, timeout)
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)
