"""How the long-running services run: the event loop, their stop on a signal, and the garbage collector."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Any, Awaitable, Callable, Coroutine

log = logging.getLogger("llmgw.aio")


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` on uvloop where it is installed (a dependency except on Windows), else asyncio's loop.

    uvloop's loop costs less CPU per callback and per socket operation than
    asyncio's; in the gateway, whose work is mostly socket I/O, that shows
    (hack/bench/gateway.py). In the controller-manager, gRPC-bound, the
    control-plane benchmark could not tell the two loops apart (2026-12-03:
    14.1-16.6 CPU seconds either way).
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(_with_quiet_tls_cuts(main))


async def _with_quiet_tls_cuts(main: Coroutine[Any, Any, Any]) -> Any:
    asyncio.get_running_loop().set_exception_handler(quiet_tls_cuts)
    return await main


def quiet_tls_cuts(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: one debug line for a TLS connection already closed, the
    default handler for the rest.

    uvloop's TLS reports a connection closed while its records were still being read (a server
    killed mid-stream, a handshake given up by its timeout) as "Fatal error on SSL protocol" with
    the traceback of its write to the closed transport (a RuntimeError), one per connection: a
    fleet's failover cuts thousands at once. The request on it failed with its own error, which
    its caller handles; the connection is gone either way."""
    transport = context.get("transport")
    if (isinstance(context.get("exception"), RuntimeError) and "SSL" in str(context.get("message", ""))
            and transport is not None and transport.is_closing()):
        log.debug("a TLS connection was closed while its records were read: %s", context["exception"])
        return
    loop.default_exception_handler(context)


async def until_signal(work: Coroutine[Any, Any, None] | None = None,
                       stop: Callable[[], Awaitable[None]] | None = None) -> bool:
    """Run `work` (none: only wait) until it ends or SIGTERM or SIGINT arrives; True when a signal ended it.

    A signal starts `stop()` where given (a graceful stop that makes `work`
    end), else cancels `work`; either way `work`'s end is awaited. The handlers
    stay installed through the caller's clean-up that follows: a second signal
    repeats the first's stop instead of killing the process halfway through.
    """
    loop = asyncio.get_running_loop()
    task: asyncio.Future[None] = asyncio.ensure_future(work) if work is not None else loop.create_future()
    stopping: list[asyncio.Future[None]] = []   # held: the loop keeps only weak references to tasks
    signalled = False

    def on_signal() -> None:
        nonlocal signalled
        signalled = True
        if stop is None:
            task.cancel()
        else:
            stopping.append(asyncio.ensure_future(stop()))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await task
    except asyncio.CancelledError:
        if not signalled:
            raise
    return signalled


def keep_heap_out_of_gc(young_threshold: int = 10_000) -> None:
    """For a process that holds a large, long-lived cache: collect cycles less often.

    CPython's cycle collector runs a young collection every 700 net allocations
    and, every hundred of those, walks the whole heap again. The heap of the
    controller-manager is mostly what never dies: its imports and a cache of
    every object in the cluster. Freezing what exists at startup (the imports)
    keeps it out of every collection, and a higher young threshold makes the
    full walks rarer. Measured in hack/bench/controlplane.py (2026-12-03, the
    collector timed through gc.callbacks): the controller-manager spent 1.3 s of
    its 13.6 CPU seconds collecting (511 young, 47 middle and 4 full
    collections; the full ones 0.15 s each), and 0.44 s with this (32 and 1).
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, max(middle, 20), max(old, 20))
