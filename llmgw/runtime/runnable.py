"""Runnables: work besides the controllers that only the leader may do (compaction, say).

A runnable is any object with ``async def run()``. The manager starts each one
when it becomes the leader (with the controllers' workers) and cancels it when
leadership is lost, like controller-runtime's LeaderElectionRunnable; a new
term starts it again.
"""
from __future__ import annotations

from typing import Protocol


class Runnable(Protocol):
    async def run(self) -> None:
        """Work until cancelled."""
        ...
