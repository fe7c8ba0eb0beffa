"""What busd reads of a client's open and attach frames, decoded once: names must be text busd
can log and route, and the fields it reads must decode (docs/design.md §3.12, docs/wire.md §2).
A field that does not is refused with `amqp:invalid-field`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from busd.amqp import engine
from busd.amqp.types import CodecError
from busd.broker.limits import MAX_NAME_LENGTH
from busd.broker.links.routing import Attach
from busd.errors import BusdError
from busd.errors import Condition as Cond


def _name(value_of: Callable[[], str | None] | str | None, what: str) -> str | None:
    """A name the client gave, decoded: refused when it is not UTF-8 or too long."""
    try:
        value = value_of() if callable(value_of) else value_of
    except UnicodeDecodeError:
        raise BusdError(Cond.INVALID_FIELD, f"The {what} is not valid UTF-8.") from None
    if value is not None and len(value) > MAX_NAME_LENGTH:
        raise BusdError(
            Cond.INVALID_FIELD, f"The {what} is longer than {MAX_NAME_LENGTH} characters."
        )
    return value


def _read_open(conn) -> tuple[str | None, str | None]:
    """The (container-id, hostname) of the client's open, decoded once with the rest of its
    fields: each must be text busd can log and use (docs/design.md §3.12)."""
    container = _name(lambda: conn.remote_container, "container-id")
    hostname = _name(lambda: conn.remote_hostname, "hostname")
    for what, value_of in (
        ("properties", lambda: conn.remote_properties),
        ("offered capabilities", lambda: conn.remote_offered_capabilities),
        ("desired capabilities", lambda: conn.remote_desired_capabilities),
    ):
        try:
            value_of()
        except Exception:  # not UTF-8, or a value proton cannot decode
            raise BusdError(
                Cond.INVALID_FIELD, f"The open's {what} cannot be decoded (not valid UTF-8?)."
            ) from None
    return container, hostname


def _read_attach(link: Any) -> Attach:
    """What routing reads of an attach (a raw pn_link_t), decoded once on proton's engine: the
    link's name and addresses must be text busd can log and route, and its properties and
    source filter must decode (docs/wire.md §2)."""
    _name(lambda: engine.link_name(link), "link name")
    source_address = _name(lambda: engine.remote_address(link, source=True), "source address")
    target_address = _name(lambda: engine.remote_address(link, source=False), "target address")
    # routing reads them (com.microsoft:timeout): their text must decode too
    try:
        properties = engine.remote_properties(link)
    except CodecError:
        raise BusdError(
            Cond.INVALID_FIELD, "The link's properties map cannot be decoded (not valid UTF-8?)."
        ) from None
    try:
        source_filter = engine.remote_source_filter(link)
    except CodecError:  # as no filter: routing refuses a session receiver without one
        source_filter = None
    return Attach(
        source_address,
        target_address,
        properties if isinstance(properties, dict) else {},
        source_filter if isinstance(source_filter, dict) else None,
    )
