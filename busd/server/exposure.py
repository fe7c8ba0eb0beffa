"""The start-up warning of a broker others can reach with the key everyone knows: busd
listening beyond loopback while one of its keys is the emulator's `SAS_KEY_VALUE`
(docs/design.md §2.10), which every sample connection string carries."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from busd.auth.sas import DEFAULT_SAS_KEY


def is_loopback(host: str) -> bool:
    """Whether a listening address admits this machine's own clients only. An unspecified
    address (`0.0.0.0`, `::`, empty) and any name but localhost count as reachable."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def default_key_warning(host: str, keys: Mapping[str, str]) -> str | None:
    """The warning to log at start, or None when the host is loopback or no key is the
    well-known one."""
    names = sorted(name for name, key in keys.items() if key == DEFAULT_SAS_KEY)
    if not names or is_loopback(host):
        return None
    return (
        f"listening on {host or '*'} with the well-known key {DEFAULT_SAS_KEY} "
        f"({', '.join(names)}): anyone who can reach this address can send, receive and "
        "manage every entity. Give busd a key of your own (--sas-key NAME=KEY, BUSD_SAS_KEY) "
        "or listen on 127.0.0.1 only (--host)."
    )
