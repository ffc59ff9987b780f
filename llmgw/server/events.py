"""A watch of events (`GET /events?watch=1`, `llmgw events -w`): the lines an object watch has,
about the events recorded under /llmgw/events/ (every object's, a kind's or one object's); and,
the same way, of the revoked serials (`GET /revocations?watch=1`, the agents' listeners).

An event is ADDED when recorded and DELETED when it expires (an hour on); each line carries its
revision, BOOKMARKs come while idle and one ERROR ends the stream (410 Expired when the revision
to resume from was compacted: relist). Each HTTP watch has its own store watch of the events'
prefix, fed by a reflector (llmgw.reflector) that re-opens a dropped stream where it stopped
while the HTTP stream stays open: events are watched by people (a terminal or two), not by every
agent, so they need no shared watch cache like the objects' (llmgw.server.watchcache).
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

from llmgw.api.client import EventType
from llmgw.api.events import event_key
from llmgw.backoff import Backoff
from llmgw.reflector import AfterError, ListerWatcher, Reflector
from llmgw.server.watchcache import bookmark_line, error_line, event_line
from llmgw.store import Store
from llmgw.store.errors import Compacted


def _after_error(err: Exception) -> AfterError:
    """Compacted: the watch ends (410), the client relists. Anything else: watch again."""
    return "raise" if isinstance(err, Compacted) else "retry"


class EventWatch:
    """One HTTP watch of the events after revision `after` (which etcd still has)."""

    def __init__(self, store: Store, after: int, kind: str | None, name: str | None, limit: int = 1000,
                 what: Literal["events", "revocations"] = "events"):
        self.limit, self.what = limit, what
        self._pending: deque[bytes] = deque()
        self._error: bytes | None = None
        self._wake = asyncio.Event()
        lw: ListerWatcher[Any] = (store.events.lister_watcher(kind, name, _after_error) if what == "events"
                                  else store.revocations.lister_watcher(_after_error))
        self._reflector = Reflector(lw, self._offer, key=event_key if what == "events" else str,
                                    start_revision=after, backoff=Backoff(0.1, 5.0),
                                    name=f"watch of {what} after {after}")

    def _offer(self, type_: EventType, event: Any, revision: int) -> None:
        if self._error is not None:
            return
        if len(self._pending) >= self.limit:
            self.fail(410, "Expired", f"this watch fell more than {self.limit} {self.what} behind and was closed; "
                      "relist and watch from the list's resourceVersion")
            return
        self._pending.append(event_line(type_, event if self.what == "events" else {"serial": event}, revision))
        self._wake.set()

    def fail(self, code: int, reason: str, message: str) -> None:
        """End the watch: the stream sends this ERROR next, and nothing else."""
        if self._error is None:
            self._error = error_line(code, reason, message)
            self._pending.clear()
            self._wake.set()

    async def _pump(self) -> None:
        try:
            await self._reflector.run()
        except Compacted:
            self.fail(410, "Expired", f"revision {self._reflector.revision + 1} was compacted; relist and watch "
                      "from the list's resourceVersion")

    async def stream(self, idle: float) -> AsyncIterator[bytes]:
        """Chunks to write: the events as they come, a BOOKMARK after `idle` seconds without any,
        and, when the watch fails, the ERROR line, which ends it."""
        pump = asyncio.create_task(self._pump(), name="event-watch")
        try:
            while True:
                if self._error is not None:
                    yield self._error
                    return
                if self._pending:
                    chunk = b"".join(self._pending)
                    self._pending.clear()
                    yield chunk
                    continue
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), idle)
                except asyncio.TimeoutError:
                    yield bookmark_line(self._reflector.revision)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
