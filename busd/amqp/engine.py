"""proton's C engine, called directly on the per-message path.

proton's Python classes wrap every event and delivery in fresh objects and keep attributes in
C records: measured with py-spy, that wrapping was a quarter of busd's CPU per message. The
links that carry messages (queue senders and receivers) therefore handle their deliveries as
raw `pn_delivery_t` pointers through these few functions; everything else (attach, flow,
CBS, `$management`, errors) keeps using the Python classes.

A raw delivery the broker keeps beyond the event that brought it is held with `hold()` and
let go with `release()`, so proton cannot free it underneath (the Python wrappers do the same).
"""

from __future__ import annotations

from cproton_ffi import ffi, lib
from proton import Delivery

PN_DELIVERY = lib.PN_DELIVERY
PN_LINK_FLOW = lib.PN_LINK_FLOW
ACCEPTED = lib.PN_ACCEPTED
REJECTED = lib.PN_REJECTED
RELEASED = lib.PN_RELEASED
MODIFIED = lib.PN_MODIFIED
NULL = ffi.NULL

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


def wrap(delivery) -> Delivery:
    """The Python view of a raw delivery, for the rare paths (errors, annotations)."""
    return Delivery.wrap(delivery)
