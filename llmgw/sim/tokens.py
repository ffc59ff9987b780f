"""Fake tokens: counting a prompt's tokens, producing completion tokens, pacing them."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
         "sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et")
TOKENS = tuple(" " + w for w in WORDS)

Token = str | int  # a prompt's word, or a token id a client sent


def token(i: int) -> str:
    return TOKENS[i % len(TOKENS)]


def text(n: int) -> str:
    return "".join(token(i) for i in range(n))


def text_tokens(value: object) -> Sequence[Token]:
    """A prompt's tokens, without a tokenizer: the words of a string (whitespace-separated; a
    string without any is one empty token), the items of a token-id list, those of each prompt
    of a list of prompts one after the other. The same prompt always gives the same tokens."""
    if isinstance(value, str):
        return value.split() or [""]
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return value
        return [t for v in value for t in text_tokens(v)]
    return []


def message_tokens(messages: Sequence[object]) -> Sequence[Token]:
    """A chat's tokens: those of each message's text content in order (roles are not tokens)."""
    out: list[Token] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = [part.get("text", "") for part in content if isinstance(part, dict)]
        if content:
            out += text_tokens(content)
    return out or [""]


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
