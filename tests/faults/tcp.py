"""The protocol tests' client (tests/protocol/harness.py) over a real TCP socket.

`ProtocolClient` talks to whatever stands where busd's protocol object stands in memory; here
that is a `TcpBridge`, which writes what the client produces to a socket and hands what the
socket reads to the client. Every byte the client writes can be kept (`record`): the frame
fuzzer's seeds are such recordings of real client sessions.
"""

from __future__ import annotations

import asyncio

from tests.protocol.harness import ProtocolClient


class TcpBridge:
    """Stands in for busd's AmqpProtocol on the client's side of a real socket."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        record: list[bytes] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.record = record
        self.sock = None
        self._task: asyncio.Task | None = None

    def connection_made(self, sock) -> None:  # the client's MemorySocket
        self.sock = sock
        self._task = asyncio.get_running_loop().create_task(self._read())

    def data_received(self, data: bytes) -> None:  # the client wrote: to the socket
        if self.record is not None:
            self.record.append(bytes(data))
        if not self.writer.is_closing():
            self.writer.write(data)

    def connection_lost(self, _exc) -> None:
        self.close()

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                self.sock.buffer += data
        except (ConnectionError, OSError):
            pass
        self.sock.closed = True  # the broker closed its end


async def tcp_client(
    port: int,
    *,
    record: list[bytes] | None = None,
) -> ProtocolClient:
    """An open (SASL, open, begin) client connection to busd on 127.0.0.1:`port`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    bridge = TcpBridge(reader, writer, record)
    client = ProtocolClient(bridge, peer=("127.0.0.1", port))
    await client.open()
    return client


def drop(client: ProtocolClient) -> None:
    """Let go of the socket at once, without a close frame (a client that just vanishes)."""
    client.proto.close()
