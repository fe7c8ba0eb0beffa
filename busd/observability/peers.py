"""The other workers of this host, so that `/metrics` and `/health/detail` answer for the host.

With `busd serve --workers N` (busd/server/workers.py) every worker serves the HTTP port, and a
scrape lands on whichever one the kernel picks. Each worker therefore also listens on a Unix
socket of its own, `<pid>.sock`, in a directory its parent made: a connection there is
answered with one JSON document, that worker's own report (its pid, its open AMQP
connections, its process metrics as Prometheus text), and closed. The worker a request
landed on gathers every report (docs/design.md §3.10). A worker that does not answer within
a second (starting, or killed and not yet restarted) is left out of that answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("busd.http")

ANSWER_TIMEOUT_S = 1.0


class Peers:
    """This worker's report socket, and the reports of all the workers of the host."""

    def __init__(self, directory: str, report: Callable[[], dict[str, Any]]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / f"{os.getpid()}.sock"
        self._report = report
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._answer, path=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _answer(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(json.dumps(self._report()).encode())
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def reports(self) -> list[dict[str, Any]]:
        """This worker's report, then those of the other workers that answered."""
        others = [p for p in self.directory.glob("*.sock") if p != self.path]
        answers = await asyncio.gather(*(_ask(p) for p in others))
        return [self._report(), *(a for a in answers if a is not None)]


async def _ask(path: Path) -> dict[str, Any] | None:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(path)), ANSWER_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        return None  # gone (its parent removes the socket) or not yet listening
    try:
        data = await asyncio.wait_for(reader.read(), ANSWER_TIMEOUT_S)
        return json.loads(data)
    except (OSError, TimeoutError, ValueError) as exc:
        log.debug("worker report %s unreadable: %s", path.name, exc)
        return None
    finally:
        writer.close()
