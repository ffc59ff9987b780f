"""Drain controller with the scheduler on a real etcd: make-before-break, stuck, resume."""
from __future__ import annotations

from controllers.drain import DrainController
from controllers.scheduler import SchedulerController
from llmgw.api import Node, Replica
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR
from tests.fixtures.ctrlkit import ReadyPlayer, ReplicaWatch, get_or_none, model, node, replica, running
from tests.fixtures.poll import until


async def setup_model(store, names, node_name="n1", replicas=None, gpus=1):
    m = await store.create(model("m", replicas=replicas or len(names)))
    for i, name in enumerate(names):
        await store.create(replica(name, "m", owner=m, gpus=gpus,
                                   placement=[{"rank": 0, "node": node_name,
                                               "gpus": list(range(i * gpus, (i + 1) * gpus))}]))
        await store.patch_status(Replica, name, {"phase": "Ready"})
    _, rev = await store.list(Replica)
    return m, rev


async def request_drain(store, name):
    n = await store.get(Node, name)
    n.spec.drain = True
    await store.update(n)


async def drain_phase(store, name, phase):
    n = await store.get(Node, name)
    return n if n.status.drain is not None and n.status.drain.phase == phase else None


async def test_drain_moves_replicas_one_at_a_time_keeping_ready_count(store):
    for n in ("n1", "n2", "n3"):
        await store.create(node(n))
    _, rev = await setup_model(store, ["r1", "r2"])
    watch = ReplicaWatch(store, "m", {"r1": True, "r2": True}, rev)
    async with running(store, [SchedulerController(), DrainController(), ReadyPlayer()]) as m:
        await request_drain(store, "n1")
        n1 = await until(lambda: drain_phase(store, "n1", "Drained"))
        reps, _ = await store.list(Replica)
        steps = m.events.find(kind="nodes", name="n1", reason="DrainStep")
    await watch.stop()
    assert n1.spec.unschedulable and n1.status.drain.remaining == 0
    assert watch.least >= 2, f"Ready replicas of m fell to {watch.least} during the drain"
    assert sorted(r.metadata.annotations[DRAINING_REPLACEMENT_FOR] for r in reps) == ["r1", "r2"]
    assert all(r.status.phase == "Ready" and r.spec.placement[0].node != "n1" for r in reps)
    assert len(watch.seen) == 4                       # two originals, two replacements, nothing more
    assert [s.message.split(": stopping ")[1] for s in steps] == ["r1", "r2"]


async def test_drain_reports_stuck_with_the_schedulers_reason_then_finishes(store):
    await store.create(node("n1"))
    await store.create(node("n2"))
    await store.create(replica("hog", "hog", gpus=8, placement=[{"rank": 0, "node": "n2", "gpus": list(range(8))}]))
    await setup_model(store, ["r1"])
    async with running(store, [SchedulerController(), DrainController(), ReadyPlayer()]):
        await request_drain(store, "n1")
        n1 = await until(lambda: drain_phase(store, "n1", "Stuck"))
        msg = n1.status.drain.message
        assert msg.startswith("cannot place replacements for r1 (replacement ")
        assert "0/2 nodes: 1 cordoned, 1 insufficient GPUs" in msg
        r1 = await store.get(Replica, "r1")
        assert r1.metadata.deletionTimestamp is None and r1.status.phase == "Ready"

        await store.create(node("n3"))          # capacity appears: the drain goes on
        await until(lambda: drain_phase(store, "n1", "Drained"))
        assert await get_or_none(store, Replica, "r1") is None


async def test_restarted_drain_resumes_without_a_second_replacement(store):
    for n in ("n1", "n2"):
        await store.create(node(n))
    _, rev = await setup_model(store, ["r1", "r2"])
    watch = ReplicaWatch(store, "m", {"r1": True, "r2": True}, rev)
    player = ReadyPlayer()
    player.hold = True                          # replacements get placed but never Ready
    async with running(store, [SchedulerController(), DrainController(), player]):
        await request_drain(store, "n1")
        first = await until(lambda: _replacement_placed(store, "r1"))
        assert (await store.get(Node, "n1")).status.drain.current == "r1"
    # a new controller-manager term with fresh controllers picks up where it was
    async with running(store, [SchedulerController(), DrainController(), ReadyPlayer()]):
        await until(lambda: drain_phase(store, "n1", "Drained"))
        reps, _ = await store.list(Replica)
    await watch.stop()
    assert first.metadata.name in {r.metadata.name for r in reps}
    assert sorted(r.metadata.annotations[DRAINING_REPLACEMENT_FOR] for r in reps) == ["r1", "r2"]
    assert len(watch.seen) == 4
    assert watch.least >= 2


async def _replacement_placed(store, orig):
    reps, _ = await store.list(Replica)
    return next((r for r in reps if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) == orig
                 and r.spec.placement), None)
