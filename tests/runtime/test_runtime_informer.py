"""Informers against a real etcd: list+watch into the cache, relist after compaction."""
import asyncio

from llmgw.api import Model, ModelSpec, ObjectMeta, Profile
from llmgw.runtime.cache import Cache
from llmgw.runtime.informer import HeartbeatInformer, Informer
from llmgw.store import Compactor
from tests.fixtures.poll import until


def model(name: str) -> Model:
    return Model(metadata=ObjectMeta(name=name), spec=ModelSpec(profiles=[Profile(engine="sim")]))


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, kind, type, obj):
        self.events.append((type, obj if isinstance(obj, str) else obj.metadata.name))


async def test_informer_lists_then_watches_into_cache(store):
    await store.create(model("before"))
    cache, rec = Cache(), Recorder()
    inf = Informer(store, "models", cache, rec)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 20)
        assert rec.events == [("ADDED", "before")]
        await store.create(model("after"))
        await store.patch_status(Model, "after", {"readyReplicas": 3})
        await until(lambda: (cache.get(Model, "after") or model("x")).status.readyReplicas == 3)
        await store.delete(Model, "before")
        await until(lambda: cache.get(Model, "before") is None)
        assert [e for e in rec.events if e[1] == "after"][:2] == [("ADDED", "after"), ("MODIFIED", "after")]
        assert rec.events[-1] == ("DELETED", "before")
        assert sorted(m.name for m in cache.list(Model)) == ["after"]
        assert inf.lists == 1
    finally:
        task.cancel()


async def test_a_silent_stream_is_reopened_where_it_left_off(store):
    """The watchdog re-opens a stream with no events; what comes after is seen once, with no relist."""
    cache, rec = Cache(), Recorder()
    inf = Informer(store, "models", cache, rec, idle_timeout=0.4)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 20)
        await store.create(model("m1"))
        await until(lambda: cache.get(Model, "m1") is not None)
        await until(lambda: inf.reopens >= 2)
        await store.create(model("m2"))
        await store.patch_status(Model, "m2", {"readyReplicas": 2})
        await until(lambda: (cache.get(Model, "m2") or model("x")).status.readyReplicas == 2)
        assert rec.events == [("ADDED", "m1"), ("ADDED", "m2"), ("MODIFIED", "m2")]
        assert inf.lists == 1
    finally:
        task.cancel()


class Gated:
    """A lister-watcher that opens its (real) watch only when the test lets it: changes in between go unseen."""

    def __init__(self, lw):
        self.lw = lw
        self.gate = asyncio.Event()

    async def list(self):
        return await self.lw.list()

    async def watch(self, from_revision):
        await self.gate.wait()
        async for ev in self.lw.watch(from_revision):
            yield ev

    def after_error(self, err):
        return self.lw.after_error(err)


async def test_informer_relists_after_compaction_and_reports_vanished(store):
    await store.create(model("gone"))
    await store.create(model("stays"))
    cache, rec = Cache(), Recorder()
    inf = Informer(store, "models", cache, rec)
    inf.reflector.lw = gated = Gated(inf.reflector.lw)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 20)
        await store.delete(Model, "gone")
        await store.create(model("new"))
        await Compactor(store.etcd, keep=0).compact()
        gated.gate.set()
        await until(lambda: inf.lists >= 2)
        await until(lambda: cache.get(Model, "gone") is None and cache.get(Model, "new") is not None)
        assert ("DELETED", "gone") in rec.events
        assert ("ADDED", "new") in rec.events
        # and it keeps watching after the relist
        await store.create(model("later"))
        await until(lambda: cache.get(Model, "later") is not None)
    finally:
        task.cancel()


async def test_heartbeat_informer_tracks_live_keys(store):
    await store.heartbeats.beat("n1", ttl=30)
    cache, rec = Cache(), Recorder()
    inf = HeartbeatInformer(store, cache, rec, idle_timeout=1.0)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 20)
        assert cache.heartbeats() == {"n1"}
        await store.heartbeats.beat("n2", ttl=30)
        await store.heartbeats.beat("n2", ttl=30)    # a refresh is not a new event
        await until(lambda: cache.heartbeats() == {"n1", "n2"})
        await store.kv.delete("/llmgw/heartbeat/n1")
        await until(lambda: cache.heartbeats() == {"n2"})
        assert rec.events == [("ADDED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]
        # n2's beats re-bind its key (a write each): none reaches the handler, yet each moves the
        # watch on, so the watch re-opened when silent starts after them, not after n1's deletion:
        # etcd's history compacted up to the last of them, nothing is listed again
        for _ in range(4):
            await store.heartbeats.beat("n2", ttl=30)
            await Compactor(store.etcd, keep=1).compact()
            await asyncio.sleep(0.5)
        assert inf.lists == 1
        assert rec.events == [("ADDED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]
    finally:
        task.cancel()
