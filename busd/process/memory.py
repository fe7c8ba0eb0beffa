"""Memory freed in a burst is given back to the system (docs/design.md §3.12).

CPython (for objects above 512 bytes) and proton allocate through the C library's malloc. glibc
keeps what is freed inside its heap for reuse, and returns the top of the heap only: after a
burst of closed connections or dropped unfinished transfers, the objects are gone but the
process's resident memory stays at its peak. `trim_soon()` asks malloc to give its free pages
back (`malloc_trim`), once, a moment after the burst: called for every closed connection, it
runs at most once per TRIM_DELAY_S. With another C library (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
from typing import Any

__all__ = ["trim_soon"]

TRIM_DELAY_S = 1.0


def _malloc_trim() -> Any:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_trim = _malloc_trim()
_pending: asyncio.TimerHandle | None = None


def trim_soon() -> None:
    """Give free heap pages back to the system TRIM_DELAY_S from now, unless already due."""
    global _pending
    if _trim is None or _pending is not None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _pending = loop.call_later(TRIM_DELAY_S, _run)


def _run() -> None:
    global _pending
    _pending = None
    _trim(0)
