"""SIGTERM before busd's event loop answers it: noted here, acted on once the loop runs.

`busd serve` takes most of a second to import the broker, and may then wait for its store;
the signal's default would kill it there (exit -15), or, in a container where busd is
process 1 and the default is to ignore it, leave `docker stop` to wait its full time-out
(exit 137). A stop asked for that early is remembered, and the server stops as soon as it
can, exit 0 (docs/operating.md). A handler that only notes is safe at any moment; one that
raised an exception there could be swallowed by the code it interrupts."""

from __future__ import annotations

import signal
from typing import Any

_asked = False


def _note(_signum: int, _frame: Any) -> None:
    global _asked
    _asked = True


def note_early() -> None:
    """From now on until an event loop takes the signal over, SIGTERM is noted, not fatal."""
    signal.signal(signal.SIGTERM, _note)


def asked() -> bool:
    """Whether a SIGTERM came while it was only noted."""
    return _asked
