"""EventRecorder: what controllers tell people, written to the store in the background.

``record(obj, type, reason, message)`` is synchronous and never raises: it
logs the event, keeps it in ``recent`` (for tests and debugging) and queues it
for ``store.events.record_many``.  An identical event for the same object within
``dedup_seconds`` is dropped, so a retrying reconcile does not flood the store.
When the store falls behind and the queue is full, events are dropped and the
drops are logged once per ``DROP_LOG_SECONDS`` with their count (a line per
dropped event would flood the log exactly when the process is busiest).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from llmgw.api import AnyObject
from llmgw.store.events import Events

log = logging.getLogger("llmgw.events")

BATCH = 64   # events per transaction (etcd allows 128 operations in one)
DROP_LOG_SECONDS = 10.0


@dataclass(frozen=True)
class Event:
    kind: str
    name: str
    type: str        # "Normal" | "Warning"
    reason: str
    message: str


class EventWriter(Protocol):
    """Where events go: llmgw.store.Store's events."""

    @property
    def events(self) -> Events: ...


class EventRecorder:
    def __init__(self, store: EventWriter | None = None, *, maxlen: int = 2000, queue_limit: int = 10000,
                 dedup_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.recent: deque[Event] = deque(maxlen=maxlen)
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=queue_limit)
        # When each event was last recorded, by its hash (the events themselves are not
        # kept: a fleet's burst is tens of thousands of distinct messages), oldest first
        self._last: dict[int, float] = {}
        self._dedup = dedup_seconds
        self._clock = clock
        self.dropped = 0              # events dropped since this recorder started
        self._drops_logged = 0        # ... of which the log has told
        self._drop_logged_at = -1e18

    def record(self, obj: AnyObject, type: str, reason: str, message: str) -> None:
        ev = Event(obj.kind_plural, obj.metadata.name, type, reason, message)
        key = hash((ev.kind, ev.name, ev.type, ev.reason, ev.message))
        t = self._clock()
        last = self._last
        if t - last.get(key, -1e18) < self._dedup:
            return
        while last and (len(last) >= 50000 or t - next(iter(last.values())) >= self._dedup):
            del last[next(iter(last))]   # past the window (or over the bound): forgotten, oldest first
        last.pop(key, None)
        last[key] = t
        (log.warning if type == "Warning" else log.info)("%s/%s %s: %s", ev.kind, ev.name, reason, message)
        self.recent.append(ev)
        try:
            self._queue.put_nowait(ev)
        except asyncio.QueueFull:
            self.dropped += 1
            if t - self._drop_logged_at >= DROP_LOG_SECONDS:
                log.warning("event queue full: dropped %d event(s) since the last report, the latest %s/%s %s",
                            self.dropped - self._drops_logged, ev.kind, ev.name, reason)
                self._drops_logged, self._drop_logged_at = self.dropped, t

    def find(self, kind: str | None = None, name: str | None = None, reason: str | None = None) -> list[Event]:
        return [e for e in self.recent
                if (kind is None or e.kind == kind) and (name is None or e.name == name)
                and (reason is None or e.reason == reason)]

    async def run(self) -> None:
        """Write queued events to the store until cancelled; failures are logged and dropped.

        Whatever queued up while the last write was in flight goes out in one
        transaction (at most ``BATCH``): a burst of a thousand events costs a
        few round trips, not a thousand.
        """
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if self.store is None:
                continue
            try:
                await self.store.events.record_many([(e.kind, e.name, e.type, e.reason, e.message) for e in batch])
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - events are best effort
                log.debug("could not write %d event(s), the first %s/%s %s: %s", len(batch),
                          batch[0].kind, batch[0].name, batch[0].reason, err)
