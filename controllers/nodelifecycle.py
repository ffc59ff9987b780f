"""Node lifecycle: heartbeats -> Node Ready condition; lost nodes' replicas rebuilt elsewhere.

Keys are node names; a node's key is enqueued when its Node changes and when
its heartbeat key (/llmgw/heartbeat/<node>, bound to an etcd lease) appears
or vanishes.

- heartbeat gone: condition Ready=False, reason HeartbeatExpired;
  back: Ready=True, reason HeartbeatResumed (only undoing what this
  controller set; the agent owns Ready otherwise).
- silent for longer than option `node_grace` (s, default 30) since this
  controller saw it go: each replica placed on the node gets a replacement
  (replacement.py, the drain's mechanism; the scheduler places it where there
  is room), then is annotated `llmgw.io/evict: node-lost` and deleted; the
  replica controller tears it down.
- if more than option `max_silent_fraction` (default 0.5) of all nodes are
  silent at once, the likelier story is that the control plane lost the
  network, not that half the fleet died: nothing is evicted, each silent node
  past its grace gets condition EvictionHeldBack=True (reason
  EvictionHeldBack) and an event; it is re-checked every `node_grace` / 3 s.

The grace clock lives in memory: a restarted controller starts it again,
which can only delay an eviction, never hasten one.
"""
from __future__ import annotations

from typing import Any, Iterable

from llmgw.api import get_condition
from llmgw.runtime.annotations import EVICT
from llmgw.runtime.controller import Controller, Result
from llmgw.store import NotFound

from controllers.replacement import ensure_replacement

HELD_BACK = "EvictionHeldBack"


class NodeLifecycleController(Controller):
    name = "nodelifecycle"
    # replicas and models are read from the cache (what to evict, whether its model lives)
    watches = ("nodes", "heartbeats", "replicas", "models")

    def __init__(self) -> None:
        self.silent_since: dict[str, float] = {}

    def keys_for(self, kind: str, obj: Any) -> Iterable[str]:
        if kind in ("replicas", "models"):
            return []
        return [obj if isinstance(obj, str) else obj.metadata.name]

    def _opt(self, name: str, default: float) -> float:
        return float(self.ctx.options.get(name, default))

    async def reconcile(self, key: str) -> Result | None:
        cache = self.ctx.cache
        node = cache.get("nodes", key)
        if node is None:
            self.silent_since.pop(key, None)
            return None
        alive = cache.heartbeats()
        ready = get_condition(node.status.conditions, "Ready")
        held = get_condition(node.status.conditions, HELD_BACK)
        if key in alive:
            self.silent_since.pop(key, None)
            conds = []
            if ready is not None and ready.status != "True" and ready.reason == "HeartbeatExpired":
                conds.append(_cond("Ready", "True", "HeartbeatResumed", "the node's agent is heartbeating again"))
                self.ctx.events.record(node, "Normal", "NodeReady", "heartbeat resumed")
            if held is not None and held.status == "True":
                conds.append(_cond(HELD_BACK, "False", "HeartbeatResumed", "the node is back"))
            await self._patch(node, conds)
            return None

        if ready is None or ready.status != "False" or ready.reason != "HeartbeatExpired":
            await self._patch(node, [_cond("Ready", "False", "HeartbeatExpired",
                                          "no heartbeat from the node's agent")])
            self.ctx.events.record(node, "Warning", "NodeNotReady", "heartbeat expired")
        now = self.ctx.clock()
        since = self.silent_since.setdefault(key, now)
        grace = self._opt("node_grace", 30.0)
        if now - since < grace:
            return Result(requeue_after=grace - (now - since))

        nodes = cache.list("nodes")
        silent = sum(1 for n in nodes if n.metadata.name not in alive)
        fraction = self._opt("max_silent_fraction", 0.5)
        if silent > fraction * len(nodes):
            msg = (f"{silent}/{len(nodes)} nodes are silent (more than {fraction:.0%}): assuming the "
                   "control plane is cut off from them; evicting nothing")
            if held is None or held.status != "True" or held.message != msg:
                await self._patch(node, [_cond(HELD_BACK, "True", HELD_BACK, msg)])
                self.ctx.events.record(node, "Warning", HELD_BACK, msg)
            return Result(requeue_after=max(grace / 3, 0.1))
        if held is not None and held.status == "True":
            await self._patch(node, [_cond(HELD_BACK, "False", "EvictionAllowed",
                                          f"only {silent}/{len(nodes)} nodes are silent")])
        await self._evict(node, now - since)
        return None

    async def _evict(self, node, silent_for: float) -> None:
        name = node.metadata.name
        for rep in cache_sorted(self.ctx.cache.index("replicas", "node", name)):
            if rep.metadata.deletionTimestamp is not None:
                continue
            why = f"node {name} silent for {silent_for:.0f}s"
            if self.ctx.cache.get("models", rep.spec.model) is not None:
                await ensure_replacement(self.ctx, rep, why)
            marked = rep.model_copy(deep=True)
            marked.metadata.annotations[EVICT] = "node-lost"
            try:
                marked = await self.ctx.store.update(marked)     # Conflict: the key is retried
                gone = await self.ctx.store.delete("replicas", rep.metadata.name)
            except NotFound:
                continue
            if gone.metadata.finalizers:
                self.ctx.cache.assume(gone)
            else:
                self.ctx.cache.assume_deleted("replicas", gone.metadata.name)
            self.ctx.events.record(rep, "Warning", "Evicted", f"{why}: replaced and deleted")
            self.ctx.events.record(node, "Warning", "EvictedReplica", f"{rep.metadata.name}: {why}")

    async def _patch(self, node, conds: list[dict]) -> None:
        if not conds:
            return
        try:
            written = await self.ctx.store.patch_status("nodes", node.metadata.name, {"conditions": conds},
                                                        current=node)
        except NotFound:
            return
        self.ctx.cache.assume(written)


def _cond(type: str, status: str, reason: str, message: str) -> dict:
    return {"type": type, "status": status, "reason": reason, "message": message}


def cache_sorted(replicas: list) -> list:
    return sorted(replicas, key=lambda r: r.metadata.name)
