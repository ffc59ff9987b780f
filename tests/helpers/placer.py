"""FirstFitPlacer: a deliberately tiny stand-in for the scheduler in model/replica tests.

Places an unplaced, undeleted replica whose crash backoff has passed on the
first Ready nodes (by name) with enough free GPUs; GPUs in use are those of
placed, undeleted replicas in the cache.  Multi-node replicas need nodes of
one fabric.  ``paused = True`` stops it placing anything.
"""
from __future__ import annotations

from datetime import datetime, timezone

from controllers.indexes import REPLICAS_BY_NODE
from llmgw.api import Placement, condition_true
from llmgw.api.types import Node, Replica
from llmgw.runtime.controller import Controller, Result


class FirstFitPlacer(Controller):
    name = "test-placer"
    watches = ("replicas", "nodes")
    indexes = (REPLICAS_BY_NODE,)
    workers = 1
    paused = False

    def keys_for(self, kind, obj):
        if kind == "replicas":
            return [obj.metadata.name]
        return [r.metadata.name for r in self.ctx.cache.list(Replica) if not r.spec.placement]

    async def reconcile(self, key):
        cache = self.ctx.cache
        r = cache.get(Replica, key)
        if self.paused or r is None or r.spec.placement or r.metadata.deletionTimestamp is not None:
            return None
        if r.status.backoffUntil and r.status.backoffUntil > datetime.now(timezone.utc):
            return Result(requeue_after=(r.status.backoffUntil - datetime.now(timezone.utc)).total_seconds())
        prof = r.spec.profile
        candidates = []
        for node in sorted(cache.list(Node), key=lambda n: n.metadata.name):
            if not condition_true(node.status.conditions, "Ready") or node.spec.unschedulable:
                continue
            used = {g for o in cache.index(Replica, "node", node.metadata.name)
                    if o.metadata.deletionTimestamp is None
                    for p in o.spec.placement if p.node == node.metadata.name for g in p.gpus}
            free = [g.index for g in node.status.gpus if g.index not in used]
            if len(free) >= prof.gpusPerNode:
                fabric = node.status.fabrics[0].name if node.status.fabrics else None
                candidates.append((node.metadata.name, free[:prof.gpusPerNode], fabric))
        if prof.nodes > 1:
            by_fabric: dict = {}
            for c in candidates:
                if c[2]:
                    by_fabric.setdefault(c[2], []).append(c)
            candidates = next((v for v in by_fabric.values() if len(v) >= prof.nodes), [])
        if len(candidates) < prof.nodes:
            return Result(requeue_after=0.5)
        new = r.model_copy(deep=True)
        new.spec.placement = [Placement(rank=i, node=n, gpus=g, fabric=f if prof.nodes > 1 else None)
                              for i, (n, g, f) in enumerate(candidates[:prof.nodes])]
        self.ctx.cache.assume(await self.ctx.store.update(new))
        return None
