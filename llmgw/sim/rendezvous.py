"""The ranks' rendezvous: a line protocol over TCP, like a tiny process group.

A worker connects to rank 0's dist-init port (retrying until rank 0 is up) and
sends `HELLO <rank> <world_size>`; rank 0 answers `OK` or `ERR <why>`. Rank 0
is complete when all world_size-1 workers have joined. Afterwards both sides
send `PING` every few seconds; a connection that closes, or goes silent for
PEER_TIMEOUT, is a dropped peer. `BYE` announces a graceful stop: a worker
that says BYE asks the replica to stop; rank 0 says BYE to every worker
before it exits cleanly.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

HEARTBEAT = 2.0
PEER_TIMEOUT = 20.0
HELLO_TIMEOUT = 10.0
RETRY_INTERVAL = 0.2

OnEvent = Callable[[str], None]


class RendezvousError(Exception):
    """Rank 0 refused this worker (wrong world size, duplicate rank...)."""


async def _send(writer: asyncio.StreamWriter, line: str) -> None:
    writer.write(line.encode() + b"\n")
    await writer.drain()


async def _heartbeat(writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await asyncio.sleep(HEARTBEAT)
            await _send(writer, "PING")
    except (ConnectionError, RuntimeError):
        pass  # the reader side notices the drop


async def _watch(reader: asyncio.StreamReader) -> str:
    """Read until the peer says BYE ('bye'), closes ('closed') or goes silent ('silent')."""
    while True:
        try:
            line = await asyncio.wait_for(reader.readline(), PEER_TIMEOUT)
        except asyncio.TimeoutError:
            return "silent"
        except ConnectionError:
            return "closed"
        if not line:
            return "closed"
        if line.strip() == b"BYE":
            return "bye"


class Head:
    """Rank 0's side: accepts workers, reports a drop (on_drop) or a worker's BYE (on_leave)."""

    def __init__(self, host: str, port: int, world_size: int, on_drop: OnEvent, on_leave: OnEvent):
        self.host, self.port, self.world_size = host, port, world_size
        self.on_drop, self.on_leave = on_drop, on_leave
        self.workers: dict[int, asyncio.StreamWriter] = {}
        self.complete = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        if world_size == 1:
            self.complete.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = (await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT)).decode(errors="replace").split()
        except (asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        problem = self._check(hello)
        if problem:
            writer.write(f"ERR {problem}\n".encode())
            writer.close()
            return
        rank = int(hello[1])
        self.workers[rank] = writer
        await _send(writer, "OK")
        if len(self.workers) == self.world_size - 1:
            self.complete.set()
        beat = asyncio.create_task(_heartbeat(writer))
        self._tasks.add(beat)
        how = await _watch(reader)
        beat.cancel()
        if self._closing:
            return
        if how == "bye":
            self.on_leave(f"worker rank {rank} is stopping")
        else:
            self.on_drop(f"worker rank {rank} dropped (connection {how})")

    def _check(self, hello: list[str]) -> str | None:
        if len(hello) != 3 or hello[0] != "HELLO" or not hello[1].isdigit() or not hello[2].isdigit():
            return f"expected 'HELLO <rank> <world_size>', got {' '.join(hello)!r}"
        rank, world = int(hello[1]), int(hello[2])
        if world != self.world_size:
            return f"world size {world} differs from rank 0's {self.world_size}"
        if not 1 <= rank < self.world_size:
            return f"rank {rank} is not a worker rank of a world of {self.world_size}"
        if rank in self.workers:
            return f"rank {rank} has already joined"
        return None

    async def close(self) -> None:
        """Graceful: tell every worker BYE, stop listening."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for writer in self.workers.values():
            try:
                await _send(writer, "BYE")
                writer.close()
            except (ConnectionError, RuntimeError):
                pass
        for task in self._tasks:
            task.cancel()


class Worker:
    """A worker's side: join rank 0, then watch it."""

    def __init__(self, head_host: str, port: int, rank: int, world_size: int):
        self.head_host, self.port, self.rank, self.world_size = head_host, port, rank, world_size
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._beat: asyncio.Task[None] | None = None

    async def join(self) -> None:
        """Connect (retrying while rank 0 is not up yet) and be accepted; RendezvousError if refused."""
        while True:
            try:
                self._reader, self._writer = await asyncio.open_connection(self.head_host, self.port)
                break
            except OSError:
                await asyncio.sleep(RETRY_INTERVAL)
        await _send(self._writer, f"HELLO {self.rank} {self.world_size}")
        try:
            answer = (await asyncio.wait_for(self._reader.readline(), HELLO_TIMEOUT)).decode(errors="replace").strip()
        except (asyncio.TimeoutError, ConnectionError):
            answer = ""
        if answer != "OK":
            reason = answer[4:] if answer.startswith("ERR ") else f"no answer to HELLO (got {answer!r})"
            raise RendezvousError(f"rank 0 at {self.head_host}:{self.port} refused rank {self.rank}: {reason}")
        self._beat = asyncio.create_task(_heartbeat(self._writer))

    async def watch(self) -> str:
        """Until rank 0 says BYE ('bye'), or drops ('closed' / 'silent')."""
        assert self._reader is not None
        how = await _watch(self._reader)
        if self._beat:
            self._beat.cancel()
        return how

    async def leave(self) -> None:
        """Announce a graceful stop to rank 0."""
        if self._writer is not None:
            try:
                await _send(self._writer, "BYE")
            except (ConnectionError, RuntimeError):
                pass
