"""The pipelined connection to a single server (docs/design.md §3.4): the calls of an
event-loop turn go out in one write, their answers are matched in order, and with
--durability each batch is confirmed (docs/design.md §3.9) before any of it is answered.
busd.storage.redis.scripts writes its script calls as commands for it."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import hiredis
from redis.exceptions import ConnectionError as StoreConnectionError
from redis.exceptions import DataError, InvalidResponse, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as StoreTimeoutError

from busd.storage.api import StoreUnavailable

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

log = logging.getLogger("busd.storage")

# How long the server waits for the fsync or the replica before the batch is refused.
DURABILITY_WAIT_MS = 1000
# --durability (docs/design.md §3.9): the commands that must confirm a batch of calls before
# any of them is answered. WAITAOF 1 0: in the primary's append-only file, on disk. WAIT 1:
# and received by a replica (WAITAOF 1 1, a replica's disk too, took 0.3 to 1 s a batch,
# since replicas report their fsyncs lazily: in memory on a replica is what a failover needs).
_WAITAOF = (b"WAITAOF", b"1", b"0", b"%d" % DURABILITY_WAIT_MS)
_WAIT = (b"WAIT", b"1", b"%d" % DURABILITY_WAIT_MS)
# Sent before a call that an ASK answer sent to a slot's migration target (busd/storage/
# cluster.py); its own answer (OK) is dropped.
ASKING = "ASKING"
_ASKING = b"*1\r\n$6\r\nASKING\r\n"
DURABILITY: dict[str, tuple[tuple[bytes, ...], ...]] = {
    "local": (),  # nothing more than running it (the server's own fsync policy)
    "fsync": (_WAITAOF,),
    "replicated": (_WAITAOF, _WAIT),
}


class NotConnected(StoreConnectionError):
    """The connection could not be opened: the call was not sent."""


class PipelinedConnection:
    """One connection to the server whose calls are pipelined: each call's command is queued
    and the queue written once per event-loop turn; a reader matches the answers to the calls
    in order. A call whose caller stopped waiting (cancelled, timed out) keeps its place: its
    answer is read and dropped, so the calls behind it still get their own. When the
    connection breaks, every call without an answer fails (it may or may not have run, as
    with any lost connection) and the next call connects again; so does a READONLY answer
    (the server was a primary and is now a replica: the next connection finds the new one).

    With a `durability` (DURABILITY's commands), each batch written is followed by those
    waits, which cover every call of the batch (they wait for this connection's writes):
    the answers of the batch are held until the waits answered, then given, or, when the
    server could not confirm them in time, replaced by StoreUnavailable
    (com.microsoft:server-busy): never acknowledged as durable what was not."""

    def __init__(self, pool: Any, durability: tuple[tuple[bytes, ...], ...] = ()) -> None:
        self._pool = pool
        self._wait = b"".join(resp_command(*c) for c in durability) or None
        self._waits = len(durability)  # answers of waits a batch has
        self._waited = 0  # of which this many came for the batch being read
        self._batch_confirmed = True
        self._held: list[tuple[asyncio.Future[Any], Any]] = []  # answers awaiting the waits
        self._confirmed = True  # the last batch's verdict, to log changes only
        # The client's socket time-out (redis-py's default: 5 s) bounds a whole call.
        self._timeout: float | None = pool.make_connection().socket_timeout
        self._conn: AbstractConnection | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        # (answer, script, deadline) of the calls sent, in that order; a batch's WAITAOF has
        # no answer of its own (None)
        self._waiting: deque[tuple[asyncio.Future[Any] | None, str, float]] = deque()
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._watch_handle: asyncio.TimerHandle | None = None

    async def call(self, command: bytes, name: str, *, asking: bool = False) -> Any:
        """`command`'s answer; `asking`: sent right after an ASKING of its own."""
        if self._writer is None:
            try:
                await self._connect()
            except (StoreConnectionError, StoreTimeoutError, OSError) as exc:
                raise NotConnected(str(exc)) from exc
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        timeout = self._timeout
        deadline = loop.time() + timeout if timeout else 0.0
        if asking:
            self._waiting.append((None, ASKING, deadline))
            self._out.append(_ASKING)
        self._waiting.append((answer, name, deadline))
        if timeout and self._watch_handle is None:
            self._watch_handle = loop.call_later(timeout, self._watch)
        self._out.append(command)
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        return await answer

    def _watch(self) -> None:
        """Fail the calls unanswered for longer than the time-out (one timer for all calls, not
        one each: answers come in the order sent, so the deadlines do too)."""
        self._watch_handle = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for answer, name, deadline in self._waiting:
            if deadline > now:
                self._watch_handle = loop.call_at(deadline, self._watch)
                return
            if answer is not None and not answer.done():
                answer.set_exception(
                    StoreTimeoutError(f"{name}: no answer within {self._timeout} s")
                )

    def _flush(self) -> None:
        self._flush_handle = None
        out, self._out = self._out, []
        if self._writer is not None and out:
            if self._wait is not None:  # waits for the whole batch, never per call
                out.append(self._wait)
                deadline = self._waiting[-1][2]
                self._waiting.extend([(None, "WAIT", deadline)] * self._waits)
            self._writer.write(b"".join(out))

    async def _connect(self) -> None:
        if self._connecting is not None:  # another call is connecting: wait for it
            await asyncio.shield(self._connecting)
            return
        self._connecting = asyncio.get_running_loop().create_future()
        try:
            conn = self._pool.make_connection()
            conn.socket_timeout = None  # bounded per call instead
            await conn.connect()  # the client's handshake: TLS, AUTH, SELECT, CLIENT SETNAME
            self._conn = conn
            self._writer = conn._writer
            parser = conn._parser
            reader = hiredis.Reader(protocolError=InvalidResponse, replyError=parser.parse_error)
            # Named as busd's other long-lived tasks are: it lives as long as the connection.
            self._reading = asyncio.get_running_loop().create_task(
                self._read(conn._reader, reader), name="busd-store-reader"
            )
            self._connecting.set_result(None)
        except BaseException as exc:
            self._connecting.set_exception(exc)
            self._connecting.exception()  # retrieved: only the waiters raise it
            raise
        finally:
            self._connecting = None

    async def _read(self, stream: asyncio.StreamReader, reader: Any) -> None:
        waiting = self._waiting
        try:
            while True:
                data = await stream.read(65536)
                if not data:
                    raise StoreConnectionError("Connection closed by server.")
                reader.feed(data)
                while (reply := reader.gets()) is not False:
                    answer, name, _ = waiting.popleft()
                    if self._wait is not None:
                        if answer is None:
                            if name is not ASKING:
                                self._waited_for(reply)
                        else:
                            self._held.append((answer, reply))
                    elif answer is None or answer.done():  # its caller stopped waiting
                        continue
                    elif isinstance(reply, ResponseError):
                        answer.set_exception(reply)
                    else:
                        answer.set_result(reply)
                    if type(reply) is ReadOnlyError:
                        raise StoreConnectionError("the server is now a replica")
        except asyncio.CancelledError:  # close()
            self._broken(StoreConnectionError("The store client is closed."))
            raise
        except Exception as exc:
            conn = self._broken(
                exc if isinstance(exc, StoreConnectionError) else StoreConnectionError(str(exc))
            )
            if conn is not None:
                await conn.disconnect()

    def _waited_for(self, reply: Any) -> None:
        """A wait of the batch answered `reply` (WAITAOF: [fsynced locally, replicas]; WAIT:
        replicas): once all have, give the batch's held answers."""
        confirmed = (
            reply[0] >= 1 if isinstance(reply, list) else (isinstance(reply, int) and reply >= 1)
        )
        self._batch_confirmed = self._batch_confirmed and confirmed
        self._waited += 1
        if self._waited < self._waits:
            return
        confirmed, self._batch_confirmed, self._waited = self._batch_confirmed, True, 0
        held = self._held[:]
        self._held.clear()
        if confirmed != self._confirmed:  # changes only: not once per batch
            self._confirmed = confirmed
            if confirmed:
                log.warning("the store confirms writes as durable again")
            else:
                log.warning(
                    "the store did not confirm writes as durable (%s): they are "
                    "refused until it does",
                    reply,
                )
        refused = (
            None
            if confirmed
            else StoreUnavailable(
                f"the store did not confirm the writes as durable in {DURABILITY_WAIT_MS} ms"
            )
        )
        for answer, result in held:
            if answer.done():
                continue
            if refused is not None:
                answer.set_exception(refused)
            elif isinstance(result, ResponseError):
                answer.set_exception(result)
            else:
                answer.set_result(result)

    def _broken(self, exc: Exception) -> AbstractConnection | None:
        """Forget the connection (returned, to be closed) and fail the calls it owes."""
        conn, self._conn, self._writer, self._reading = self._conn, None, None, None
        waiting, self._waiting = self._waiting, deque()
        held = [answer for answer, _ in self._held]
        self._held.clear()
        self._waited, self._batch_confirmed = 0, True
        self._out = []
        if self._watch_handle is not None:
            self._watch_handle.cancel()
            self._watch_handle = None
        for answer in held + [answer for answer, _, _ in waiting]:
            if answer is not None and not answer.done():
                answer.set_exception(exc)
        return conn

    async def close(self) -> None:
        reading, conn = self._reading, self._conn
        if reading is not None:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        if conn is not None:
            await conn.disconnect()


def resp_command(*parts: bytes) -> bytes:
    """The RESP encoding of a command."""
    return b"*%d\r\n" % len(parts) + b"".join(map(bulk, parts))


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def encode(value: Any) -> bytes:
    """An argument as redis-py would send it: bytes as they are, text as UTF-8, numbers as
    their decimal text."""
    kind = type(value)
    if kind is bytes:
        return value
    if kind is str:
        return value.encode()
    if kind is int:
        return b"%d" % value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode()
    raise DataError(f"Invalid input of type: {type(value).__name__!r}")
