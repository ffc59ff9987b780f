"""The sim engine's step model: a scheduler like vLLM's, with time spent in sleeps, not CPU.

Requests wait in a queue until one of --max-num-seqs running slots is free. The
engine runs in steps: each step admits waiting requests (their prompt is looked
up in the prefix cache), prefills their uncached tokens and decodes one token of
every running request. A step lasts prefill_ms * (uncached prompt tokens
admitted) + decode_ms * (requests decoding); every running request gets one
token at its end (an admitted one its first). The simulated GPU time dominates
whatever the machine's CPU does, so routing can be compared on a busy machine.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Sequence

from llmgw.sim.kvcache import PrefixCache


class Seq:
    """One request in the scheduler: its prompt, how many tokens it wants, what it got."""

    __slots__ = ("tokens", "n", "lora", "salt", "cached", "emitted", "gone", "ready")

    def __init__(self, tokens: Sequence[int], n: int, lora: tuple[str, int] | None = None,
                 salt: str | None = None) -> None:
        self.tokens, self.n = tokens, n
        self.lora = lora  # the LoRA adapter it runs under, its name and load id (kvcache.py)
        self.salt = salt  # its cache_salt (kvcache.py)
        self.cached = 0  # prompt tokens found in the prefix cache, once admitted
        self.emitted = 0
        self.gone = False  # the client left: drop it at the next step
        self.ready = asyncio.Event()  # set when a step gave it tokens

    @property
    def context(self) -> int:
        return len(self.tokens) + self.emitted


class Scheduler:
    def __init__(self, cache: PrefixCache, prefill_ms: float, decode_ms: float, max_num_seqs: int):
        self.cache = cache
        self.prefill = prefill_ms / 1000.0
        self.decode = decode_ms / 1000.0
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    @property
    def context_tokens(self) -> int:
        """Tokens held by the running requests (what their KV cache takes)."""
        return sum(s.context for s in self.running)

    async def generate(self, seq: Seq) -> AsyncGenerator[int, None]:
        """Yields 0..seq.n-1, each when the step that makes that token ends."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._run())
        self.waiting.append(seq)
        self._wake.set()
        try:
            i = 0
            while i < seq.n:
                await seq.ready.wait()
                seq.ready.clear()
                while i < seq.emitted:
                    yield i
                    i += 1
        finally:
            seq.gone = True

    async def _run(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            prefill = 0
            running = [s for s in self.running if not s.gone]
            decoding = len(running)
            while self.waiting and len(running) < self.max_num_seqs:
                seq = self.waiting.popleft()
                if seq.gone:
                    continue
                seq.cached = self.cache.admit(seq.tokens, seq.lora, seq.salt)
                prefill += len(seq.tokens) - seq.cached
                running.append(seq)
            self.running = running
            step = self.prefill * prefill + self.decode * decoding
            await asyncio.sleep(step)
            still = []
            for seq in self.running:
                if seq.gone:
                    continue
                seq.emitted += 1
                seq.ready.set()
                if seq.emitted < seq.n:
                    still.append(seq)
            self.running = still
