"""Following one engine's KV events: a SUB socket, sequence numbers checked, gaps replayed.

Batches are numbered from 0 in each engine process. A batch numbered past the
next one expected (a subscriber that joined late, or ZeroMQ dropped some at the
high-water mark) asks the replay endpoint (DEALER to the engine's ROUTER) for
the missing ones first; where there is no replay endpoint, or its buffer no
longer reaches back, the replica's entries are dropped (they may hold blocks
since evicted) and rebuilt from the events that follow. A batch numbered below
the one expected means the engine restarted: its entries are dropped too.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from llmgw.kvevents.wire import END_SEQ, Event, decode_batch, seq_bytes

log = logging.getLogger("llmgw.kvevents")

REPLAY_TIMEOUT = 2.0  # seconds a replay may take before the gap counts as lost


class Subscription:
    """A task that feeds one replica's events to `apply(replica, events)`; `drop(replica)` forgets it."""

    def __init__(self, replica: str, endpoint: str, replay: str | None, topic: str,
                 apply: Callable[[str, list[Event]], None], drop: Callable[[str], None]):
        self.replica, self.endpoint, self.replay, self.topic = replica, endpoint, replay, topic
        self._apply, self._drop = apply, drop
        self.expected: int | None = None  # the next sequence number; None before the first batch
        self.replayed = 0  # batches got from the replay endpoint
        self.lost = 0  # gaps that could not be replayed
        self.lag = 0.0  # seconds from the last batch's publication to its arrival here (clocks apart)
        self._ctx = zmq.asyncio.Context.instance()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-events {self.replica}")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                await self.receive(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            sub.close(linger=0)

    async def receive(self, seq: int, payload: bytes) -> None:
        """One batch off the wire (in order of arrival)."""
        expected = self.expected
        if expected is not None and seq < expected:
            log.info("replica %s: KV event sequence went back from %d to %d: its engine restarted",
                     self.replica, expected - 1, seq)
            self._drop(self.replica)
            expected = None
        start = 0 if expected is None else expected
        if seq > start:
            await self._fill(start, seq)
        self._feed(payload)
        self.expected = seq + 1

    async def _fill(self, start: int, end: int) -> None:
        """Batches start..end-1 from the replay endpoint; else the replica's entries are dropped."""
        got = await self._replay(start) if self.replay else []
        wanted = [(s, p) for s, p in got if start <= s < end]
        if [s for s, _ in wanted] != list(range(start, end)):
            self.lost += 1
            log.warning("replica %s: KV event batches %d-%d are lost (replay %s); its entries are dropped "
                        "and rebuilt from the events that follow", self.replica, start, end - 1,
                        self.replay or "not offered")
            self._drop(self.replica)
            return
        for _, payload in wanted:
            self._feed(payload)
        self.replayed += len(wanted)

    async def _replay(self, start: int) -> list[tuple[int, bytes]]:
        assert self.replay is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.connect(self.replay)
        out = []
        try:
            await sock.send_multipart((b"", seq_bytes(start)))
            async with asyncio.timeout(REPLAY_TIMEOUT):
                while True:
                    frames = await sock.recv_multipart()
                    # [b"", seq, batch], or with the topic ahead of seq (some vLLM versions)
                    if len(frames) < 3 or frames[-2] == END_SEQ:
                        break
                    out.append((int.from_bytes(frames[-2], "big"), frames[-1]))
        except TimeoutError:
            pass
        finally:
            sock.close(linger=0)
        return out

    def _feed(self, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except ValueError as e:
            log.warning("replica %s: a KV event batch is not vLLM's: %s", self.replica, e)
            return
        self.lag = max(0.0, time.time() - batch.ts)
        self._apply(self.replica, batch.events)
