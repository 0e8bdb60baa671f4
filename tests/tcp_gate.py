"""A TCP gate on loopback for outage tests: it forwards each connection to a target port while
open; `close()` stops listening (new connections are refused, as by a server that is down) and
cuts the connections open through it; `open()` listens again on the same port. The processes
under test are pointed at the gate instead of the server (e.g. the S3 store's endpoint at a gate
in front of moto's server, which keeps its objects through the outage)."""

from __future__ import annotations

import asyncio
import contextlib

from tools.dev.procs import free_port

HOST = "127.0.0.1"


class TcpGate:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def open(self) -> TcpGate:
        self._server = await asyncio.start_server(self._serve, HOST, self.port, reuse_address=True)
        return self

    async def close(self) -> None:
        """Down: refuse new connections and cut the open ones."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}
            for w in (writer, up_writer):
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
