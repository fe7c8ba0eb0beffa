"""proton's C engine, called directly on the per-message and per-link paths.

proton's Python classes wrap every event and delivery in fresh objects and keep attributes in
C records: measured with py-spy, that wrapping was a quarter of busd's CPU per message. The
links that carry messages (queue senders and receivers) therefore handle their deliveries as
raw `pn_delivery_t` pointers through these few functions. A link's life is handled raw too
(docs/design.md §3.2): its attach is read here (name, addresses, properties, source filter),
its flow and detach reach the connection as raw `pn_link_t` pointers, and an AMQP session's
begin and end as raw `pn_session_t` pointers. An endpoint keeps one proton `Link` for what it
does with its link (read credit, answer a plain attach; a session receiver answers its attach
here, `open_session_link`); the rare paths (refusals, errors, CBS,
`$management`) keep using the Python classes.

A raw delivery the broker keeps beyond the event that brought it is held with `hold()` and
let go with `release()`, so proton cannot free it underneath (the Python wrappers do the same).
"""

from __future__ import annotations

from typing import Any

from cproton_ffi import ffi, lib
from proton import Delivery

from busd.amqp.decoding import decode_value

PN_DELIVERY = lib.PN_DELIVERY
PN_LINK_FLOW = lib.PN_LINK_FLOW
ACCEPTED = lib.PN_ACCEPTED
REJECTED = lib.PN_REJECTED
RELEASED = lib.PN_RELEASED
MODIFIED = lib.PN_MODIFIED
NULL = ffi.NULL

# the link and session events the connection handles raw (busd.amqp.protocol)
PN_LINK_REMOTE_OPEN = lib.PN_LINK_REMOTE_OPEN
PN_LINK_REMOTE_CLOSE = lib.PN_LINK_REMOTE_CLOSE
PN_LINK_REMOTE_DETACH = lib.PN_LINK_REMOTE_DETACH
PN_SESSION_REMOTE_OPEN = lib.PN_SESSION_REMOTE_OPEN
PN_SESSION_REMOTE_CLOSE = lib.PN_SESSION_REMOTE_CLOSE
LOCAL_UNINIT = lib.PN_LOCAL_UNINIT
LOCAL_ACTIVE = lib.PN_LOCAL_ACTIVE
LOCAL_CLOSED = lib.PN_LOCAL_CLOSED
REMOTE_CLOSED = lib.PN_REMOTE_CLOSED
COORDINATOR = lib.PN_COORDINATOR
SND_SETTLED = lib.PN_SND_SETTLED

collector_peek = lib.pn_collector_peek
collector_pop = lib.pn_collector_pop
event_type = lib.pn_event_type
event_delivery = lib.pn_event_delivery
event_link = lib.pn_event_link
delivery_link = lib.pn_delivery_link
readable = lib.pn_delivery_readable
partial = lib.pn_delivery_partial
aborted = lib.pn_delivery_aborted
pending = lib.pn_delivery_pending
updated = lib.pn_delivery_updated
remote_settled = lib.pn_delivery_settled
remote_state = lib.pn_delivery_remote_state
link_credit = lib.pn_link_credit
link_flow = lib.pn_link_flow
link_advance = lib.pn_link_advance
event_session = lib.pn_event_session
link_session = lib.pn_link_session
link_state = lib.pn_link_state
link_is_sender = lib.pn_link_is_sender
session_state = lib.pn_session_state
session_set_incoming_capacity = lib.pn_session_set_incoming_capacity
session_open = lib.pn_session_open
hold = lib.pn_incref
release = lib.pn_decref


def recv(link, size: int) -> bytes:
    """The `size` bytes of the current delivery that proton has buffered."""
    buf = bytearray(size)
    n = lib.pn_link_recv(link, ffi.from_buffer(buf), size)
    if n < 0:
        return b""
    return bytes(buf) if n == size else bytes(buf[:n])


def send(link, tag: bytes, payload: bytes):
    """Create a delivery with `tag`, write `payload`, advance; returns the raw delivery."""
    delivery = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
    lib.pn_link_send(link, ffi.from_buffer(payload), len(payload))
    lib.pn_link_advance(link)
    return delivery


def settle(delivery, state: int = 0) -> None:
    """Set our outcome (0: none) and settle."""
    if state:
        lib.pn_delivery_update(delivery, state)
    lib.pn_delivery_settle(delivery)


def settle_modified(delivery, *, undeliverable: bool) -> None:
    local = lib.pn_delivery_local(delivery)
    lib.pn_disposition_set_failed(local, True)
    lib.pn_disposition_set_undeliverable(local, undeliverable)
    lib.pn_delivery_update(delivery, MODIFIED)
    lib.pn_delivery_settle(delivery)


def remote_modified(delivery) -> tuple[bool, bool]:
    """(delivery-failed, undeliverable-here) of the peer's `modified` outcome."""
    remote = lib.pn_delivery_remote(delivery)
    return bool(lib.pn_disposition_is_failed(remote)), bool(
        lib.pn_disposition_is_undeliverable(remote)
    )


# --- a link's life ---------------------------------------------------------------------------
def link_name(link) -> str | None:
    """The link's name (None: the attach had none; UnicodeDecodeError when it is not
    UTF-8)."""
    name = lib.pn_link_name(link)
    return None if name == NULL else ffi.string(name).decode()


def remote_address(link, *, source: bool) -> str | None:
    """The address of the client's source or target (UnicodeDecodeError when not UTF-8)."""
    terminus = lib.pn_link_remote_source(link) if source else lib.pn_link_remote_target(link)
    address = lib.pn_terminus_get_address(terminus)
    return None if address == NULL else ffi.string(address).decode()


def remote_target_is_coordinator(link) -> bool:
    """Whether the client attaches a transaction controller (docs/wire.md §10.2)."""
    return lib.pn_terminus_get_type(lib.pn_link_remote_target(link)) == COORDINATOR


def remote_snd_settled(link) -> bool:
    """Whether the client asks for settled deliveries (receive-and-delete)."""
    return lib.pn_link_remote_snd_settle_mode(link) == SND_SETTLED


def _data_value(data) -> Any:
    """The value a `pn_data_t` holds, decoded by busd's codec (busd.amqp.decoding: symbols as
    `Symbol`, described values as `Described`); None when it holds none. Raises CodecError
    on what busd cannot decode (text that is not UTF-8)."""
    if data == NULL:  # proton makes it only when the frame has the field
        return None
    lib.pn_data_rewind(data)
    if not lib.pn_data_next(data):
        return None
    size = lib.pn_data_encoded_size(data)
    if size <= 0:
        return None
    buf = ffi.new("char[]", size)
    if lib.pn_data_encode(data, buf, size) != size:
        return None
    return decode_value(ffi.buffer(buf, size)[:])[0]


def remote_properties(link) -> Any:
    """The properties map of the client's attach (None when it sent none)."""
    return _data_value(lib.pn_link_remote_properties(link))


def remote_source_filter(link) -> Any:
    """The filter map of the client's source (None when it sent none)."""
    return _data_value(lib.pn_terminus_filter(lib.pn_link_remote_source(link)))


def echo_termini(link) -> None:
    """Our termini and settle modes as the client's (the attach's answer, docs/wire.md §4)."""
    lib.pn_terminus_copy(lib.pn_link_source(link), lib.pn_link_remote_source(link))
    lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))
    lib.pn_link_set_snd_settle_mode(link, lib.pn_link_remote_snd_settle_mode(link))
    lib.pn_link_set_rcv_settle_mode(link, lib.pn_link_remote_rcv_settle_mode(link))


def _put_symbol(data, name: bytes) -> None:
    lib.pn_data_put_symbol(data, (len(name), ffi.from_buffer(name)))


def open_session_link(
    link,
    filter_key: bytes,
    session_id: str,
    property_key: bytes,
    locked_until: int,
    descriptor: int | str | None = None,
) -> None:
    """Answer a session receiver's attach (docs/wire.md §4.2): the client's termini with the
    source filter `{filter_key: session_id}` (the id described by `descriptor` when the
    client's filter was described) and the properties `{property_key: locked_until}` (a
    long), written straight into the engine's data rather than through proton's `Data`
    objects, as the session churn pays this once per session."""
    echo_termini(link)
    data = lib.pn_terminus_filter(lib.pn_link_source(link))
    lib.pn_data_clear(data)
    lib.pn_data_put_map(data)
    lib.pn_data_enter(data)
    _put_symbol(data, filter_key)
    if descriptor is not None:
        lib.pn_data_put_described(data)
        lib.pn_data_enter(data)
        if isinstance(descriptor, int):
            lib.pn_data_put_ulong(data, descriptor)
        else:
            _put_symbol(data, str(descriptor).encode())
    text = session_id.encode()
    lib.pn_data_put_string(data, (len(text), ffi.from_buffer(text)))
    if descriptor is not None:
        lib.pn_data_exit(data)
    lib.pn_data_exit(data)
    data = lib.pn_link_properties(link)
    lib.pn_data_clear(data)
    lib.pn_data_put_map(data)
    lib.pn_data_enter(data)
    _put_symbol(data, property_key)
    lib.pn_data_put_long(data, locked_until)
    lib.pn_data_exit(data)
    lib.pn_link_open(link)


def end_link(link) -> None:
    """Close our end of a link the client detached (no error of ours), then free it. proton
    keeps every link of a session until it is freed (the detach is still written), so without
    this a long-lived connection would keep each link it ever had."""
    if not lib.pn_link_state(link) & LOCAL_CLOSED:
        lib.pn_link_close(link)
    lib.pn_link_free(link)


def end_session(session) -> None:
    """As `end_link`, for an AMQP session the client ended and whatever links it still has
    (the JavaScript SDK begins a session for every link it attaches, all on one
    connection)."""
    if not lib.pn_session_state(session) & LOCAL_CLOSED:
        lib.pn_session_close(session)
    lib.pn_session_free(session)


def wrap(delivery) -> Delivery:
    """The Python view of a raw delivery, for the rare paths (errors, annotations)."""
    return Delivery.wrap(delivery)
