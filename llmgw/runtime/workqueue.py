"""An asyncio work queue of string keys, with the guarantees controllers rely on.

* ``add(key)`` dedups: a key waiting in the queue is queued once.
* A key handed out by ``get()`` is *processing* until ``done(key)``; it is never
  handed out again meanwhile.  Adding it while it is processing marks it dirty
  and it is queued again by ``done(key)``.
* ``add_rate_limited(key)`` re-adds after a per-key backoff (llmgw.backoff's
  jittered exponential, ``base`` doubling to ``cap``: 5 ms .. 5 min); ``forget(key)``
  resets it. Jittered, unlike client-go's per-item limiter: when the store goes
  away every key fails at once, and their retries should not arrive in step.
* ``add_after(key, delay)``: the earliest pending delay for a key wins.
* ``shutdown()`` wakes every ``get()``, which then returns None.

A queue counts into its ``QueueStats``: keys added (not those deduped), retries
(``add_rate_limited``) and each key's wait from being queued to being handed out.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

from llmgw.backoff import Backoff


class QueueStats:
    """What a controller's queues count. Its manager keeps one per controller across
    leadership terms (each term has new queues), so the counts only grow."""

    __slots__ = ("adds", "retries", "observe_wait")

    def __init__(self, observe_wait: Callable[[float], None] | None = None) -> None:
        self.adds = 0
        self.retries = 0
        self.observe_wait = observe_wait or (lambda _seconds: None)


class WorkQueue:
    def __init__(self, *, base_delay: float = 0.005, max_delay: float = 300.0,
                 stats: QueueStats | None = None):
        self.stats = stats if stats is not None else QueueStats()
        self._queue: deque[str] = deque()
        self._queued_at: dict[str, float] = {}  # key -> when it was queued (time.monotonic)
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, Backoff] = {}
        self._delayed: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._base = base_delay
        self._max = max_delay
        self._shutdown = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def add(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        self.stats.adds += 1
        if key in self._processing:
            return
        self._enqueue(key)

    async def get(self) -> str | None:
        while not self._queue:
            if self._shutdown:
                return None
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        key = self._queue.popleft()
        self.stats.observe_wait(time.monotonic() - self._queued_at.pop(key))
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._shutdown:
            self._enqueue(key)

    def _enqueue(self, key: str) -> None:
        self._queued_at[key] = time.monotonic()
        self._queue.append(key)
        self._wake()

    def add_after(self, key: str, delay: float) -> None:
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._delayed.get(key)
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()
        self._delayed[key] = (when, loop.call_at(when, self._fire, key))

    def _fire(self, key: str) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> float:
        """Add ``key`` after its backoff, which grows with each call until ``forget(key)``; returns the delay."""
        backoff = self._failures.get(key)
        if backoff is None:
            backoff = self._failures[key] = Backoff(self._base, self._max)
        delay = backoff.next()
        self.stats.retries += 1
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def num_requeues(self, key: str) -> int:
        backoff = self._failures.get(key)
        return backoff.failures if backoff is not None else 0

    def shutdown(self) -> None:
        self._shutdown = True
        for _, handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
