"""The one way a test waits for something: poll a condition until it holds.

`until` (async) and `until_sync` share their semantics: call `cond()` every
`interval` seconds until it returns something truthy, and return that value.
The timeout only bounds a hang, it is never an assertion about speed: when it
runs out, AssertionError says what was awaited (`what`, or the condition's
source line), the last value seen, and `detail()` (a log's tail, say).
Exceptions in `retry` count as "not yet" (the last one is reported); any other
exception ends the wait, so a condition stops early by raising AssertionError
(a process it waits on has died, say).
"""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

TIMEOUT = 60.0


async def until(cond: Callable[[], T | Awaitable[T]], what: str = "", *, timeout: float = TIMEOUT,
                interval: float = 0.05, retry: tuple[type[Exception], ...] = (),
                detail: Callable[[], str] | None = None) -> T:
    """Await `cond()` (a plain or an async callable) until it is truthy; returns its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            value = cond()
            if inspect.isawaitable(value):
                value = await value
        except retry as err:
            last: object = err
        else:
            if value:
                return value
            last = value
        if loop.time() >= deadline:
            raise AssertionError(_failure(cond, what, timeout, last, detail))
        await asyncio.sleep(interval)


def until_sync(cond: Callable[[], T], what: str = "", *, timeout: float = TIMEOUT, interval: float = 0.05,
               retry: tuple[type[Exception], ...] = (), detail: Callable[[], str] | None = None) -> T:
    """`until` for synchronous tests and fixtures (it blocks the thread while it waits)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except retry as err:
            last: object = err
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(_failure(cond, what, timeout, last, detail))
        time.sleep(interval)


def _failure(cond: Callable[..., object], what: str, timeout: float, last: object,
             detail: Callable[[], str] | None) -> str:
    message = f"timed out after {timeout:g}s waiting for {what or _source(cond)} (last seen: {last!r})"
    return f"{message}\n{detail()}" if detail else message


def _source(cond: Callable[..., object]) -> str:
    """The condition as written (a lambda's line), for waits that give no description."""
    try:
        return " ".join(inspect.getsource(cond).split())
    except (OSError, TypeError):
        return repr(cond)
