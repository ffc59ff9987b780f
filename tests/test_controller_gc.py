"""Garbage collector on a real etcd: orphans go, owned objects stay, history is compacted."""
from __future__ import annotations

import pytest

from llmgw.store import Compacted

from controllers.gc import GarbageCollector
from tests.helpers.ctrlkit import get_or_none, model, replica, running, shard, until


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
        await until(lambda: _gone(store, "replicas", "stale"))
        await until(lambda: _gone(store, "shards", "ghost-0"))
        assert await get_or_none(store, "replicas", "kept") is not None
        assert await get_or_none(store, "shards", "kept-0") is not None
        assert mgr.events.find(name="stale", reason="GarbageCollected")

        await store.delete("models", "m")                     # the owner goes: so do its dependants
        await until(lambda: _gone(store, "replicas", "kept"))
        await until(lambda: _gone(store, "shards", "kept-0"))


async def test_history_is_compacted_periodically(store):
    await store.create(model("m"))
    for i in range(30):
        await store.patch_status("models", "m", {"replicas": i})
    gc = GarbageCollector()
    async with running(store, [gc], compact_keep=5, compact_interval=0.2):
        first = await until(lambda: gc.compacted_to)
        await store.patch_status("models", "m", {"replicas": 99})
        await until(lambda: gc.compacted_to and gc.compacted_to > first)   # it runs again
    with pytest.raises(Compacted):
        async for _ in store.watch("models", from_revision=2):
            break


async def _gone(store, kind, name):
    return await get_or_none(store, kind, name) is None
