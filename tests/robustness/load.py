"""A steady request load through the gateway; every request's outcome and time go into the History."""
from __future__ import annotations

import asyncio
import time

import aiohttp

from llmgw.gateway.proxy import REPLICA_HEADER
from tests.robustness.history import History, Request


class Load:
    """`concurrency` clients, each sending chat completions one after another (a short pause between)."""

    def __init__(self, url: str, models: list[str], history: History, concurrency: int = 3, pause: float = 0.05):
        self.url, self.models, self.history = url, models, history
        self.concurrency, self.pause = concurrency, pause
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _client(self, i: int, session: aiohttp.ClientSession) -> None:
        n = 0
        while not self._stop.is_set():
            model = self.models[(i + n) % len(self.models)]
            n += 1
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            start = time.monotonic()
            try:
                async with session.post(f"{self.url}/v1/chat/completions", json=body) as r:
                    text = await r.text()
                    ok, detail = r.status == 200, "" if r.status == 200 else f"{r.status} {text[:160]}"
                    replica = r.headers.get(REPLICA_HEADER, "")
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                ok, detail, replica = False, repr(err)[:160], ""
            self.history.requests.append(Request(start, time.monotonic(), model, ok, detail, replica))
            await asyncio.sleep(self.pause)

    async def __aenter__(self) -> "Load":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._tasks = [asyncio.create_task(self._client(i, self._session)) for i in range(self.concurrency)]
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    def ok_since(self, t: float) -> int:
        return sum(1 for r in self.history.requests if r.ok and r.start >= t)
