"""Each model's wait queue at the gateway: requests held for a replica, sent in order, bounded.

A request waits here when its model has no Ready replica (scaled to zero, or between the last
replica leaving and the next arriving) or is at its concurrency limit at this gateway, or when
others are already waiting for it (no request overtakes the queue). It leaves the queue:

- sent, when the gateway says there is room (`room(model)`: a Ready replica, and requests in
  flight under the limit): the best priority class first (critical, standard, sheddable), in
  arrival order within a class;
- refused at once, when `size` requests already wait for the model; except that a request of a
  better class takes the place of the latest arrival of the worst class waiting, which is
  refused instead (shed), so under overload sheddable traffic goes first;
- refused after `timeout` seconds of waiting.

A refusal says why, and whether the model had a replica (then it was the concurrency limit:
429) or not (503); the gateway answers with Retry-After (errors.py).

Requests waiting for the gateway's first view of the routing table (right after a restart) wait
in `synced()` instead, bounded by the same timeout: a model the table has not heard of yet is
not known to be unknown.
"""
from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

PRIORITY_CLASSES = ("critical", "standard", "sheddable")   # best first
DEFAULT_PRIORITY = "standard"
_RANK = {name: rank for rank, name in enumerate(PRIORITY_CLASSES)}
UNLIMITED = sys.maxsize


class Why(Enum):
    FULL = "full"          # the queue held `size` requests, none of a worse class
    SHED = "shed"          # a request of a better class took this one's place
    TIMEOUT = "timeout"    # no room within `timeout` seconds
    LEFT = "left"          # the caller hung up while it waited


@dataclass(frozen=True)
class Refusal:
    why: Why
    limited: bool          # the model had a replica: its concurrency limit held the request back
    waited: float          # seconds in the queue


_GO = None   # a waiter's result when it may be sent


class _Waiter:
    __slots__ = ("fut", "rank", "timer")

    def __init__(self, fut: asyncio.Future[Why | None], rank: int) -> None:
        self.fut, self.rank = fut, rank
        self.timer: asyncio.TimerHandle | None = None


class _ModelQueue:
    """One model's waiters: a deque per priority class. Waiters that timed out or whose caller left
    stay in their deque, done, until a pop passes them; `count` holds only the live ones."""

    __slots__ = ("classes", "count", "granted")

    def __init__(self) -> None:
        self.classes: tuple[deque[_Waiter], ...] = tuple(deque() for _ in PRIORITY_CLASSES)
        self.count = 0
        self.granted = 0   # let go, and not yet in flight (their tasks have not run since)

    def pop_best(self) -> _Waiter | None:
        for waiters in self.classes:
            while waiters:
                w = waiters.popleft()
                if not w.fut.done():
                    return w
        return None

    def pop_worst(self, worse_than: int) -> _Waiter | None:
        """The latest arrival of the worst class waiting, if that class is worse than `worse_than`."""
        for rank in range(len(self.classes) - 1, worse_than, -1):
            waiters = self.classes[rank]
            while waiters:
                w = waiters.pop()
                if not w.fut.done():
                    return w
        return None


class WaitQueues:
    """The gateway's queues, one per model that has waiters.

    `room(model)`: how many more of the model's requests may be sent now (UNLIMITED without a
    concurrency limit), or None when it has no Ready replica. `on_first(model)`: called when a
    model's first request starts waiting, so its demand is reported at once (demand.py).
    The gateway calls `wake(model)` when room may have grown: the table changed, a request ended.
    """

    def __init__(self, room: Callable[[str], int | None], *, size: int = 1000, timeout: float = 60.0,
                 on_first: Callable[[str], None] | None = None) -> None:
        self.room, self.size, self.timeout = room, size, timeout
        self.on_first = on_first
        self._queues: dict[str, _ModelQueue] = {}
        self._synced = asyncio.Event()

    def waiting(self) -> dict[str, int]:
        """Requests waiting per model (models with none left out)."""
        return {m: q.count for m, q in self._queues.items() if q.count}

    def count(self, model: str) -> int:
        """Requests waiting for the model, or let go and not yet in flight."""
        q = self._queues.get(model)
        return q.count + q.granted if q is not None else 0

    def blocked(self, model: str) -> bool:
        """Whether a request for `model` must wait (no room, or others wait before it)."""
        q = self._queues.get(model)
        if q is not None and (q.count or q.granted):
            return True
        room = self.room(model)
        return room is None or room <= 0

    async def wait(self, model: str, priority: str = DEFAULT_PRIORITY,
                   on_wait: Callable[[Callable[[], None]], None] | None = None) -> Refusal | None:
        """Wait until the request may be sent (None) or is refused. On None the caller must put the
        request in flight before it next awaits (the room it was given is counted until then).
        `on_wait(leave)`: while it waits, `leave()` takes it out (refused, Why.LEFT): its caller hung up."""
        q = self._queues.get(model)
        if q is None:
            q = self._queues[model] = _ModelQueue()
        rank = _RANK.get(priority, _RANK[DEFAULT_PRIORITY])
        loop = asyncio.get_running_loop()
        start = loop.time()
        if q.count >= self.size:
            victim = q.pop_worst(rank)
            if victim is None:
                return self._refusal(model, Why.FULL, start)
            self._leave(q, victim, Why.SHED)
        w = _Waiter(loop.create_future(), rank)
        q.classes[rank].append(w)
        q.count += 1
        w.timer = loop.call_at(start + self.timeout, self._expire, model, q, w, Why.TIMEOUT)
        if on_wait is not None:
            on_wait(lambda: self._expire(model, q, w, Why.LEFT))
        if q.count == 1 and self.on_first is not None:
            self.on_first(model)
        self.wake(model)   # there may be room already (a slot freed by a request that ended)
        try:
            why = await w.fut
        except asyncio.CancelledError:   # the caller left
            if w.fut.cancelled():
                self._gone(model, q, w)
            elif w.fut.result() is _GO:   # let go, but cancelled before it ran: give the room back
                q.granted -= 1
                self.wake(model)
            raise
        if why is not _GO:
            return self._refusal(model, why, start)
        q.granted -= 1
        self._drop_if_empty(model, q)
        return None

    def wake(self, model: str) -> None:
        """Let go as many of the model's waiters as there is room for, best class first."""
        q = self._queues.get(model)
        if q is None or not q.count:
            return
        room = self.room(model)
        if room is None:
            return
        room -= q.granted
        while room > 0:
            w = q.pop_best()
            if w is None:
                break
            self._leave(q, w, _GO)
            q.granted += 1
            room -= 1

    def wake_all(self) -> None:
        for model in list(self._queues):
            self.wake(model)

    # ------------------------------------------------------------ the first view of the table

    def set_synced(self) -> None:
        self._synced.set()

    async def synced(self) -> bool:
        """Wait (up to the timeout) for the gateway's first full view of its models; whether it came."""
        if self._synced.is_set():
            return True
        try:
            await asyncio.wait_for(self._synced.wait(), self.timeout)
        except TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ internals

    def _leave(self, q: _ModelQueue, w: _Waiter, result: Why | None) -> None:
        """A live waiter taken out of its deque gets its answer."""
        q.count -= 1
        if w.timer is not None:
            w.timer.cancel()
        w.fut.set_result(result)

    def _expire(self, model: str, q: _ModelQueue, w: _Waiter, why: Why) -> None:
        """Out of the queue, where it stays (done) until a pop passes it."""
        if not w.fut.done():
            q.count -= 1
            if w.timer is not None:
                w.timer.cancel()
            w.fut.set_result(why)
            self._drop_if_empty(model, q)

    def _gone(self, model: str, q: _ModelQueue, w: _Waiter) -> None:
        q.count -= 1
        if w.timer is not None:
            w.timer.cancel()
        self._drop_if_empty(model, q)

    def _drop_if_empty(self, model: str, q: _ModelQueue) -> None:
        if not q.count and not q.granted and self._queues.get(model) is q:
            del self._queues[model]

    def _refusal(self, model: str, why: Why, start: float) -> Refusal:
        q = self._queues.get(model)
        if q is not None:
            self._drop_if_empty(model, q)
        return Refusal(why, self.room(model) is not None, asyncio.get_running_loop().time() - start)
