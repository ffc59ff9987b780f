"""The event loop the long-running services use."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine


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
    return uvloop.run(main)
