"""The one way tests wait for something to happen: poll a condition until it holds.

    value = await until(lambda: store.get(Replica, "r1"), "replica r1 created")   # async or plain condition
    value = until_sync(lambda: log.exists(), "the log file", timeout=30)           # from synchronous tests

A condition is polled until it returns something truthy, which is returned. The timeout
only bounds a hang (no test asserts on speed); when it passes, the AssertionError names
what was awaited, the last value seen, and `detail()` (a process's log tail, say).
`ignoring`: exceptions that mean "not yet" (NotFound while an object is being created);
`abort`: a check that ends the wait at once (the process that would do it exited).
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Poll:
    def __init__(self, what: str, timeout: float, detail: Callable[[], str] | None,
                 ignoring: tuple[type[BaseException], ...], abort: Callable[[], bool] | None) -> None:
        self.what, self.timeout, self.detail, self.ignoring, self.abort = what, timeout, detail, ignoring, abort
        self.deadline = time.monotonic() + timeout
        self.last: Any = None

    def over(self) -> bool:
        return time.monotonic() >= self.deadline or (self.abort is not None and self.abort())

    def failure(self, cond: object) -> AssertionError:
        why = "stopped" if self.abort is not None and self.abort() else f"not within {self.timeout:g} s"
        message = f"{self.what or cond}: {why} (last seen: {self.last!r})"
        if self.detail is not None:
            message += "\n" + self.detail()
        return AssertionError(message)


async def until(cond: Callable[[], T | Awaitable[T]], what: str = "", timeout: float = 60.0, *,
                interval: float = 0.05, detail: Callable[[], str] | None = None,
                ignoring: tuple[type[BaseException], ...] = (), abort: Callable[[], bool] | None = None) -> T:
    """Poll `cond()` (a plain or an async condition) until it is truthy; return its value."""
    poll = _Poll(what, timeout, detail, ignoring, abort)
    while True:
        try:
            value = cond()
            if inspect.isawaitable(value):
                value = await value
            poll.last = value
            if value:
                return value  # type: ignore[return-value]  # awaited above when it was an awaitable
        except ignoring as err:
            poll.last = err
        if poll.over():
            raise poll.failure(cond)
        await asyncio.sleep(interval)


def until_sync(cond: Callable[[], T], what: str = "", timeout: float = 60.0, *, interval: float = 0.05,
               detail: Callable[[], str] | None = None, ignoring: tuple[type[BaseException], ...] = (),
               abort: Callable[[], bool] | None = None) -> T:
    """`until` for synchronous tests and helpers: the same semantics, sleeping the thread."""
    poll = _Poll(what, timeout, detail, ignoring, abort)
    while True:
        try:
            poll.last = value = cond()
            if value:
                return value
        except ignoring as err:
            poll.last = err
        if poll.over():
            raise poll.failure(cond)
        time.sleep(interval)
