"""A switchable TCP forwarder: a stand-in for a load balancer that moves a device between bridge
replicas (tests/integration/test_replica_moves.py; ``benchmarks.replicas.proxy`` re-exports it).

``switch(port)`` points new connections at another backend and cuts every open one (both sides
closed at once, as a balancer does when it takes a server out), so the edge reconnects and lands
on the new replica with whatever resume token and ``delivered_seq`` it had.
``half_open()`` instead stops forwarding without closing the backend side: the old replica keeps
a connection that looks alive (what a dead NAT or a pulled cable leaves behind).
"""

from __future__ import annotations

import asyncio
import contextlib


class _Link:
    """One forwarded connection: the edge's side and the backend's."""

    def __init__(self, client: asyncio.StreamWriter, backend: asyncio.StreamWriter) -> None:
        self.client = client
        self.backend = backend
        self.held = False  # half-open: the backend side is left as it is

    def abort(self, *, backend: bool = True) -> None:
        self.held = not backend
        sides = (self.client, self.backend) if backend else (self.client,)
        for writer in sides:
            with contextlib.suppress(Exception):
                writer.transport.abort()


class SwitchProxy:
    def __init__(self, backend_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.backend_port = backend_port
        self.port = 0
        self.connections = 0  # accepted so far
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._links: list[_Link] = []
        self._held: list[_Link] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for link in self._held:
            link.abort()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def __aenter__(self) -> SwitchProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def switch(self, backend_port: int) -> None:
        """New connections go to ``backend_port``; open ones are closed on both sides."""
        self.backend_port = backend_port
        self.cut()

    def cut(self) -> None:
        for link in self._links:
            link.abort()
        self._links.clear()

    def half_open(self, backend_port: int) -> None:
        """New connections go to ``backend_port``; open ones lose their edge side only: the
        backend sees nothing (no FIN, no RST) and what it sends goes nowhere."""
        self.backend_port = backend_port
        for link in self._links:
            link.abort(backend=False)
        self._held += self._links
        self._links = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.backend_port)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.append(link)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pipe(src, dst, link))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link) -> None:
    try:
        while data := await src.read(65536):
            if link.held:
                return  # nothing read any more: the backend's sends pile up unacknowledged
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if not link.held:
            with contextlib.suppress(Exception):
                dst.close()
