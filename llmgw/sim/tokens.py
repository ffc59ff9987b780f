"""Fake tokens: producing completion tokens, pacing them (a prompt's tokens: llmgw.routing.kvblocks)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
         "sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et")
TOKENS = tuple(" " + w for w in WORDS)


def token(i: int) -> str:
    return TOKENS[i % len(TOKENS)]


def text(n: int) -> str:
    return "".join(token(i) for i in range(n))


class Pacer:
    """When each of a request's tokens is due: first after ttft, then one per 1/rate seconds."""

    def __init__(self, ttft_ms: float, tokens_per_second: float):
        self.ttft = ttft_ms / 1000.0
        self.interval = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0

    @property
    def instant(self) -> bool:
        return self.ttft == 0 and self.interval == 0

    def total(self, n: int) -> float:
        return self.ttft + max(0, n - 1) * self.interval if n else 0.0

    async def wait_all(self, n: int) -> None:
        delay = self.total(n)
        if delay > 0:
            await asyncio.sleep(delay)

    async def ticks(self, n: int) -> AsyncGenerator[int, None]:
        """Yields 0..n-1, each when its token is due (on an absolute schedule: no drift)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(n):
            due = start + self.ttft + i * self.interval
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            yield i
