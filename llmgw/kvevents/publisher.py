"""The publisher vLLM runs with --kv-events-config, for the sim: PUB for batches, ROUTER for replays.

The configuration is vLLM's KVEventsConfig as JSON: enable_kv_cache_events,
publisher ("zmq" or "null"), endpoint (default tcp://*:5557), replay_endpoint,
buffer_steps (batches kept for replay, 10000), hwm (100000), max_queue_size and
topic (""). An endpoint with "*" or "::", or an ipc:// or inproc:// one, is bound;
any other is connected to, as vLLM does. SGLang's (parse_config(sglang=True)) has no
enable field: its publisher "zmq" turns events on (its default is "null").
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from llmgw.kvevents.wire import END_SEQ, encode_batch, seq_bytes

Encoder = Callable[[list[dict[str, Any]]], bytes]


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


def parse_config(text: str, sglang: bool = False) -> KVEventsConfig:
    """--kv-events-config's JSON (vLLM's, or SGLang's); ValueError saying what is wrong."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    fields = {f: None for f in KVEventsConfig.__dataclass_fields__ if not sglang or f != "enable_kv_cache_events"}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}: one of {', '.join(fields)}")
    if sglang:
        raw["enable_kv_cache_events"] = raw.get("publisher") == "zmq"
    cfg = KVEventsConfig(**raw)
    if cfg.publisher not in ("", "zmq", "null"):
        raise ValueError(f"publisher {cfg.publisher!r}: one of zmq, null")
    return cfg


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _on(endpoint: str, host: str) -> str:
    """A `tcp://*:PORT` endpoint bound on `host` (an IPv4 address or a name) instead of every address."""
    return endpoint.replace("tcp://*:", f"tcp://{host}:", 1) if host and ":" not in host else endpoint


class Publisher:
    """Numbered batches on a PUB socket, the last `buffer_steps` of them replayed on request."""

    def __init__(self, cfg: KVEventsConfig, host: str = "", encode: Encoder = encode_batch,
                 replay_topic: bool = False):
        """`host`: where a `*` endpoint binds (the sim's --host: a dev cluster's nodes share one
        machine, each on an address of its own, as the sim's other listeners are); empty: every
        address, as vLLM binds. `encode`: a batch's payload (vLLM's layout by default);
        `replay_topic`: a replayed batch is preceded by the topic, as SGLang's are."""
        self.cfg = cfg
        self._encode = encode
        self._replay_topic = (self.cfg.topic.encode(),) if replay_topic else ()
        # a plain socket: the sim's cache publishes from synchronous code
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        if _binds(cfg.endpoint):
            self._pub.bind(_on(cfg.endpoint, host))
        else:
            self._pub.connect(cfg.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if cfg.replay_endpoint:
            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.bind(_on(cfg.replay_endpoint, host))
        self._topic = cfg.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve replays (in the running loop)."""
        if self._replay is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    def publish(self, events: list[dict[str, Any]]) -> None:
        payload = self._encode(events)
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
                    await sock.send_multipart((client, b"", *self._replay_topic, seq_bytes(seq), payload))
            await sock.send_multipart((client, b"", *(b"" for _ in self._replay_topic), END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
