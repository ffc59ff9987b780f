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

from typing import Any, Iterable

from llmgw.api import KIND_BY_NAME
from llmgw.runtime.controller import Controller, Result
from llmgw.store import NotFound


class GarbageCollector(Controller):
    name = "gc"
    watches = ("replicas", "shards", "models")
    workers = 1

    def __init__(self) -> None:
        self._term: Any = None               # the cache of the term _looked_at belongs to
        # (kind, name) -> (uid, owner references) last enqueued this term. Whether an owner
        # is gone changes only when the references change or an owner goes (which enqueues
        # its dependants below), so a status change does not need another look.
        self._looked_at: dict[tuple[str, str], tuple] = {}

    def keys_for(self, kind: str, obj: Any) -> Iterable[str]:
        keys: list[str] = []
        if self._term is not self.ctx.cache:   # first event of a leadership term
            self._term = self.ctx.cache
            self._looked_at.clear()
        name = obj.metadata.name
        live = self.ctx.cache.get(kind, name) is not None
        if kind in ("replicas", "shards") and live and obj.metadata.ownerReferences:
            owners = (obj.metadata.uid, tuple((r.kind, r.name, r.uid) for r in obj.metadata.ownerReferences))
            if self._looked_at.get((kind, name)) != owners:
                self._looked_at[(kind, name)] = owners
                keys.append(f"{kind}/{name}")
        if not live:   # an owner went: look at what it owned
            self._looked_at.pop((kind, name), None)
            dependants = {"models": ("replicas", "model"), "replicas": ("shards", "replica")}.get(kind)
            if dependants:
                dkind, index = dependants
                keys += [f"{dkind}/{o.metadata.name}" for o in self.ctx.cache.index(dkind, index, name)]
        return keys

    async def reconcile(self, key: str) -> Result | None:
        kind, _, name = key.partition("/")
        obj = self.ctx.cache.get(kind, name)
        if obj is None or obj.metadata.deletionTimestamp is not None:
            return None
        for ref in obj.metadata.ownerReferences:
            if await self._owner_gone(ref):
                node = obj.spec.node if kind == "shards" else None
                try:
                    gone = await self.ctx.store.delete(kind, name, node=node)
                except NotFound:
                    return None
                self.ctx.cache.assume_deletion(gone)
                self.ctx.events.record(obj, "Normal", "GarbageCollected",
                                       f"owner {ref.kind} {ref.name} (uid {ref.uid}) is gone")
                return None
        return None

    async def _owner_gone(self, ref) -> bool:
        cls = KIND_BY_NAME.get(ref.kind)
        if cls is None:
            return False          # an owner kind we do not know: leave it alone
        kind = cls.kind_plural
        cached = self.ctx.cache.get(kind, ref.name)
        if cached is not None and cached.metadata.uid == ref.uid:
            return False
        try:
            owner = await self.ctx.store.get(kind, ref.name)
        except NotFound:
            return True
        return owner.metadata.uid != ref.uid
