"""One sim rank's life: rendezvous, serve (rank 0) or wait (workers), stop.

Exit status: 0 after a graceful stop (SIGTERM, or a peer's BYE); 1 when a
peer drops (every rank goes down with it); 2 when rank 0 refuses this worker
or a port cannot be bound; 3 for an injected failure (--fail-after,
--crash-on-request).
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable
from typing import Any

import zmq

from llmgw.sim.config import SimConfig
from llmgw.sim.rendezvous import Head, RendezvousError, Worker

EXIT_OK, EXIT_PEER_DROPPED, EXIT_SETUP, EXIT_INJECTED = 0, 1, 2, 3


class Rank:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.stop_requested = asyncio.Event()
        self.stop_reason = ""

    def log(self, message: str) -> None:
        print(f"sim rank {self.cfg.rank}/{self.cfg.world_size}: {message}", file=sys.stderr, flush=True)

    def abort(self, code: int, message: str) -> None:
        """Die at once, as a crashed engine would: connections drop, nothing is drained."""
        self.log(message)
        os._exit(code)

    def request_stop(self, reason: str) -> None:
        if not self.stop_requested.is_set():
            self.stop_reason = reason
            self.log(f"stopping: {reason}")
            self.stop_requested.set()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, f"received {signal.Signals(sig).name}")
        if self.cfg.fail_after is not None:
            loop.call_later(self.cfg.fail_after, self.abort, EXIT_INJECTED,
                            f"injected failure after {self.cfg.fail_after:g} s")

    async def until_stop(self, awaitable: Awaitable[Any]) -> bool:
        """Await `awaitable` unless a stop comes first; True when it completed."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        return False


async def run(cfg: SimConfig) -> int:
    rank = Rank(cfg)
    rank.install()
    if cfg.rank == 0:
        return await _run_head(rank)
    return await _run_worker(rank)


async def _run_head(rank: Rank) -> int:
    cfg = rank.cfg
    head = Head(cfg.host, cfg.dist_port, cfg.world_size,
                on_drop=lambda why: rank.abort(EXIT_PEER_DROPPED, why),
                on_leave=rank.request_stop)
    if cfg.world_size > 1:
        try:
            await head.start()
        except OSError as e:
            rank.log(f"cannot bind the dist-init port {cfg.host}:{cfg.dist_port}: {e}")
            return EXIT_SETUP
        rank.log(f"waiting for {cfg.world_size - 1} worker(s) on {cfg.host}:{cfg.dist_port}")
        if not await rank.until_stop(head.complete.wait()):
            await head.close()
            return EXIT_OK
        rank.log(f"all {cfg.world_size} ranks joined")

    from llmgw.sim.api import SimApi  # aiohttp: only on the rank that serves
    try:
        api = SimApi(cfg, crash=lambda why: rank.abort(EXIT_INJECTED, why))
    except zmq.ZMQError as e:
        rank.log(f"cannot publish KV events on {cfg.kv_events.endpoint} / {cfg.kv_events.replay_endpoint}: {e}")
        await head.close()
        return EXIT_SETUP
    try:
        await api.start()
    except OSError as e:
        rank.log(f"cannot bind the serve port {cfg.host}:{cfg.port}: {e}")
        await head.close()
        return EXIT_SETUP
    rank.log(f"serving {', '.join(cfg.served_model_names)} on http://{cfg.host}:{cfg.port} "
             f"(ready in {cfg.load_seconds:g} s)")
    await rank.stop_requested.wait()
    rank.log(f"draining {api.running} in-flight request(s), at most {cfg.drain_grace:g} s")
    await api.drain()
    await head.close()
    rank.log("stopped")
    return EXIT_OK


async def _run_worker(rank: Rank) -> int:
    cfg = rank.cfg
    worker = Worker(cfg.head_host, cfg.dist_port, cfg.rank, cfg.world_size)
    rank.log(f"joining rank 0 at {cfg.head_host}:{cfg.dist_port}")
    try:
        if not await rank.until_stop(worker.join()):
            return EXIT_OK
    except RendezvousError as e:
        rank.log(str(e))
        return EXIT_SETUP
    rank.log("joined")
    watch = asyncio.ensure_future(worker.watch())
    stop = asyncio.ensure_future(rank.stop_requested.wait())
    await asyncio.wait({watch, stop}, return_when=asyncio.FIRST_COMPLETED)
    if watch.done():
        stop.cancel()
        how = watch.result()
        if how == "bye":
            rank.log("rank 0 stopped gracefully")
            return EXIT_OK
        rank.abort(EXIT_PEER_DROPPED, f"rank 0 dropped (connection {how})")
    # Our own stop: tell rank 0, which drains and says BYE; do not wait past its grace.
    await worker.leave()
    try:
        await asyncio.wait_for(watch, cfg.drain_grace + 5)
    except asyncio.TimeoutError:
        rank.log("rank 0 did not finish its drain in time")
    rank.log("stopped")
    return EXIT_OK
