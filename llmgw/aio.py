"""The event loop the long-running services use."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` on uvloop where it is installed (a dependency except on Windows), else asyncio's loop.

    uvloop's loop costs about half as much CPU per callback as asyncio's; in the
    controller-manager and the server, which spend much of their time waking
    on gRPC and socket events, that is a tenth or more of all their CPU.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
