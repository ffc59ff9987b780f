"""Node lifecycle on a real etcd: NotReady on silence, replacement after grace, mass silence holds back."""
from __future__ import annotations

from llmgw.api import get_condition
from llmgw.runtime.annotations import DRAINING_REPLACEMENT_FOR, EVICT

from controllers.nodelifecycle import NodeLifecycleController
from controllers.scheduler import SchedulerController
from tests.helpers.ctrlkit import heartbeat, model, node, replica, running, silence, until


async def cond(store, name, type, status, reason=None):
    n = await store.get("nodes", name)
    c = get_condition(n.status.conditions, type)
    return c if c is not None and c.status == status and (reason is None or c.reason == reason) else None


async def placed_on_lost(store, names, lost):
    m = await store.create(model("m", replicas=len(names)))
    for i, name in enumerate(names):
        await store.create(replica(name, "m", owner=m, finalizers=["test/keep"],
                                   placement=[{"rank": 0, "node": lost, "gpus": [i]}]))
        await store.patch_status("replicas", name, {"phase": "Ready"})


async def replacement_of(store, orig):
    reps, _ = await store.list("replicas")
    return next((r for r in reps if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) == orig), None)


async def test_not_ready_on_silence_and_ready_again(store):
    for n in ("n1", "n2"):
        await store.create(node(n))
        await heartbeat(store, n)
    async with running(store, [NodeLifecycleController()], node_grace=3600) as m:
        await silence(store, "n1")
        c = await until(lambda: cond(store, "n1", "Ready", "False"))
        assert c.reason == "HeartbeatExpired"
        await until(lambda: m.events.find(name="n1", reason="NodeNotReady"))   # recorded after the write
        await heartbeat(store, "n1")
        c = await until(lambda: cond(store, "n1", "Ready", "True"))
        assert c.reason == "HeartbeatResumed"
        assert (await cond(store, "n2", "Ready", "True")).reason == ""     # untouched


async def test_lost_node_replicas_are_replaced_after_grace(store):
    for n in ("n1", "n2", "n3"):
        await store.create(node(n))
        await heartbeat(store, n)
    await placed_on_lost(store, ["r1", "r2"], "n1")
    async with running(store, [SchedulerController(), NodeLifecycleController()], node_grace=0.5) as m:
        await silence(store, "n1")
        for orig in ("r1", "r2"):
            repl = await until(lambda orig=orig: _placed(replacement_of(store, orig)))
            assert repl.spec.placement[0].node in ("n2", "n3")     # never back on the lost node
            # the lost one is marked in a later step than its replacement's placement
            lost = await until(lambda orig=orig: _marked_for_deletion(store, orig))
            assert lost.metadata.annotations[EVICT] == "node-lost"
        await until(lambda: m.events.find(name="r1", reason="Evicted"))


async def test_mass_silence_holds_eviction_back_until_most_nodes_return(store):
    names = ["n1", "n2", "n3", "n4"]
    for n in names:
        await store.create(node(n))
        await heartbeat(store, n)
    await placed_on_lost(store, ["r1"], "n1")
    async with running(store, [SchedulerController(), NodeLifecycleController()], node_grace=0.3) as m:
        for n in ("n2", "n3"):                   # these go silent first (no race with n1's grace)
            await silence(store, n)
            await until(lambda n=n: cond(store, n, "Ready", "False"))
        await silence(store, "n1")               # now 3 of 4 are silent: more than half
        held = await until(lambda: cond(store, "n1", "EvictionHeldBack", "True"))
        assert held.reason == "EvictionHeldBack" and held.message.startswith("3/4 nodes are silent")
        await until(lambda: m.events.find(name="n1", reason="EvictionHeldBack"))
        # the hold is decided where the eviction would have been: nothing was replaced
        assert await replacement_of(store, "r1") is None
        assert (await store.get("replicas", "r1")).metadata.deletionTimestamp is None

        for n in names[1:3]:                     # two come back: 1/4 silent
            await heartbeat(store, n)
        await until(lambda: _placed(replacement_of(store, "r1")))
        # marked in a later step than its replacement's placement
        lost = await until(lambda: _marked_for_deletion(store, "r1"))
        assert lost.metadata.annotations[EVICT] == "node-lost"
        c = await cond(store, "n1", "EvictionHeldBack", "False")
        assert c is not None and c.reason == "EvictionAllowed"


async def _placed(coro):
    r = await coro
    return r if r is not None and r.spec.placement else None


async def _marked_for_deletion(store, name):
    r = await store.get("replicas", name)
    return r if r.metadata.deletionTimestamp is not None else None
