"""Garbage collection: objects whose owner is gone.

Keys: "replicas/<name>" and "shards/<name>".

- A Replica whose owner Model, or a Shard whose owner Replica, no longer
  exists (or exists with another uid: deleted and re-created) is deleted;
  finalizers still let the replica controller and the agent stop things first.
  The owner's absence seen in the cache is confirmed with a read from etcd
  before anything is deleted, so a lagging cache cannot cost a live object.

etcd's history is compacted by llmgw.store.compaction's Compactor, a
leader-only runnable of the controller manager, not here.
"""
from __future__ import annotations

from typing import Iterable

from controllers.indexes import REPLICAS_BY_MODEL, SHARDS_BY_REPLICA
from llmgw.api import KIND_BY_NAME, KINDS, AnyObject, Model, OwnerReference, Replica, Shard
from llmgw.api.errors import NotFound
from llmgw.runtime.controller import Context, Controller, Result, WatchedKind


class GarbageCollector(Controller):
    name = "gc"
    watches = (Replica, Shard, Model)
    indexes = (REPLICAS_BY_MODEL, SHARDS_BY_REPLICA)
    workers = 1

    def __init__(self) -> None:
        # (kind, name) -> (uid, owner references) last enqueued this term. Whether an owner
        # is gone changes only when the references change or an owner goes (which enqueues
        # its dependants below), so a status change does not need another look.
        self._looked_at: dict[tuple[str, str], tuple[str | None, tuple[tuple[str, str, str], ...]]] = {}

    def start(self, ctx: Context) -> None:
        """A new term looks at every owned object again: it hears of every cached object anew."""
        super().start(ctx)
        self._looked_at = {}

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        keys: list[str] = []
        if isinstance(obj, str):
            return keys
        plural, name = obj.kind_plural, obj.metadata.name
        live = self.ctx.cache.get(type(obj), name) is not None
        if plural in ("replicas", "shards") and live and obj.metadata.ownerReferences:
            owners = (obj.metadata.uid, tuple((r.kind, r.name, r.uid) for r in obj.metadata.ownerReferences))
            if self._looked_at.get((plural, name)) != owners:
                self._looked_at[(plural, name)] = owners
                keys.append(f"{plural}/{name}")
        if not live:   # an owner went: look at what it owned
            self._looked_at.pop((plural, name), None)
            owned: list[AnyObject] = []
            if type(obj) is Model:
                owned += self.ctx.cache.index(Replica, "model", name)
            elif type(obj) is Replica:
                owned += self.ctx.cache.index(Shard, "replica", name)
            keys += [f"{o.kind_plural}/{o.metadata.name}" for o in owned]
        return keys

    async def reconcile(self, key: str) -> Result | None:
        plural, _, name = key.partition("/")
        kind = KINDS[plural]
        obj = self.ctx.cache.get(kind, name)
        if obj is None or obj.metadata.deletionTimestamp is not None:
            return None
        for ref in obj.metadata.ownerReferences:
            if await self._owner_gone(ref):
                node = obj.spec.node if isinstance(obj, Shard) else None
                try:
                    gone = await self.ctx.store.delete(kind, name, node=node)
                except NotFound:
                    return None
                self.ctx.cache.assume_deletion(gone)
                self.ctx.events.record(obj, "Normal", "GarbageCollected",
                                       f"owner {ref.kind} {ref.name} (uid {ref.uid}) is gone")
                return None
        return None

    async def _owner_gone(self, ref: OwnerReference) -> bool:
        kind = KIND_BY_NAME.get(ref.kind)
        if kind is None:
            return False          # an owner kind we do not know: leave it alone
        cached = self.ctx.cache.get(kind, ref.name)
        if cached is not None and cached.metadata.uid == ref.uid:
            return False
        try:
            owner = await self.ctx.store.get(kind, ref.name)
        except NotFound:
            return True
        return owner.metadata.uid != ref.uid
