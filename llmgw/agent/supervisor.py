"""All of this node's shards: one runner per shard, fed by the shard watch; orphans stopped.

On start it loads the state directory's records. A record whose shard shows
up (same uid) is adopted by that shard's runner, engine untouched. Once the
first full list has been seen (`synced`), records nobody claimed belong to
shards that no longer exist: their engines are stopped and the records go.
No runner launches an engine before that (ctx.claims.ready), and none on GPUs
or ports that such an engine, or another shard's, may still hold.
"""
from __future__ import annotations

import asyncio
import logging

from llmgw.agent.adapters import Refused
from llmgw.agent.claims import Claim
from llmgw.agent.runner import Context, EngineProcess, ShardRunner, terminate
from llmgw.agent.state import ShardRecord
from llmgw.api import Shard

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.runners: dict[str, ShardRunner] = {}
        self.records: dict[str, ShardRecord] = ctx.state.load_all()
        self._orphans: list[asyncio.Task[None]] = []
        self._synced = False

    def upsert(self, shard: Shard) -> None:
        if shard.spec.node != self.ctx.node:
            log.warning("ignoring shard %s: it is for node %s, this is %s", shard.name, shard.spec.node, self.ctx.node)
            return
        self.ctx.reporter.observed(shard)
        runner = self.runners.get(shard.name)
        if runner is not None and runner.uid == shard.metadata.uid:
            runner.update(shard)
            return
        if runner is not None:          # same name, new object: the old one is gone
            runner.gone()
        record = self.records.pop(shard.name, None)
        new = ShardRunner(self.ctx, shard, record)
        new.update(shard)
        self.runners[shard.name] = new
        if runner is not None and runner.task is not None:
            previous = runner.task

            async def after_previous() -> None:
                await asyncio.shield(previous)
                await new._main()
            new.task = asyncio.ensure_future(after_previous())
        else:
            new.start()

    def remove(self, shard: Shard | str) -> None:
        name = shard if isinstance(shard, str) else shard.name
        runner = self.runners.get(name)
        if runner is None:
            return
        uid = None if isinstance(shard, str) else shard.metadata.uid
        if uid is not None and uid != runner.uid:
            return
        runner.gone()

        def drop(_task: asyncio.Task[None], name: str = name, runner: ShardRunner = runner) -> None:
            if self.runners.get(name) is runner:
                del self.runners[name]
                self.ctx.reporter.forget(name)
        if runner.task is not None:
            runner.task.add_done_callback(drop)

    def synced(self) -> None:
        """The first full list is in: stop the engines of records no shard claimed; then
        runners may launch."""
        if self._synced:
            return
        self._synced = True
        for name, record in list(self.records.items()):
            del self.records[name]
            log.warning("shard %s (uid %s) no longer exists: stopping its engine (pids %s)",
                        name, record.uid, [p.pid for p in record.processes])
            claim = self.ctx.claims.add(Claim(f"shard {name} (deleted)", record.gpus, record.ports, held=True))
            claim.pgids = [p.pid for p in record.processes]
            self._orphans.append(asyncio.ensure_future(self._stop_orphan(record, claim)))
        self.ctx.claims.ready.set()

    def adapters_changed(self, replicas: set[str]) -> None:
        """An Adapter placed or resident on these replicas changed: their runners sync their engines'
        (llmgw/agent/adapters.py); the others' adapters are as they were."""
        for runner in self.runners.values():
            if runner.shard.spec.replica in replicas:
                runner.adapters_changed.set()

    def running(self, name: str) -> bool:
        """Whether the shard's engine runs now (its runner holds started processes)."""
        runner = self.runners.get(name)
        return runner is not None and bool(runner.procs)

    async def load_direct(self, replica: str, name: str, digest: str | None, victim: str | None) -> str | None:
        """A gateway's direct load of an adapter into the replica's serving engine here (direct.py):
        the victim, if it was unloaded."""
        runner = next((r for r in self.runners.values() if r.shard.spec.replica == replica and r.shard.spec.rank == 0),
                      None)
        if runner is None:
            raise Refused(404, f"replica {replica} has no serving shard on this node")
        return await runner.load_direct(name, digest, victim)

    def engine_groups(self) -> list[int]:
        """Process groups of every engine of this node that may run, records not yet claimed too."""
        return self.ctx.claims.groups() + [p.pid for r in self.records.values() for p in r.processes]

    async def _stop_orphan(self, record: ShardRecord, claim: Claim) -> None:
        procs = [EngineProcess(p) for p in record.processes]
        await terminate([p for p in procs if p.has_processes()], self.ctx.config.stop_grace_period,
                        f"orphaned shard {record.shard}")
        self.ctx.state.remove(record.shard)
        claim.release()
        self.ctx.claims.discard(claim)

    async def close(self) -> None:
        """Stop supervising (the agent is exiting); engines keep running."""
        tasks = [r.task for r in self.runners.values() if r.task is not None] + self._orphans
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        s = self.ctx.http.get("session")
        if s is not None:
            await s.close()
