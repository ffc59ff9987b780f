"""Compaction (llmgw.store.compaction) on a real etcd: it keeps the last N revisions, and the
controller manager runs it as a leader-only runnable."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from llmgw.api import Model
from llmgw.runtime.manager import Manager
from llmgw.runtime.settings import ManagerSettings
from llmgw.store import Compacted, Compactor, Store
from tests.fixtures.ctrlkit import model
from tests.fixtures.poll import until


async def _history(store: Store, writes: int) -> None:
    await store.create(model("m"))
    for i in range(writes):
        await store.patch_status(Model, "m", {"replicas": i})


async def test_compaction_keeps_the_last_n_revisions(store):
    await _history(store, 30)
    compactor = Compactor(store.etcd, keep=5)
    current = await store.revision()
    assert await compactor.compact() == compactor.compacted_to == current - 5
    # a watch from the first revision kept starts; one from before it must relist
    assert await store.revision(since=current - 5) == current
    events = store.watch(Model, from_revision=current - 4)
    assert (await anext(events)).revision == current - 4
    await events.aclose()
    with pytest.raises(Compacted):
        await anext(store.watch(Model, from_revision=current - 5))
    # compacted already up to there: etcd's refusal (gRPC OUT_OF_RANGE) means nothing to do
    assert await compactor.compact() is None
    assert await Compactor(store.etcd, keep=current).compact() is None     # no history that old


async def test_a_read_at_a_compacted_revision_raises_compacted_and_one_ahead_does_not(store):
    """etcd answers both with gRPC code OUT_OF_RANGE; revision(since=) tells them apart."""
    await _history(store, 5)
    current = await store.revision()
    await store.etcd.compact(current - 1)
    with pytest.raises(Compacted):
        await store.revision(since=current - 3)
    with pytest.raises(Compacted):
        await store.etcd.compact(current - 2)
    assert await store.revision(since=current) == current          # nothing written after it yet
    assert await store.revision(since=current + 10) == current


async def test_the_compactor_runs_on_the_leader_only_while_it_leads(etcd):
    async with contextlib.AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(Store(etcd.endpoint)) for _ in range(2)]
        compactors = [Compactor(s.etcd, keep=5, interval=0.1) for s in stores]
        managers = [Manager(s, [], identity=f"m{i}", settings=ManagerSettings(lease_seconds=2), runnables=[c])
                    for i, (s, c) in enumerate(zip(stores, compactors, strict=True))]
        for m in managers:
            stack.callback(asyncio.create_task(m.run()).cancel)
            stack.push_async_callback(m.stop)
        await _history(stores[0], 30)
        await until(lambda: any(m.is_leader for m in managers))
        lead = next(i for i, m in enumerate(managers) if m.is_leader)
        first = await until(lambda: compactors[lead].compacted_to)
        await stores[0].patch_status(Model, "m", {"replicas": 99})
        await until(lambda: (compactors[lead].compacted_to or 0) > first)     # it runs again
        assert compactors[1 - lead].compacted_to is None                     # the other one never ran
        await managers[lead].stop()
        await until(lambda: managers[1 - lead].is_leader)
        await stores[0].patch_status(Model, "m", {"replicas": 100})
        await until(lambda: compactors[1 - lead].compacted_to)               # the new leader's now


async def test_a_full_etcd_refuses_writes_clearly_and_the_compactor_brings_it_back(tmp_path):
    """etcd's space quota reached (a 16 MiB --quota-backend-bytes, filled by the history of one
    key): every write is refused with StoreFull (503, reason StorageFull, saying what to do), reads
    still answer, and the compactor's recovery (compact, defragment, disarm) makes writes work
    again (issue 33)."""
    from llmgw.api.errors import Unavailable
    from llmgw.dev.etcd import etcd_cluster
    from llmgw.store import StoreFull

    etcd = etcd_cluster(tmp_path, extra_args=["--quota-backend-bytes", str(16 << 20)]).start()
    try:
        async with Store(etcd.endpoint) as store:
            await store.create(model("kept"))
            blob = bytes(range(256)) * 4096                      # 1 MiB
            with pytest.raises(StoreFull) as err:
                for _ in range(64):
                    await store.kv.put("/llmgw/test/blob", blob)
            assert isinstance(err.value, Unavailable) and err.value.reason == "StorageFull"
            assert "space quota is exhausted" in str(err.value)
            assert (await store.get(Model, "kept")).name == "kept"          # reads still answer
            with pytest.raises(StoreFull):
                await store.create(model("refused"))
            compactor = Compactor(store.etcd, keep=1)
            assert await compactor.recover() and compactor.recoveries == 1
            await store.create(model("accepted"))                           # writes again
            assert await compactor.recover() is False                       # no alarm left
    finally:
        etcd.stop()
