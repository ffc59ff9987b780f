"""A steady request load through the gateway; every request's outcome and time go into the History."""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import aiohttp

from llmgw.gateway.proxy import REPLICA_HEADER
from tests.robustness.history import History, Request


class Load:
    """`concurrency` clients, each sending chat completions one after another (a short pause
    between), and `streams` more whose completions are streamed, `stream_tokens` tokens long: a
    stream is ok only if every event parses and it ends with `[DONE]` after a finish reason."""

    def __init__(self, url: str, models: list[str], history: History, concurrency: int = 3, pause: float = 0.05,
                 streams: int = 0, stream_tokens: int = 300, key: str | None = None):
        self.url, self.models, self.history = url, models, history
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}   # an API key's secret
        self.concurrency, self.pause = concurrency, pause
        self.streams, self.stream_tokens = streams, stream_tokens
        self.streaming: Counter[str] = Counter()   # replica -> streams open on it now (their response started)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _client(self, i: int, session: aiohttp.ClientSession, stream: bool) -> None:
        n = 0
        while not self._stop.is_set():
            model = self.models[(i + n) % len(self.models)]
            n += 1
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": self.stream_tokens if stream else 4, "stream": stream}
            start, first = time.monotonic(), 0.0
            try:
                async with session.post(f"{self.url}/v1/chat/completions", json=body, headers=self.headers) as r:
                    first = time.monotonic()
                    replica = r.headers.get(REPLICA_HEADER, "")
                    if r.status != 200:
                        ok, detail = False, f"{r.status} {(await r.text())[:160]}"
                    elif stream:
                        self.streaming[replica] += 1
                        try:
                            ok, detail = await _read_stream(r)
                        finally:
                            self.streaming[replica] -= 1
                    else:
                        await r.read()
                        ok, detail = True, ""
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                ok, detail, replica = False, repr(err)[:160], ""
            self.history.requests.append(Request(start, time.monotonic(), model, ok, detail, replica, first, stream))
            await asyncio.sleep(self.pause)

    async def __aenter__(self) -> "Load":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._tasks = [asyncio.create_task(self._client(i, self._session, i >= self.concurrency))
                       for i in range(self.concurrency + self.streams)]
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    def ok_since(self, t: float) -> int:
        return sum(1 for r in self.history.requests if r.ok and r.start >= t)


async def _read_stream(r: aiohttp.ClientResponse) -> tuple[bool, str]:
    """(ok, what went wrong) of a server-sent event stream of chat completion chunks."""
    finished = done = False
    async for raw in r.content:
        line = raw.strip()
        if not line:
            continue
        if done:
            return False, f"data after [DONE]: {line[:80]!r}"
        if line == b"data: [DONE]":
            done = True
            continue
        try:
            event = json.loads(line.removeprefix(b"data: "))
        except ValueError:
            return False, f"not an event: {line[:120]!r}"
        if "error" in event:
            return False, f"error event: {str(event['error'])[:140]}"
        finished = finished or any(c.get("finish_reason") for c in event.get("choices", []))
    if not (finished and done):
        return False, f"stream ended early (finish reason: {finished}, [DONE]: {done})"
    return True, ""
