"""Drain: move every replica off a node whose spec.drain is set, make-before-break.

Keys are node names. One step per reconcile, all decided from the cache:

1. cordon (spec.unschedulable) if not yet;
2. for each replica placed on the node, oldest first: a replacement (see
   replacement.py) is made for one replica at a time; when it is Ready the
   original is deleted (its finalizer lets the replica controller stop its
   shards), so the model never has fewer Ready replicas than before. A
   replacement the scheduler cannot place does not hold up the rest: its
   original is reported Stuck (with the scheduler's message) and the next
   replica gets its replacement. A replica whose model is gone is deleted
   without replacement.
3. Drained once no replica is placed on the node and no shard is left there.

Progress is in Node status.drain (phase Draining/Stuck/Drained, remaining,
current, message). Nothing is kept in memory: a restarted controller finds
the replacements it made by their annotation and carries on. When spec.drain
is withdrawn, status.drain is cleared and the replacements in flight lose
their annotation, so the model controller scales the surplus back down.
"""
from __future__ import annotations

from typing import Iterable

from controllers.indexes import REPLICAS_BY_MODEL, REPLICAS_BY_NODE, SHARDS_BY_NODE
from controllers.replacement import abandon_replacement, delete_replica, ensure_replacement, find_replacement
from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import AnyObject, DrainStatus, Model, Node, Replica, Shard, get_condition
from llmgw.api.errors import NotFound
from llmgw.api.patches import NodeStatusPatch
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR
from llmgw.runtime.controller import Controller, Result, WatchedKind


def unplaceable(rep: Replica) -> str | None:
    """The scheduler's reason when it cannot place `rep`, else None."""
    c = get_condition(rep.status.conditions, "Scheduled")
    if c is not None and c.status == "False" and not rep.spec.placement:
        return c.message or c.reason
    return None


def _age(r: Replica) -> tuple[float, str]:
    ts = r.metadata.creationTimestamp
    return (ts.timestamp() if ts else 0.0, r.metadata.name)


class DrainController(Controller):
    name = "drain"
    watches = (Node, Replica, Shard, Model)   # models: to tell a gone model
    indexes = (REPLICAS_BY_NODE, REPLICAS_BY_MODEL, SHARDS_BY_NODE)

    def __init__(self, settings: ControllerSettings = DEFAULTS) -> None:
        self.settings = settings

    def _draining(self, node_name: str) -> bool:
        node = self.ctx.cache.get(Node, node_name)
        return node is not None and (node.spec.drain or node.status.drain is not None)

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if type(obj) is Node:
            return [obj.metadata.name]
        if type(obj) is Shard:
            nodes = {obj.spec.node}
        elif type(obj) is Replica:
            nodes = {p.node for p in obj.spec.placement}
            orig = obj.metadata.annotations.get(DRAINING_REPLACEMENT_FOR)
            if orig and (o := self.ctx.cache.get(Replica, orig)) is not None:
                nodes |= {p.node for p in o.spec.placement}
        else:
            return []
        return [n for n in nodes if self._draining(n)]

    async def reconcile(self, key: str) -> Result | None:
        cache, store = self.ctx.cache, self.ctx.store
        node = cache.get(Node, key)
        if node is None:
            return None
        if not node.spec.drain:
            if node.status.drain is not None:
                await self._cancel(node)
            return None
        if node.status.drain is None:
            self.ctx.events.record(node, "Normal", "DrainStarted", "drain requested: moving replicas off")
        if not node.spec.unschedulable:
            cordoned = node.model_copy(deep=True)
            cordoned.spec.unschedulable = True
            node = await store.update(cordoned, current=node)
            cache.assume(node)
            self.ctx.events.record(node, "Normal", "Cordoned", "no new replicas will be placed here")

        on_node = sorted(cache.index(Replica, "node", key), key=_age)
        shards = cache.index(Shard, "node", key)
        if not on_node and not shards:
            await self._progress(node, DrainStatus(phase="Drained", remaining=0,
                                                   message="no replica has a shard on the node"))
            return None

        moving = [r for r in on_node if r.metadata.deletionTimestamp is None]
        in_flight: tuple[Replica, Replica] | None = None
        stuck: list[str] = []
        for orig in moving:
            repl = find_replacement(cache, orig)
            if repl is None:
                continue
            if repl.status.phase == "Ready":
                await self._finish(node, orig, repl)
            elif (why := unplaceable(repl)) is not None:
                stuck.append(f"{orig.metadata.name} (replacement {repl.metadata.name}: {why})")
            elif in_flight is None:
                in_flight = (orig, repl)
        if in_flight is None:
            for orig in moving:
                if find_replacement(cache, orig) is not None:
                    continue
                if await self._model_gone(orig.spec.model):
                    await self._delete(node, orig, f"model {orig.spec.model} is gone: stopped without replacement")
                    continue
                repl = await ensure_replacement(self.ctx, orig, f"draining node {key}")
                in_flight = (orig, repl)
                break

        remaining = len(on_node)
        if in_flight is not None:
            orig, repl = in_flight
            msg = f"moving {orig.metadata.name}: replacement {repl.metadata.name} is {repl.status.phase}"
            status = DrainStatus(phase="Draining", remaining=remaining, current=orig.metadata.name,
                                 message="; ".join([msg] + [f"stuck: {s}" for s in stuck]))
        elif stuck:
            status = DrainStatus(phase="Stuck", remaining=remaining, current=None,
                                 message="cannot place replacements for " + "; ".join(stuck))
        else:
            left = [r.metadata.name for r in on_node] or [f"{len(shards)} shards"]
            status = DrainStatus(phase="Draining", remaining=remaining, current=None,
                                 message="waiting for " + ", ".join(left) + " to stop")
        await self._progress(node, status)
        # Replica and shard events wake this key; the requeue is a safety net.
        return Result(requeue_after=self.settings.drain_resync)

    # ------------------------------------------------------------- steps
    async def _model_gone(self, name: str) -> bool:
        """Confirmed with etcd: a lagging cache must not cost a replica its replacement."""
        if self.ctx.cache.get(Model, name) is not None:
            return False
        try:
            await self.ctx.store.get(Model, name)
        except NotFound:
            return True
        return False

    async def _finish(self, node: Node, orig: Replica, repl: Replica) -> None:
        where = ", ".join(p.node for p in repl.spec.placement)
        await self._delete(node, orig, f"replacement {repl.metadata.name} is Ready on {where}: "
                                       f"stopping {orig.metadata.name}")

    async def _delete(self, node: Node, orig: Replica, message: str) -> None:
        await delete_replica(self.ctx, orig, (node, "Normal", "DrainStep", message),
                             (orig, "Normal", "Evicted", f"node {node.metadata.name} is draining: {message}"))

    async def _progress(self, node: Node, status: DrainStatus) -> None:
        if node.status.drain == status:
            return
        if status.phase != (node.status.drain.phase if node.status.drain else None):
            kind = "Warning" if status.phase == "Stuck" else "Normal"
            self.ctx.events.record(node, kind, f"Drain{status.phase}", status.message)
        patch: NodeStatusPatch = {"drain": {"phase": status.phase, "remaining": status.remaining,
                                            "current": status.current, "message": status.message}}
        written = await self.ctx.store.patch_status(Node, node.metadata.name, patch, current=node)
        self.ctx.cache.assume(written)

    async def _cancel(self, node: Node) -> None:
        """Drain withdrawn: forget progress; replacements in flight are called off (replacement.py)."""
        for orig in self.ctx.cache.index(Replica, "node", node.metadata.name):
            repl = find_replacement(self.ctx.cache, orig)
            if repl is None or DRAINING_REPLACEMENT_FOR not in repl.metadata.annotations:
                continue
            await abandon_replacement(self.ctx, repl)
        patch: NodeStatusPatch = {"drain": None}
        written = await self.ctx.store.patch_status(Node, node.metadata.name, patch, current=node)
        self.ctx.cache.assume(written)
        self.ctx.events.record(node, "Normal", "DrainCancelled", "drain withdrawn")
