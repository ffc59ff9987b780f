"""The publisher vLLM runs with --kv-events-config, for the sim: PUB for batches, ROUTER for replays.

The configuration is vLLM's KVEventsConfig as JSON: enable_kv_cache_events,
publisher ("zmq" or "null"), endpoint (default tcp://*:5557), replay_endpoint,
buffer_steps (batches kept for replay, 10000), hwm (100000), max_queue_size and
topic (""). An endpoint with "*" or "::", or an ipc:// or inproc:// one, is bound;
any other is connected to, as vLLM does.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from llmgw.kvevents.wire import END_SEQ, encode_batch, seq_bytes


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = ""
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"


def parse_config(text: str) -> KVEventsConfig:
    """--kv-events-config's JSON; ValueError saying what is wrong."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    fields = KVEventsConfig.__dataclass_fields__
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}: one of {', '.join(fields)}")
    cfg = KVEventsConfig(**raw)
    if cfg.publisher not in ("", "zmq", "null"):
        raise ValueError(f"publisher {cfg.publisher!r}: one of zmq, null")
    return cfg


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class Publisher:
    """Numbered batches on a PUB socket, the last `buffer_steps` of them replayed on request."""

    def __init__(self, cfg: KVEventsConfig):
        self.cfg = cfg
        # a plain socket: the sim's cache publishes from synchronous code
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        if _binds(cfg.endpoint):
            self._pub.bind(cfg.endpoint)
        else:
            self._pub.connect(cfg.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if cfg.replay_endpoint:
            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.bind(cfg.replay_endpoint)
        self._topic = cfg.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve replays (in the running loop)."""
        if self._replay is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    def publish(self, events: list[dict[str, Any]]) -> None:
        payload = encode_batch(events)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        # PUB never blocks: past the high-water mark ZeroMQ drops, and the subscriber replays the gap
        self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)

    async def _serve_replays(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                continue  # not [identity, b"", start]: vLLM ignores it too
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await sock.send_multipart((client, b"", seq_bytes(seq), payload))
            await sock.send_multipart((client, b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
