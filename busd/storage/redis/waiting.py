"""Waiting for the store at start: a store started alongside busd (compose, a pod) may take
a while to accept connections, so `busd serve` tries it until `--store-wait` runs out, saying
so once per attempt, and then fails with one line (docs/design.md §3.1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from busd.storage.redis.connection import RedisConnection

RETRY_S = 1.0  # between attempts
ATTEMPT_S = 5.0  # longest one attempt may take (a host that drops packets never refuses)


class StoreNotReady(Exception):
    """The store did not answer within the wait, or answered that busd cannot use it."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):  # wait_for ran out
        return f"no answer within {ATTEMPT_S:g} s"
    return " ".join(str(exc).split()) or type(exc).__name__


async def wait_for_store(url: str, wait_s: float, shown: str, say: Callable[[str], None]) -> None:
    """Return once the store at `url` answers as busd needs (a connection, the server checks,
    the scripts loaded); `shown`: the URL as logs may show it; `say`: one line per failed
    attempt. Raises StoreNotReady after `wait_s` seconds, or at once where waiting cannot help
    (a server too old, a setting it lacks)."""
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        attempt += 1
        probe = RedisConnection(url, prefix="busd-probe")
        try:
            left = max(deadline - time.monotonic(), 0.1)
            await asyncio.wait_for(probe.connect(), timeout=min(ATTEMPT_S, left))
            return
        except RuntimeError as exc:  # the server answered: waiting will not change it
            raise StoreNotReady(f"the store at {shown} cannot be used: {exc}") from None
        except (TimeoutError, RedisError, OSError) as exc:
            reason = _reason(exc)
        finally:
            try:
                await probe.close()
            except (RedisError, OSError):
                pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreNotReady(
                f"the store at {shown} did not answer within {wait_s:g} s "
                f"({attempt} attempts): {reason}"
            )
        say(f"waiting for the store at {shown}: {reason} (attempt {attempt}, {left:.0f} s left)")
        await asyncio.sleep(min(RETRY_S, left))
