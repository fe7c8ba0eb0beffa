"""Server scope: the entities, the store, wake-ups of waiting receivers, and the sweep.

One `Broker` per process. It holds no state of record: the store does. What it holds is
local bookkeeping (which receivers of this process wait for which queue), rebuilt by
simply reconnecting after a crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from typing import Callable

from busd.storage.api import QueueSpec, Store

log = logging.getLogger("busd.broker")

# Receivers waiting on an empty queue re-check this often even without a wake-up, in case a
# notification was lost (store reconnect): a safety net, not the delivery path.
SAFETY_POLL_S = 5.0


class Broker:
    """Server scope. `entities` maps lower-cased queue names to their specs."""

    def __init__(
        self,
        store: Store,
        entities: dict[str, QueueSpec],
        *,
        sas_keys: dict[str, str],
        sweep_interval_s: float = 1.0,
        metrics=None,
    ) -> None:
        self.store = store
        self.entities = entities
        self.sas_keys = sas_keys
        self.sweep_interval_s = sweep_interval_s
        self.metrics = metrics
        self.container_id = f"busd-{uuid.uuid4().hex[:12]}"
        # queue name -> callbacks of local receivers waiting for messages/sessions there
        self._waiters: dict[str, set[Callable[[], None]]] = defaultdict(set)
        # session id -> callback that drops the local receiver holding it (lock expired)
        self.local_session_holders: dict[tuple[str, str], Callable[[], None]] = {}
        self._tasks: list[asyncio.Task] = []

    def queue(self, name: str) -> QueueSpec | None:
        return self.entities.get(name.lower())

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.connect()
        await self.store.subscribe(self.wake)
        self._tasks.append(asyncio.create_task(self._sweep_loop(), name="busd-sweep"))
        self._tasks.append(asyncio.create_task(self._safety_poll(), name="busd-poll"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.store.close()

    # --- wake-ups ---------------------------------------------------------------------------
    def add_waiter(self, queue: str, callback: Callable[[], None]) -> None:
        self._waiters[queue].add(callback)

    def remove_waiter(self, queue: str, callback: Callable[[], None]) -> None:
        waiters = self._waiters.get(queue)
        if waiters is not None:
            waiters.discard(callback)

    def wake(self, queue: str) -> None:
        """Messages or sessions may have become available in `queue` (any process)."""
        waiters = self._waiters.pop(queue, None)
        if not waiters:
            return
        for callback in waiters:
            try:
                callback()
            except Exception:
                log.exception("waiter for %s failed", queue)

    async def _safety_poll(self) -> None:
        while True:
            await asyncio.sleep(SAFETY_POLL_S)
            for queue in list(self._waiters):
                self.wake(queue)

    # --- sweep ------------------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            for spec in list(self.entities.values()):
                started = time.monotonic()
                try:
                    result = await self.store.sweep(spec)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # store unreachable: keep serving, try again later
                    log.warning("sweep of %s failed: %s", spec.name, exc)
                    continue
                if self.metrics is not None:
                    self.metrics.on_sweep(spec.name, result, time.monotonic() - started)
                for session_id in result.expired_session_locks:
                    drop = self.local_session_holders.get((spec.name, session_id))
                    if drop is not None:
                        drop()
