"""One TCP connection: an asyncio protocol driving a proton engine (no reactor, no threads).

Bytes in go to `Transport.push`, bytes out come from `Transport.peek/pop`, timers from
`Transport.tick`. After every change to the engine (input, or a broker task that sent a
message or settled a delivery) `kick()` dispatches the collector's events to the connection
handler; what the engine produced is written once per event-loop turn, however many kicks
the turn had. The handler (busd.broker.links.connection) owns the AMQP semantics; this module owns
only I/O, and the connection's admission until it authenticates (busd.net.listener.Pending).

Every close ends with the socket closed: proton writes an AMQP close only once the header
exchange is done, and a peer that does not read what is left is cut off after
CLOSE_GRACE_S, so no connection stays open because its client stopped part-way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any
from typing import Protocol as TypingProtocol

from proton import Collector, Connection, Event, Transport
from proton._events import EventType
from proton._exceptions import TransportException

from busd.amqp import engine
from busd.amqp.frames import DeliveryIds
from busd.net.listener import CLOSE_GRACE_S, Pending

log = logging.getLogger("busd.amqp")
frame_log = logging.getLogger("busd.amqp.frames")
TRACE = 5  # below DEBUG: every frame
logging.addLevelName(TRACE, "TRACE")

# Our frames: large enough that most messages fit in one, small enough to keep memory flat.
MAX_FRAME_SIZE = 256 * 1024
# The shortest idle-time-out a client's `open` gets: one asking for less (1 ms) is served as
# if it had asked for this, with empty frames every half of it, instead of one per turn of the
# event loop. No SDK asks for less than 1 s (docs/wire.md §1.3).
IDLE_TIME_OUT_FLOOR_S = 1.0
# so proton's timers are run at most this often
MIN_TICK_S = IDLE_TIME_OUT_FLOOR_S / 2
# the events handled raw (_dispatch_events), whatever the handler's methods
RAW_EVENTS = frozenset(
    {
        engine.PN_DELIVERY,
        engine.PN_LINK_FLOW,
        engine.PN_LINK_REMOTE_OPEN,
        engine.PN_LINK_REMOTE_CLOSE,
        engine.PN_LINK_REMOTE_DETACH,
        engine.PN_SESSION_REMOTE_OPEN,
        engine.PN_SESSION_REMOTE_CLOSE,
    }
)


class RawDeliveryTaker(TypingProtocol):
    def on_raw_delivery(self, delivery: Any) -> None: ...


class EventHandler(TypingProtocol):
    # raw pn_link_t pointer -> endpoint taking that link's deliveries raw (engine.py); the
    # handler owns it, the protocol only reads it
    raw_links: Mapping[Any, RawDeliveryTaker]

    def dispatch(self, event) -> None: ...

    def flow(self, endpoint: Any) -> None:
        """A flow frame for the link of `endpoint`, one of `raw_links`."""

    # A link's and an AMQP session's life, as raw pointers (engine.py): no event object.
    def link_opened(self, link: Any) -> None:
        """The client attached `link` (a raw pn_link_t)."""

    def link_flow(self, link: Any) -> None:
        """A flow frame for `link`, not one of `raw_links`."""

    def link_gone(self, link: Any) -> None:
        """The client detached `link` (closed or not)."""

    def session_opened(self, session: Any) -> None:
        """The client began an AMQP session (a raw pn_session_t)."""

    def session_gone(self, session: Any) -> None:
        """The client ended an AMQP session."""

    def closed(self) -> None: ...


def handled_events(handler: Any) -> frozenset[int]:
    """The proton event types `handler` has a method for: only those are wrapped in proton's
    Python objects and dispatched (wrapping one costs more than the rest of a flow's work, and
    most events of a link's life - local open and close, final, transport - have no method)."""
    return frozenset(
        number
        for number, kind in EventType.TYPES.items()
        if callable(getattr(handler, kind.method, None))
    )


class _Closed:
    """The handler of a connection whose socket is gone: events left in the engine are
    dropped."""

    raw_links: Mapping[Any, RawDeliveryTaker] = {}

    def dispatch(self, event) -> None:
        pass

    def flow(self, endpoint: Any) -> None:
        pass

    def link_opened(self, link: Any) -> None:
        pass

    def link_flow(self, link: Any) -> None:
        pass

    def link_gone(self, link: Any) -> None:
        pass

    def session_opened(self, session: Any) -> None:
        pass

    def session_gone(self, session: Any) -> None:
        pass

    def closed(self) -> None:
        pass


_CLOSED = _Closed()


class AmqpProtocol(asyncio.Protocol):
    """Connection scope: the socket, the proton engine, and the connection's handler."""

    def __init__(
        self, make_handler, on_closed=None, on_opened=None, pending: Pending | None = None
    ) -> None:
        self._make_handler = make_handler
        # counted as unauthenticated, with a handshake deadline, until `authenticated()`
        self._pending = pending
        self._on_closed = on_closed
        # Called from connection_made: over TLS that is after the handshake, and a handshake
        # that fails calls neither it nor connection_lost, so whoever tracks open connections
        # must start here, not when the protocol object is made.
        self._on_opened = on_opened
        self.peer = "?"
        self._sock: asyncio.Transport | None = None
        self._dispatching = False
        self._again = False
        self._deadline = 0.0
        self.raw_links: Mapping[Any, RawDeliveryTaker] = {}
        self._handled: frozenset[int] = frozenset()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._abort_handle: asyncio.TimerHandle | None = None
        self._closed = False

    # --- asyncio side -----------------------------------------------------------------------
    def connection_made(self, sock: asyncio.BaseTransport) -> None:
        self._sock = sock  # type: ignore[assignment]
        peer = sock.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.engine = Transport(Transport.SERVER)
        self.engine.max_frame_size = MAX_FRAME_SIZE
        if frame_log.isEnabledFor(TRACE):
            self.engine.trace(Transport.TRACE_FRM)
            peer = self.peer  # not self: proton keeps the tracer on its C side
            self.engine.tracer = lambda _t, msg: frame_log.log(TRACE, "[%s] %s", peer, msg)
        self.delivery_ids = DeliveryIds()  # out-of-order delivery-ids (busd/amqp/frames.py)
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.engine.bind(self.connection)
        # Service Bus clients always use SASL ANONYMOUS; proton's built-in server SASL
        # answers it with outcome ok. Authentication is a CBS put-token afterwards.
        self.engine.sasl().allowed_mechs("ANONYMOUS")
        self.handler: EventHandler = self._make_handler(self)
        self.raw_links = self.handler.raw_links
        self._handled = handled_events(self.handler)
        if self._on_opened is not None:
            self._on_opened(self)
        self.kick()

    def data_received(self, data: bytes) -> None:
        view = memoryview(self.delivery_ids.incoming(data))
        try:
            while view:
                capacity = self.engine.capacity()
                if capacity < 0:
                    # Input closed: proton refused a frame (sometimes without saying why) or
                    # the peer closed. Closing the tail makes proton finish the connection
                    # (close frame with the error), instead of leaving it half-open.
                    self.engine.close_tail()
                    break
                if capacity == 0:
                    self.kick()  # let the handler consume what is buffered, then retry
                    if self.engine.capacity() == 0:
                        log.warning("connection %s: input stalled; closing", self.peer)
                        self.engine.close_tail()
                        break
                    continue
                chunk = view[:capacity]
                self.engine.push(bytes(chunk))
                view = view[len(chunk) :]
            if self.engine.capacity() < 0:
                self.engine.close_tail()  # see above: finish rather than hang half-open
        except TransportException as exc:
            log.info("connection %s: protocol error: %s", self.peer, exc)
        self.kick()

    def eof_received(self) -> bool:
        try:
            self.engine.close_tail()
        except TransportException:
            pass
        self.kick()
        self._flush()  # now: asyncio closes the socket next
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._pending is not None:
            self._pending.release()
            self._pending = None
        if self._abort_handle is not None:
            self._abort_handle.cancel()
            self._abort_handle = None
        if self._tick_handle:
            self._tick_handle.cancel()
        if self._flush_handle:
            self._flush_handle.cancel()
            self._flush_handle = None
        try:
            self.engine.close_tail()
            self.engine.close_head()
        except TransportException:
            pass
        # The handler finishes what the connection's links started; nothing of it points back
        # here afterwards, so both are freed as soon as that is done, without waiting for the
        # garbage collector (docs/design.md §3.12).
        handler, self.handler, self.raw_links = self.handler, _CLOSED, {}
        self._handled = frozenset()
        handler.closed()
        if self._on_closed is not None:
            self._on_closed(self)

    # --- engine side ------------------------------------------------------------------------
    def kick(self) -> None:
        """Dispatch pending engine events now; write what they produced at the end of this
        event-loop turn. Re-entrant calls (a handler changing the engine while events are
        dispatched) are folded into the running one."""
        self._run_events()
        if not self._closed:
            self._tick()
            if self._flush_handle is None:
                self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _run_events(self) -> None:
        if self._dispatching:
            self._again = True
            return
        self._dispatching = True
        try:
            while True:
                self._again = False
                self._dispatch_events()
                if not self._again and engine.collector_peek(self.collector._impl) == engine.NULL:
                    break
        finally:
            self._dispatching = False

    def _flush(self) -> None:
        """Write everything the engine produced since the last flush: one socket write for all
        the kicks of an event-loop turn (a read's frames, the store answers of several links of
        the connection), instead of one each. Writing may raise events (the transport
        closing): they are dispatched, and what they produce written, at once."""
        self._flush_handle = None
        while True:
            self._write()
            if self._closed or engine.collector_peek(self.collector._impl) == engine.NULL:
                return
            self._run_events()

    def _dispatch_events(self) -> None:
        collector = self.collector._impl
        raw_links = self.raw_links
        handled = self._handled
        while (impl := engine.collector_peek(collector)) != engine.NULL:
            kind = engine.event_type(impl)
            # Nearly half of proton's events (a link's init, local open and final, transport
            # updates) have no handler: popped here without going through the chain below.
            if kind not in RAW_EVENTS and kind not in handled:
                engine.collector_pop(collector)
                continue
            try:
                # Deliveries on message links go raw to their endpoint, flows and a link's
                # and a session's life raw to the handler (see busd.amqp.engine); other events
                # the handler has a method for are wrapped.
                if kind == engine.PN_DELIVERY:
                    if raw_links:
                        delivery = engine.event_delivery(impl)
                        endpoint = raw_links.get(engine.delivery_link(delivery))
                        if endpoint is not None:
                            endpoint.on_raw_delivery(delivery)
                            engine.collector_pop(collector)
                            continue
                    if kind in handled:
                        self.handler.dispatch(Event.wrap(impl))
                elif kind == engine.PN_LINK_FLOW:
                    link = engine.event_link(impl)
                    endpoint = raw_links.get(link)
                    if endpoint is not None:
                        self.handler.flow(endpoint)
                    else:
                        self.handler.link_flow(link)
                    engine.collector_pop(collector)
                    continue
                elif kind == engine.PN_LINK_REMOTE_OPEN:
                    self.handler.link_opened(engine.event_link(impl))
                elif kind == engine.PN_LINK_REMOTE_CLOSE or kind == engine.PN_LINK_REMOTE_DETACH:
                    self.handler.link_gone(engine.event_link(impl))
                elif kind == engine.PN_SESSION_REMOTE_OPEN:
                    self.handler.session_opened(engine.event_session(impl))
                elif kind == engine.PN_SESSION_REMOTE_CLOSE:
                    self.handler.session_gone(engine.event_session(impl))
                elif kind in handled:
                    self.handler.dispatch(Event.wrap(impl))
            except Exception:  # a bug in one handler must not kill the connection loop
                log.exception("connection %s: error handling an event", self.peer)
            engine.collector_pop(collector)

    def _on_timer(self) -> None:
        self._tick_handle = None
        self._deadline = 0.0
        if not self._closed:
            self._tick()
            self._write()

    def _write(self) -> None:
        if self._sock is None or self._closed:
            return
        while True:
            pending = self.engine.pending()
            if pending < 0:  # head closed: everything is written
                self._close_socket()
                return
            if pending == 0:
                return
            out = self.engine.peek(pending)
            self.engine.pop(pending)
            if out:
                self._sock.write(self.delivery_ids.outgoing(out))

    def _tick(self) -> None:
        """Let proton run its timers (heartbeats, idle time-out) and arm ours for the next."""
        deadline = self.engine.tick(time.monotonic())
        if deadline == self._deadline:
            return
        self._deadline = deadline
        if self._tick_handle:
            self._tick_handle.cancel()
            self._tick_handle = None
        if deadline:
            delay = max(MIN_TICK_S, deadline - time.monotonic())
            self._tick_handle = asyncio.get_running_loop().call_later(delay, self._on_timer)
        if engine.collector_peek(self.collector._impl) != engine.NULL:
            self.kick()  # the tick changed state (idle time-out): handle it now

    # --- admission (busd.net.listener) -----------------------------------------------------------
    def opened(self) -> None:
        """The client's `open` was accepted: its handshake is done in time."""
        if self._pending is not None:
            self._pending.opened()

    def authenticated(self) -> None:
        """A valid put-token: no longer counted among the unauthenticated connections."""
        if self._pending is not None:
            self._pending.release()
            self._pending = None

    # --- closing ----------------------------------------------------------------------------
    @property
    def closing(self) -> bool:
        """Whether the socket is closed or being closed (by busd, or at a deadline)."""
        return self._closed or (self._sock is not None and self._sock.is_closing())

    def close_socket(self) -> None:
        """Close the socket now, whatever stage the AMQP exchange has reached: what the engine
        produced (a close frame, once the client's headers came) is written first."""
        if self._closed or self._sock is None:
            return
        self._flush()
        self._close_socket()

    def _close_socket(self) -> None:
        """Close the socket after what is buffered is written; cut it off after CLOSE_GRACE_S
        if the peer does not read it."""
        if self._closed or self._sock is None:
            return
        self._closed = True
        sock = self._sock
        sock.close()
        self._abort_handle = asyncio.get_running_loop().call_later(CLOSE_GRACE_S, sock.abort)

    def shutdown(self, condition) -> None:
        """Close the AMQP connection with `condition` (a proton Condition), write the close
        frame, then close the socket; the handler releases what the connection held."""
        if self._closed or self._sock is None:
            return
        self.connection.condition = condition
        self.connection.close()
        self.kick()
        self.close_socket()  # the close frame, then the socket

    def abort(self) -> None:
        if self._sock is not None and not self._closed:
            self._closed = True
            self._sock.abort()
