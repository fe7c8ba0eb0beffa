"""Which hosts busd serves, and which web pages may open AMQP over WebSockets to it: a page on
another site must not drive a busd on the user's machine (docs/design.md §3.2).

Two checks, one list of names:

- HTTP (every port): the `Host` a request names is one busd serves, or the request is
  answered 421 before anything else. A page that rebinds its own DNS name to 127.0.0.1 (DNS
  rebinding) reaches busd as same-origin, but its requests still name the page's host. A host
  that is an IP address is served: no DNS name was rebound to reach it.
- WebSocket upgrades (`--ws-port`): a browser cannot set the `Origin` of a WebSocket, and no
  same-origin rule keeps a page from opening one, so the upgrade is refused (403) unless the
  Origin is absent (clients that are not browsers send none), names a host busd serves, or is
  allowed by `--allowed-origin`. Here an address is served only if it is a loopback one or
  the connection's own: a page served from another machine's address is another site.

The hosts busd serves: `localhost` and every `<name>.localhost` (namespace hosts; such names
resolve to loopback only, RFC 6761), loopback addresses, the address the client connected to,
and the names configured with `--hostname` (and `--host`, when it is a name).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

LOCALHOST = "localhost"
ANY_ORIGIN = "*"


def split_host(value: str) -> str | None:
    """The host of a `Host` header or an origin's authority (`name[:port]`, `[v6][:port]`),
    lower-cased without a trailing dot; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        address, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return address if _address(address) is not None else None
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.rstrip(".")
    if not name or any(not (c.isalnum() or c in "-._") for c in name):
        return None
    return name


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def is_address(host: str) -> bool:
    return _address(host) is not None


def _local_address(sockname) -> str | None:
    """The address of a connection's own end (transport.get_extra_info('sockname'))."""
    if isinstance(sockname, tuple) and sockname and isinstance(sockname[0], str):
        address = _address(sockname[0])
        if address is not None:
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            return str(address)
    return None


def normalize_origin(origin: str) -> str | None:
    """`scheme://host[:port]` lower-cased, as browsers send it; None when it is not one."""
    if origin in (ANY_ORIGIN, "null"):
        return origin
    try:
        parts = urlsplit(origin.strip())
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    if split_host(parts.netloc) is None:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


@dataclass(frozen=True)
class HostPolicy:
    """The hosts busd serves beyond localhost and its addresses (`--hostname`), and the
    origins allowed to open WebSockets beyond those hosts' (`--allowed-origin`)."""

    hostnames: frozenset[str] = field(default_factory=frozenset)
    allowed_origins: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, hostnames: Iterable[str] = (), allowed_origins: Iterable[str] = ()) -> HostPolicy:
        names = {split_host(h) or h.lower() for h in hostnames}
        origins = {normalize_origin(o) or o for o in allowed_origins}
        return cls(frozenset(names), frozenset(origins))

    def serves(self, host: str, local: str | None, *, any_address: bool) -> bool:
        """Whether `host` (split_host's) is one busd serves; `any_address`: every IP address
        counts (a Host header), else loopback ones and `local` only (an Origin)."""
        if host == LOCALHOST or host.endswith("." + LOCALHOST) or host in self.hostnames:
            return True
        address = _address(host)
        if address is None:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return any_address or address.is_loopback or str(address) == local

    def host_refusal(self, host: str | None) -> str | None:
        """Why an HTTP request naming `host` (its Host header; None: it sent none, as HTTP/1.0
        may) is refused, or None when busd serves it."""
        if host is None:
            return None
        name = split_host(host)
        if name is not None and self.serves(name, None, any_address=True):
            return None
        return (
            f"busd does not serve the host {host!r}: a request naming another host may come "
            "from a web page on another site (DNS rebinding). Reach busd as localhost or by "
            "its address, or add the name with --hostname (BUSD_HOSTNAME).\n"
        )

    def origin_refusal(self, origin: str | None, sockname=None) -> str | None:
        """Why a WebSocket upgrade from a page of `origin` (None: no Origin header, not a
        browser) is refused, on a connection whose own end is `sockname`; None: accepted."""
        if origin is None or ANY_ORIGIN in self.allowed_origins:
            return None
        normal = normalize_origin(origin)
        if normal is not None and normal in self.allowed_origins:
            return None
        if normal not in (None, "null", ANY_ORIGIN):
            host = split_host(urlsplit(normal).netloc)
            local = _local_address(sockname)
            if host is not None and self.serves(host, local, any_address=False):
                return None
        return (
            f"web pages of {origin!r} may not open AMQP over WebSockets to busd: allow the "
            "origin with --allowed-origin (BUSD_ALLOWED_ORIGIN)\n"
        )


# The process's policy: its settings' (busd.server.lifecycle sets it at start-up).
_policy = HostPolicy()


def configure(policy: HostPolicy) -> None:
    global _policy
    _policy = policy


def policy() -> HostPolicy:
    return _policy


def websocket_refusal(origin: str | None, transport=None) -> str | None:
    """The process policy's answer to a WebSocket upgrade (busd.amqp.websocket) from a page
    of `origin`, on the connection of `transport`."""
    sockname = None if transport is None else transport.get_extra_info("sockname")
    return _policy.origin_refusal(origin, sockname)
