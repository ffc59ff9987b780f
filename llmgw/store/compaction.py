"""Compaction of etcd's history, which etcd itself leaves off (docs/architecture.md, "etcd layout").

Without it the history of every write is kept and grows without bound.
``Compactor.compact()`` compacts once, keeping the last ``keep`` revisions;
``Compactor.run()`` does so every ``interval`` seconds until cancelled. The
controller manager runs it as a leader-only runnable (llmgw.runtime.runnable):
one compactor at a time, on the leader.
"""
from __future__ import annotations

import asyncio
import logging

from llmgw.store.errors import Compacted
from llmgw.store.etcd import Etcd

log = logging.getLogger("llmgw.compaction")

KEEP = 10000         # revisions kept: a watch or a read this far behind still works
INTERVAL = 300.0     # seconds between compactions


class Compactor:
    def __init__(self, etcd: Etcd, *, keep: int = KEEP, interval: float = INTERVAL):
        self._etcd = etcd
        self.keep, self.interval = keep, interval
        self.compacted_to: int | None = None     # the revision of the last compaction this made

    async def compact(self) -> int | None:
        """Compact history older than the last `keep` revisions; the revision compacted to,
        or None when there is nothing to compact (too little history, or compacted already)."""
        target = await self._etcd.revision() - self.keep
        if target <= 0:
            return None
        try:
            await self._etcd.compact(target)
        except Compacted:
            return None
        self.compacted_to = target
        return target

    async def run(self) -> None:
        """Compact every `interval` seconds, the first time at once, until cancelled."""
        while True:
            try:
                compacted_to = await self.compact()
            except Exception as err:  # noqa: BLE001 tried again next interval; one failure must not end the loop
                log.warning("compaction failed: %s; trying again in %.0fs", err, self.interval)
            else:
                if compacted_to is not None:
                    log.info("compacted etcd history up to revision %d (keeping %d)", compacted_to, self.keep)
            await asyncio.sleep(self.interval)
