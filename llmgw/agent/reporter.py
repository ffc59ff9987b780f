"""Shard status writes without duplicates.

Each shard's runner states the status it wants (`want`); the server's copy is
learnt from the watch (`observed`) and from each write's answer. A write is
sent only when the two differ, and only the latest wanted status is sent: a
burst of phase changes during an outage becomes one write when the server is
back. Failed writes are retried with llmgw.backoff's jittered exponential backoff.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Awaitable, Callable

from llmgw.api import Shard, ShardStatus
from llmgw.backoff import Backoff

log = logging.getLogger(__name__)

# write(shard name, node, status dict) -> the status the server now holds
Writer = Callable[[str, str, dict[str, Any]], Awaitable[ShardStatus]]


class Gone(Exception):
    """The shard no longer exists: nothing to write."""


def _dump(status: ShardStatus) -> dict[str, Any]:
    return status.model_dump(mode="json")


class StatusReporter:
    def __init__(self, write: Writer, node: str, max_backoff: float = 10.0):
        self._write = write
        self._node = node
        self._wanted: dict[str, dict[str, Any]] = {}
        self._known: dict[str, dict[str, Any]] = {}
        self._written: dict[str, deque[dict[str, Any]]] = {}      # our recent writes, newest last
        self._want_uid: dict[str, str | None] = {}  # which incarnation of the name a wanted status is for
        self._seen_uid: dict[str, str | None] = {}  # the incarnation the server has
        self._wake = asyncio.Event()
        self._backoff = Backoff(0.2, max_backoff)
        self.writes = 0             # successful writes (for tests and logs)

    def want(self, name: str, status: ShardStatus, uid: str | None = None) -> None:
        """The status shard `name` (the incarnation with this uid) should have on the server."""
        self._wanted[name] = _dump(status)
        self._want_uid[name] = uid
        self._wake.set()

    def observed(self, shard: Shard) -> None:
        """The server's copy, from the watch.

        A watch event can trail our own later write; one that shows an earlier status of ours
        is stale and ignored, so it cannot cause a duplicate write.
        """
        seen = _dump(shard.status)
        if self._seen_uid.get(shard.name, shard.metadata.uid) != shard.metadata.uid:
            self._written.pop(shard.name, None)       # a new shard of the same name
        self._seen_uid[shard.name] = shard.metadata.uid
        history = self._written.get(shard.name)
        if history and seen in history and seen != history[-1]:
            return
        self._known[shard.name] = seen
        if self._wanted.get(shard.name, self._known[shard.name]) != self._known[shard.name]:
            self._wake.set()

    def forget(self, name: str) -> None:
        self._wanted.pop(name, None)
        self._known.pop(name, None)
        self._written.pop(name, None)
        self._want_uid.pop(name, None)
        self._seen_uid.pop(name, None)

    def pending(self) -> list[str]:
        return [n for n, s in self._wanted.items() if self._known.get(n) != s and self._same_incarnation(n)]

    def _same_incarnation(self, name: str) -> bool:
        """Never write an old shard's status onto a new shard that reuses its name."""
        want, seen = self._want_uid.get(name), self._seen_uid.get(name)
        return want is None or seen is None or want == seen

    def kick(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            ok = await self._flush()
            if ok:
                self._backoff.reset()
                continue
            self._wake.set()    # retry after the backoff
            await self._backoff.sleep()

    async def _flush(self) -> bool:
        ok = True
        for name in self.pending():
            status = self._wanted.get(name)
            if status is None:
                continue    # forgotten (its runner ended) while an earlier one was written
            try:
                written = await self._write(name, self._node, status)
            except Gone:
                self.forget(name)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 server or etcd away: keep the latest, retry later
                log.warning("shard %s: status write failed, will retry: %s", name, err)
                ok = False
                break
            self.writes += 1
            self._known[name] = _dump(written)
            self._written.setdefault(name, deque(maxlen=16)).append(self._known[name])
        return ok
