"""The frame stream between a client and proton's engine: delivery-ids a client numbered out of
order or twice are put in sequence on the way in, and busd's answers carry the client's own
numbers on the way out (docs/wire.md §5.2); link-credit beyond what proton can hold is lowered
on the way in (docs/wire.md §6.2).

proton requires the delivery-id of each new delivery on a session to be exactly one more than
the last [2.7.5] and aborts the whole connection otherwise ("sequencing error"). The sync
Python SDK breaks that rule by itself: its AutoLockRenewer thread and the receiving thread
send `$management` transfers on one session without a lock around the counter, so two
transfers go out with the same id, or swapped. Service Bus carries on. busd does too, within
bounds that still catch a broken stream:

- a new delivery's id may differ from the expected one by at most ID_TOLERANCE (serial
  number arithmetic); it is renumbered to the expected one before proton sees it, and when
  the client did not settle it, busd's disposition is numbered back to the client's id;
- the frames of one multi-frame delivery keep their first frame's id (or none);
- anything else - an id further off, more than MAX_RENUMBERED unsettled renumbered deliveries
  on a session, a frame this layer cannot read - goes to proton unchanged, which refuses it
  as before.

Link-credit is an AMQP uint [2.7.4], but proton keeps a link's credit in a signed int: 2^31 or
more reads as negative, and proton then neither lets busd see the credit nor ends a drain. A
flow granting more than MAX_CREDIT is passed on granting MAX_CREDIT, which a sender may always
do (it sends at most the credit, never more than the receiver asked for).

Only transfer, flow, begin and end frames are read, and of a transfer only its first fields; the
payload is never copied. busd's outgoing frames are read only while a client's begin awaits
its answer (to learn which channel answers which) and while some disposition must be
numbered back.
"""

from __future__ import annotations

import logging
import struct

from busd.amqp.decoding import RAW_ERRORS, decode_raw, skip_raw
from busd.amqp.encoding import encode_value
from busd.amqp.types import UInt

__all__ = ["DeliveryIds"]

log = logging.getLogger("busd.amqp")

ID_TOLERANCE = 1024  # how far off a delivery-id may be and still be taken for a racing client
MAX_RENUMBERED = 4096  # unsettled renumbered deliveries a session may have at once
MAX_CREDIT = 2**31 - 1  # the most link-credit proton's signed int holds

_FRAME_HEAD = struct.Struct(">IBBH")
_u32 = struct.Struct(">I").unpack_from
_pack_list32_head = struct.Struct(">BII").pack
_AMQP_FRAME = 0
_BEGIN, _FLOW, _TRANSFER, _DISPOSITION, _END = 0x11, 0x13, 0x14, 0x15, 0x17
_MAX_CREDIT_UINT = b"\x70" + struct.pack(">I", MAX_CREDIT)
_SERIAL = 1 << 32
_TRANSFER_OPEN = b"\x00\x53\x14"
_DESCRIPTORS = {
    b"amqp:begin:list": _BEGIN,
    b"amqp:flow:list": _FLOW,
    b"amqp:transfer:list": _TRANSFER,
    b"amqp:disposition:list": _DISPOSITION,
    b"amqp:end:list": _END,
}


_Replacement = tuple[bytes, int] | None  # bytes to put in place of a frame's, up to an end


class _Unreadable(Exception):
    """A frame this layer does not understand: it and all after it go to proton unchanged."""


class _Session:
    """The state of one client session (by the client's channel)."""

    __slots__ = ("next_id", "partial", "renumbered")

    def __init__(self) -> None:
        self.next_id: int | None = None  # the id proton expects next (set by the first)
        self.partial: dict[int, tuple[int, int]] = {}  # handle -> (busd's id, client's id)
        self.renumbered: dict[int, int] = {}  # busd's id -> client's id, unsettled ones


class DeliveryIds:
    """One connection's frame stream, both ways. `incoming` and `outgoing` take bytes as they
    come (any split) and return the bytes to pass on."""

    def __init__(self) -> None:
        self._sessions: dict[int, _Session] = {}  # by the client's channel
        self._in = _Stream()
        self._out = _Stream()
        self._off = False  # an unreadable frame came: pass everything on unchanged
        self._unanswered_begins = 0
        self._answering: dict[int, int] = {}  # busd's channel -> the client's channel

    # --- client -> proton ----------------------------------------------------------------------
    def incoming(self, data: bytes) -> bytes:
        return data if self._off else self._in.feed(self, data, self._on_incoming)

    def _on_incoming(
        self,
        buf: bytes,
        pos: int,
        body: int,
        end: int,
        channel: int,
        code: int,
        fields: int,
        count: int,
        list_end: int,
    ) -> _Replacement:
        if code == _TRANSFER:
            new = self._transfer(channel, buf, fields, count, list_end)
            if new is not None:
                size, doff, kind, _ = _FRAME_HEAD.unpack_from(buf, pos)
                delta = len(new) - (list_end - body)
                head = _FRAME_HEAD.pack(size + delta, doff, kind, channel)
                return head + buf[pos + 8 : body] + new, list_end
        elif code == _FLOW:
            if count > 6:
                return _credit_lowered(buf, pos, fields)
        elif code == _BEGIN:
            self._sessions.pop(channel, None)
            self._unanswered_begins += 1
        elif code == _END:
            self._sessions.pop(channel, None)
        return None

    def _transfer(self, channel: int, buf: bytes, p: int, count: int, end: int) -> bytes | None:
        """The transfer's performative renumbered, or None to pass it on as it is."""
        fields: list = [None] * 6  # handle, delivery-id, tag (skipped), format, settled, more
        starts = [0] * 7
        for i in range(min(count, 6)):
            starts[i] = p
            if i == 2 or i == 3:
                p = skip_raw(buf, p)
            else:
                fields[i], p = decode_raw(buf, p)
        starts[min(count, 6)] = p
        handle, client_id, _, _, settled, more = fields
        if type(handle) is not int:
            raise _Unreadable
        session = self._sessions.get(channel)
        if session is None:
            session = self._sessions[channel] = _Session()
        done = not more or (count > 9 and _aborted(buf, p))
        partial = session.partial.get(handle)
        if partial is not None:  # a further frame of a multi-frame delivery
            ours, theirs = partial
            if done:
                del session.partial[handle]
            if client_id is None or client_id != theirs or ours == theirs:
                return None
        else:
            if type(client_id) is not int:
                return None  # proton decides
            if session.next_id is None:
                session.next_id = client_id
            ours = session.next_id
            if ours != client_id:
                off = (client_id - ours) % _SERIAL
                if min(off, _SERIAL - off) > ID_TOLERANCE or (
                    not settled and len(session.renumbered) >= MAX_RENUMBERED
                ):
                    return None  # beyond what a racing client does: proton refuses it
            session.next_id = (ours + 1) % _SERIAL
            if not done:
                session.partial[handle] = (ours, client_id)
            if ours == client_id:
                return None
            log.debug("delivery-id %d on channel %d taken as %d", client_id, channel, ours)
            if not settled:
                session.renumbered[ours] = client_id
        listed = buf[starts[0] : starts[1]] + encode_value(UInt(ours)) + buf[starts[2] : end]
        return _TRANSFER_OPEN + _pack_list32_head(0xD0, len(listed) + 4, count) + listed

    # --- proton -> client ----------------------------------------------------------------------
    @property
    def _reading_out(self) -> bool:
        return bool(self._unanswered_begins) or any(s.renumbered for s in self._sessions.values())

    def outgoing(self, data: bytes) -> bytes:
        if self._off or not (self._reading_out or self._out.busy):
            return data
        return self._out.feed(self, data, self._on_outgoing)

    def _on_outgoing(
        self,
        buf: bytes,
        pos: int,
        body: int,
        end: int,
        channel: int,
        code: int,
        fields: int,
        count: int,
        list_end: int,
    ) -> _Replacement:
        if code == _BEGIN:
            remote = decode_raw(buf, fields)[0] if count else None
            if type(remote) is int:
                self._answering[channel] = remote
                self._unanswered_begins = max(0, self._unanswered_begins - 1)
        elif code == _DISPOSITION and end <= len(buf):
            new = self._disposition(channel, buf, pos, body, fields, count, list_end)
            if new is not None:
                return new, end
        elif code == _END:
            self._answering.pop(channel, None)
        return None

    def _disposition(
        self, channel: int, buf: bytes, pos: int, body: int, p: int, count: int, end: int
    ) -> bytes | None:
        """busd's disposition frame(s) with the client's delivery-ids, or None if unchanged."""
        session = self._sessions.get(self._answering.get(channel, -1))
        if session is None or not session.renumbered or count < 2:
            return None
        role_at = p
        role, p = decode_raw(buf, p)
        if not role:  # busd as sender: about busd's own deliveries
            return None
        role_raw = buf[role_at:p]
        first, p = decode_raw(buf, p)
        last, p = decode_raw(buf, p) if count > 2 else (None, p)
        rest, rest_count = buf[p:end], max(count - 3, 0)
        settled = count > 3 and (buf[p] == 0x41 or buf[p : p + 2] == b"\x56\x01")
        if type(first) is not int:
            return None
        last = first if type(last) is not int else last
        ids = [(first + i) % _SERIAL for i in range(((last - first) % _SERIAL) + 1)]
        if len(ids) > MAX_RENUMBERED + ID_TOLERANCE or not any(
            i in session.renumbered for i in ids
        ):
            return None
        theirs = [session.renumbered.get(i, i) for i in ids]
        if settled:
            for i in ids:
                session.renumbered.pop(i, None)
        head = buf[pos + 8 : body]  # extended header, if any
        out = []
        start = 0
        for k in range(1, len(theirs) + 1):  # one frame per run of consecutive client ids
            if k == len(theirs) or theirs[k] != (theirs[k - 1] + 1) % _SERIAL:
                fields = (
                    role_raw
                    + encode_value(UInt(theirs[start]))
                    + encode_value(UInt(theirs[k - 1]))
                    + rest
                )
                n_fields = 3 + rest_count
                listed = _pack_list32_head(0xD0, len(fields) + 4, n_fields) + fields
                performative = b"\x00\x53\x15" + listed
                out.append(
                    _FRAME_HEAD.pack(
                        8 + len(head) + len(performative),
                        (8 + len(head)) // 4,
                        _AMQP_FRAME,
                        channel,
                    )
                    + head
                    + performative
                )
                start = k
        return b"".join(out)


class _Stream:
    """One direction's frames as the bytes come: what is left of a frame being passed on, and
    the start of one too short to read yet."""

    __slots__ = ("carry", "skip")

    def __init__(self) -> None:
        self.carry = b""
        self.skip = 0

    @property
    def busy(self) -> bool:
        return bool(self.carry or self.skip)

    def feed(self, owner: DeliveryIds, data: bytes, on_performative) -> bytes:
        """`data` passed on, with what `on_performative` replaces: it gets each performative
        (frame start, body, frame end, channel, descriptor code, first field, field count,
        performative end) and returns None or (bytes, end): those bytes instead of the frame's
        from its start to `end`."""
        if self.skip >= len(data) and not self.carry:  # inside a large frame's payload
            self.skip -= len(data)
            return data
        buf = self.carry + data if self.carry else data
        self.carry = b""
        pos, self.skip = self.skip, 0
        pieces: list[bytes] = []
        emitted = 0
        n = len(buf)
        try:
            while pos < n:
                if n - pos < 8:
                    break
                if buf[pos : pos + 4] == b"AMQP":  # a protocol header (SASL, then AMQP)
                    pos += 8
                    continue
                size, doff, kind, channel = _FRAME_HEAD.unpack_from(buf, pos)
                if size < 8 or doff < 2:
                    raise _Unreadable
                end = pos + size
                body = pos + 4 * doff
                if kind == _AMQP_FRAME and size > 4 * doff:
                    performative = _performative(buf, body, min(end, n))
                    if performative is None:  # not all here yet
                        if end <= n:
                            raise _Unreadable
                        break
                    replaced = on_performative(buf, pos, body, end, channel, *performative)
                    if replaced is not None:
                        pieces += (buf[emitted:pos], replaced[0])
                        emitted = replaced[1]
                if end > n:
                    self.skip = end - n
                    pos = n
                    break
                pos = end
        except (_Unreadable, *RAW_ERRORS):
            owner._off = True  # proton reads it and says what is wrong
            pieces.append(buf[emitted:])
            return b"".join(pieces)
        if pos < n:
            self.carry = buf[pos:]
            n = pos
        if not pieces:
            return buf[:n] if n < len(buf) else buf
        pieces.append(buf[emitted:n])
        return b"".join(pieces)


def _performative(buf: bytes, p: int, limit: int) -> tuple[int, int, int, int] | None:
    """(descriptor code, first field, field count, end) of the performative at p, or None if
    it does not end before `limit` (not all of it has arrived)."""
    if limit - p < 4:
        return None
    if buf[p] != 0:
        raise _Unreadable
    d = buf[p + 1]
    if d == 0x53:
        code, q = buf[p + 2], p + 3
    elif d == 0x80:
        if limit - p < 11:
            return None
        code, q = int.from_bytes(buf[p + 2 : p + 10], "big"), p + 10
        code = code if code <= 0xFF else 0
    elif d == 0xA3:
        if limit - p < 3 + buf[p + 2]:
            return None
        name = buf[p + 3 : p + 3 + buf[p + 2]]
        code, q = _DESCRIPTORS.get(bytes(name), 0), p + 3 + buf[p + 2]
    else:
        raise _Unreadable
    if q >= limit:
        return None
    c = buf[q]
    if c == 0x45:
        return code, q + 1, 0, q + 1
    if c == 0xC0:
        if limit - q < 3:
            return None
        end = q + 2 + buf[q + 1]
        fields, count = q + 3, buf[q + 2]
    elif c == 0xD0:
        if limit - q < 9:
            return None
        end = q + 5 + _u32(buf, q + 1)[0]
        fields, count = q + 9, _u32(buf, q + 5)[0]
    else:
        raise _Unreadable
    return (code, fields, count, end) if end <= limit else None


def _credit_lowered(buf: bytes, pos: int, p: int) -> _Replacement:
    """A flow frame (at pos, fields at p) up to its link-credit lowered to MAX_CREDIT, or None
    when the credit fits (only a 4-byte uint can pass it; the encoding keeps its size)."""
    for _ in range(6):  # next-incoming-id .. delivery-count
        p = skip_raw(buf, p)
    if buf[p] != 0x70 or _u32(buf, p + 1)[0] <= MAX_CREDIT:
        return None
    return buf[pos:p] + _MAX_CREDIT_UINT, p + 5


def _aborted(buf: bytes, p: int) -> bool:
    """Field 9 (aborted) of a transfer whose fields 6.. start at p."""
    for _ in range(6, 9):
        p = skip_raw(buf, p)
    return buf[p] == 0x41
