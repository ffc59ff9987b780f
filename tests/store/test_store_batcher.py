"""Group commit (llmgw.store.batcher) against a real etcd: batched writes keep each one's own outcome."""
from __future__ import annotations

import asyncio

import aetcd.exceptions
import pytest

from llmgw.api import Model
from llmgw.dev.process import free_port
from llmgw.store import AlreadyExists, Conflict, FencedOut, Store, StoreUnavailable
from llmgw.store.connection import Connection
from tests.store.test_store import model


def batcher(store: Store):
    return store.etcd.batcher


async def test_concurrent_writes_share_requests_and_each_lands(store):
    created = await asyncio.gather(*(store.create(model(f"m{i}", replicas=i)) for i in range(100)))
    b = batcher(store)
    assert b.transactions >= 100 and b.requests < b.transactions / 2   # they went together
    listed, _ = await store.list(Model)
    assert sorted((m.name, m.spec.replicas) for m in listed) == sorted((f"m{i}", i) for i in range(100))
    # one batch, one revision: every object written in it carries that revision
    revisions = {m.metadata.resourceVersion for m in created}
    assert len(revisions) < 100
    for m in created:
        got = await store.get(Model, m.name)
        assert got.metadata.resourceVersion == m.metadata.resourceVersion == m.revision


async def test_one_key_twice_waits_for_the_next_batch_and_compares_still_decide(store):
    """etcd refuses a request writing a key twice: those go in separate batches, so the
    compare of the second sees the first's write (one create wins, the rest AlreadyExists)."""
    results = await asyncio.gather(*(store.create(model("same", replicas=i)) for i in range(30)),
                                   *(store.create(model(f"other{i}")) for i in range(30)),
                                   return_exceptions=True)
    same, others = results[:30], results[30:]
    assert sum(not isinstance(r, Exception) for r in same) == 1
    assert all(isinstance(r, AlreadyExists) for r in same if isinstance(r, Exception))
    assert not [r for r in others if isinstance(r, Exception)]


async def test_compare_and_swap_under_batching_loses_no_update(store):
    await store.create(model("m1", replicas=0))

    async def bump() -> int:
        conflicts = 0
        while True:
            m = await store.get(Model, "m1")
            m.spec.replicas += 1
            try:
                await store.update(m)
                return conflicts
            except Conflict:
                conflicts += 1

    conflicts = await asyncio.gather(*(bump() for _ in range(40)))
    final = await store.get(Model, "m1")
    assert final.spec.replicas == 40 and final.metadata.generation == 41
    assert sum(conflicts) > 0        # they really raced


async def test_a_fenced_out_writer_fails_alone_in_a_shared_batch(store):
    lead = await store.election.campaign("controller-manager", "a", ttl=5)
    stale = store.fenced(lead.key, lead.create_revision)
    await lead.resign()
    assert await store.election.campaign("controller-manager", "b", ttl=5) is not None
    results = await asyncio.gather(*(stale.create(model(f"f{i}")) for i in range(20)),
                                   *(store.create(model(f"ok{i}")) for i in range(20)),
                                   return_exceptions=True)
    assert all(isinstance(r, FencedOut) for r in results[:20])
    assert not [r for r in results[20:] if isinstance(r, Exception)]
    names = {m.name for m in (await store.list(Model))[0]}
    assert names == {f"ok{i}" for i in range(20)}


async def test_status_patches_of_many_objects_in_one_batch(store):
    await asyncio.gather(*(store.create(model(f"m{i}")) for i in range(50)))
    patched = await asyncio.gather(*(store.patch_status(Model, f"m{i}", {"readyReplicas": i})
                                     for i in range(50)))
    assert [m.status.readyReplicas for m in patched] == list(range(50))
    for i in range(50):
        assert (await store.get(Model, f"m{i}")).status.readyReplicas == i


async def test_an_unreachable_etcd_fails_every_batched_write():
    store = Store(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    results = await asyncio.gather(*(store.create(model(f"m{i}")) for i in range(10)), return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    await store.close()


async def test_batching_can_be_turned_off(etcd):
    store = await Store(etcd.endpoint, batch_writes=False).connect()
    try:
        created = await asyncio.gather(*(store.create(model(f"m{i}")) for i in range(20)))
        assert len({m.metadata.resourceVersion for m in created}) == 20   # one request each
        assert batcher(store) is None
    finally:
        await store.close()


async def test_a_call_in_flight_when_another_caller_fails_over_gets_store_unavailable():
    """Failing over closes the old channel, which cancels the calls still on it; those
    callers must get StoreUnavailable, not a CancelledError that looks like their own
    cancellation (the batcher, two batches in flight, met this now and then)."""
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)   # accepts, never answers
    port = silent.sockets[0].getsockname()[1]
    conn = Connection(f"http://127.0.0.1:{port}", timeout=30)

    async def refused(client):
        raise aetcd.exceptions.ConnectionFailedError

    sent = asyncio.Event()

    async def get(client):
        sent.set()   # the waiter wakes once this task has yielded: inside the call, on the channel
        return await client.get(b"k")

    try:
        in_flight = asyncio.create_task(conn.call(get))
        await asyncio.wait_for(sent.wait(), 30)
        assert not in_flight.done()
        with pytest.raises(StoreUnavailable):
            await conn.call(refused)
        with pytest.raises(StoreUnavailable, match="closed by another caller"):
            await asyncio.wait_for(in_flight, 10)
    finally:
        await conn.close()
        silent.close()
