"""Compaction of etcd's history, which etcd itself leaves off (docs/architecture.md, "etcd layout"),
and the way back from a full etcd.

Without compaction the history of every write is kept and grows without bound.
``Compactor.compact()`` compacts once, keeping the last ``keep`` revisions;
``Compactor.run()`` does so every ``interval`` seconds until cancelled, and looks
every ``ALARM_CHECK`` seconds for etcd's NOSPACE alarm (its space quota reached:
every write refused): then it compacts at once, defragments every member (which
gives the freed pages back to the file system) and disarms the alarm
(``recover()``). The controller manager runs it as a leader-only runnable
(llmgw.runtime.runnable): one compactor at a time, on the leader.
"""
from __future__ import annotations

import asyncio
import logging

from llmgw.store.errors import Compacted
from llmgw.store.etcd import Etcd

log = logging.getLogger("llmgw.compaction")

KEEP = 10000         # revisions kept: a watch or a read this far behind still works
INTERVAL = 300.0     # seconds between compactions
ALARM_CHECK = 10.0   # seconds between looks at etcd's alarms


class Compactor:
    def __init__(self, etcd: Etcd, *, keep: int = KEEP, interval: float = INTERVAL,
                 alarm_check: float = ALARM_CHECK):
        self._etcd = etcd
        self.keep, self.interval, self.alarm_check = keep, interval, alarm_check
        self.compacted_to: int | None = None     # the revision of the last compaction this made
        self.recoveries = 0                      # NOSPACE alarms this compactor disarmed

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

    async def recover(self) -> bool:
        """If etcd's NOSPACE alarm is raised: compact, defragment every member, disarm it.
        Whether there was one. If the live data alone exceeds the quota, the alarm comes back
        at the next writes: only a larger --quota-backend-bytes helps then (docs/contracts.md)."""
        members = await self._etcd.nospace_alarms()
        if not members:
            return False
        log.warning("etcd's space quota is exhausted (NOSPACE alarm on %d member(s)): compacting, "
                    "defragmenting and disarming", len(members))
        await self.compact()
        await self._etcd.defragment_members()
        for member in members:
            await self._etcd.disarm_nospace(member)
        self.recoveries += 1
        log.warning("etcd's NOSPACE alarm disarmed: writes are accepted again")
        return True

    async def run(self) -> None:
        """Compact every `interval` seconds, the first time at once, and recover from a NOSPACE
        alarm within `alarm_check` seconds, until cancelled."""
        loop = asyncio.get_running_loop()
        next_compaction = loop.time()
        while True:
            try:
                if not await self.recover() and loop.time() >= next_compaction:
                    next_compaction = loop.time() + self.interval
                    compacted_to = await self.compact()
                    if compacted_to is not None:
                        log.info("compacted etcd history up to revision %d (keeping %d)", compacted_to, self.keep)
            except Exception as err:  # noqa: BLE001 tried again next time; one failure must not end the loop
                log.warning("compaction or NOSPACE recovery failed: %s; trying again in %.0fs", err,
                            self.alarm_check)
            await asyncio.sleep(min(self.alarm_check, self.interval))
