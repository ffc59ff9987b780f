"""The one retry policy: jittered exponential backoff, for every loop that waits after a failure.

The n-th wait in a row is ``initial * 2**(n-1)``, capped at ``maximum``, less a random
part of up to ``jitter`` of it (by default, anywhere in its upper half). The jitter is
what the policy is for: when etcd or the server goes away, every informer, watch and
work-queue key fails at the same moment, and un-jittered they would all come back in
step, a herd at each doubling; spread, the first to return find a server that answers.

``ExponentialJitter`` is a tenacity wait strategy (``AsyncRetrying(wait=...)`` takes
it); ``Backoff`` counts the failures of one hand-written loop::

    backoff = Backoff(0.1, 10.0)
    while True:
        try:
            await work()
        except Unavailable:
            await backoff.sleep()
            continue
        backoff.reset()

(docs/architecture.md, "Reflectors and retries").
"""
from __future__ import annotations

import asyncio
import random

from tenacity import RetryCallState, Retrying
from tenacity.wait import wait_exponential


class ExponentialJitter(wait_exponential):
    """tenacity's exponential wait (``initial`` doubling to ``maximum``), less up to ``jitter`` of it at random."""

    def __init__(self, initial: float, maximum: float, jitter: float = 0.5) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, not {initial} and {maximum}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter is a fraction of the wait in [0, 1), not {jitter}")
        super().__init__(multiplier=initial, max=maximum)
        self.jitter = jitter

    def __call__(self, retry_state: RetryCallState) -> float:
        return float(super().__call__(retry_state)) * (1.0 - self.jitter * random.random())


class Backoff:
    """The waits of one retry loop: ``next()`` (or ``await sleep()``) after each failure in a
    row, ``reset()`` after a success."""

    def __init__(self, initial: float, maximum: float, jitter: float = 0.5) -> None:
        self.wait = ExponentialJitter(initial, maximum, jitter)
        self._state = _fresh()

    @property
    def failures(self) -> int:
        """How many waits were handed out since the last reset."""
        return self._state.attempt_number - 1

    def next(self) -> float:
        """The wait after one more failure."""
        delay = self.wait(self._state)
        self._state.prepare_for_next_attempt()
        return delay

    async def sleep(self) -> float:
        delay = self.next()
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        if self._state.attempt_number != 1:
            self._state = _fresh()


def _fresh() -> RetryCallState:
    return RetryCallState(Retrying(), None, (), {})
