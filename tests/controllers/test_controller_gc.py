"""Garbage collector on a real etcd: orphans go, owned objects stay."""
from __future__ import annotations

from collections import Counter

from controllers.gc import GarbageCollector
from llmgw.api import Model, Replica, Shard
from tests.fixtures.ctrlkit import get_or_none, model, replica, running, shard
from tests.fixtures.poll import until


async def test_orphans_are_deleted_and_owned_objects_kept(store):
    m = await store.create(model("m"))
    kept = await store.create(replica("kept", "m", owner=m))
    await store.create(shard("kept-0", kept, "n1"))
    stale_owner = model("m")
    stale_owner.metadata.uid = "uid-of-an-earlier-m"          # same name, other incarnation
    await store.create(replica("stale", "m", owner=stale_owner))
    ghost = replica("ghost", "m")
    ghost.metadata.uid = "never-created"
    await store.create(shard("ghost-0", ghost, "n1"))
    async with running(store, [GarbageCollector()]) as mgr:
        await until(lambda: _gone(store, Replica, "stale"))
        await until(lambda: _gone(store, Shard, "ghost-0"))
        assert await get_or_none(store, Replica, "kept") is not None
        assert await get_or_none(store, Shard, "kept-0") is not None
        await until(lambda: mgr.events.find(name="stale", reason="GarbageCollected"))   # recorded after the delete

        await store.delete(Model, "m")                     # the owner goes: so do its dependants
        await until(lambda: _gone(store, Replica, "kept"))
        await until(lambda: _gone(store, Shard, "kept-0"))


class CountingGC(GarbageCollector):
    def __init__(self):
        super().__init__()
        self.looks = Counter()

    async def reconcile(self, key):
        self.looks[key] += 1
        return await super().reconcile(key)


async def test_status_changes_are_not_looked_at_again_but_new_owner_references_are(store):
    m = await store.create(model("m"))
    r = await store.create(replica("r", "m", owner=m))
    gc = CountingGC()
    async with running(store, [gc]):
        await until(lambda: gc.looks["replicas/r"] == 1)
        for i in range(10):
            r = await store.patch_status(Replica, "r", {"message": f"step {i}"})
        await until(lambda: gc.ctx.cache.get(Replica, "r").status.message == "step 9")
        assert gc.looks["replicas/r"] == 1          # ten status events, the owner looked up once

        r.metadata.ownerReferences[0].uid = "uid-of-no-model"       # now owned by nothing alive
        await store.update(r)
        await until(lambda: _gone(store, Replica, "r"))
        assert gc.looks["replicas/r"] == 2


async def _gone(store, kind, name):
    return await get_or_none(store, kind, name) is None
