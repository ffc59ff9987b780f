"""Scheduler controller against a real etcd: binds, explains, waits for room, survives a new term."""
from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from controllers.scheduler import SchedulerCollector, SchedulerController
from controllers.settings import ControllerSettings
from llmgw.api import Node, Replica, get_condition
from llmgw.runtime.manager import Manager
from llmgw.runtime.settings import ManagerSettings
from tests.fixtures.ctrlkit import node, replica, running
from tests.fixtures.gateway import metric
from tests.fixtures.poll import until


def booked(replicas) -> list[tuple[str, int]]:
    return [(p.node, g) for r in replicas for p in r.spec.placement for g in p.gpus]


async def placed(store, name):
    r = await store.get(Replica, name)
    return r if r.spec.placement else None


async def test_binds_explains_and_binds_when_room_appears(store):
    for n in (node("a1", fabric="fab-a"), node("a2", fabric="fab-a"), node("island"),
              node("off", unschedulable=True, fabric="fab-a")):
        await store.create(n)
    sched = SchedulerController()
    async with running(store, [sched]) as m:
        await store.create(replica("wide", "w", nodes=2, gpus=8))
        wide = await until(lambda: placed(store, "wide"))
        assert {p.node for p in wide.spec.placement} == {"a1", "a2"}
        assert {p.fabric for p in wide.spec.placement} == {"fab-a"}
        assert sorted(p.rank for p in wide.spec.placement) == [0, 1]
        (placed_event,) = await until(lambda: m.events.find(name="wide", reason="Scheduled"))   # after the bind
        head, second = sorted(wide.spec.placement, key=lambda p: p.rank)
        assert placed_event.message == (f"placed rank 0 on {head.node} GPUs 0,1,2,3,4,5,6,7, "
                                        f"rank 1 on {second.node} GPUs 0,1,2,3,4,5,6,7 over fabric fab-a")

        # no node has 8 free GPUs left on a fabric: explained, not placed
        await store.create(replica("wide2", "w", nodes=2, gpus=8))
        cond = await until(lambda: _cond(store, "wide2", "Scheduled", "False"))
        assert cond.reason == "Unschedulable"
        assert cond.message.startswith("0/4 nodes: 2 insufficient GPUs, 1 cordoned, 1 no fabric;")
        assert m.events.find(name="wide2", reason="FailedScheduling")
        m.metrics.registry.register(SchedulerCollector(sched, lambda: m.is_leader))
        text = generate_latest(m.metrics.registry).decode()
        assert metric(text, "llmgw_scheduler_binds_total") == 1
        assert metric(text, "llmgw_scheduler_unschedulable_replicas", reason="insufficient GPUs") == 1

        # uncordoning one node is not enough (one fabric node); adding a second fabric node is
        off = await store.get(Node, "off")
        off.spec.unschedulable = False
        await store.update(off)
        await store.create(node("a3", fabric="fab-a"))
        wide2 = await until(lambda: placed(store, "wide2"))
        assert {p.node for p in wide2.spec.placement} == {"off", "a3"}
        # counted once the write returns, which may be after the placement is seen in the store
        text = await until(lambda: _scraped_when(m, "llmgw_scheduler_binds_total", 2), "the second bind counted")
        assert metric(text, "llmgw_scheduler_unschedulable_replicas") == 0


async def test_only_a_node_change_placement_sees_wakes_the_waiting_replicas(store):
    """A fleet's nodes write their status all the time; each wake retries every waiting
    replica, so a status change that placement does not see (the agent's version here)
    wakes none of them, and one it sees (room on a node) does (issue 34)."""
    await store.create(node("small", gpus=2))
    async with running(store, [SchedulerController(ControllerSettings(scheduler_retry=3600))]) as m:
        await store.create(replica("big", "m", gpus=4))
        await until(lambda: _cond(store, "big", "Scheduled", "False"))

        def reconciles() -> float:
            text = generate_latest(m.metrics.registry).decode()
            return metric(text, "llmgw_controller_reconcile_duration_seconds_count", controller="scheduler")

        # the reconcile that wrote Scheduled=False is counted once it returns, which may be after
        # the condition is seen in the store: a `before` taken earlier counted it as a wake
        before = await until(lambda: reconciles() or None, "the first reconcile counted")
        for i in range(10):
            await store.patch_status(Node, "small", {"agentVersion": f"v{i}"})
            await asyncio.sleep(0.05)      # each on its own (not merged by the work queue)
        await store.create(node("large", gpus=4))     # room: the one wake
        assert {p.node for p in (await until(lambda: placed(store, "big"))).spec.placement} == {"large"}
        assert reconciles() - before <= 2


async def test_deleted_replica_frees_gpus_for_a_waiting_one(store):
    await store.create(node("n1", gpus=4))
    async with running(store, [SchedulerController(ControllerSettings(scheduler_retry=60))]):
        await store.create(replica("first", "m", gpus=3))
        await until(lambda: placed(store, "first"))
        await store.create(replica("second", "m", gpus=2))
        await until(lambda: _cond(store, "second", "Scheduled", "False"))
        await store.delete(Replica, "first")
        second = await until(lambda: placed(store, "second"))   # woken by the delete, not the 60 s retry
        assert second.spec.placement[0].gpus == [0, 1]


async def test_concurrent_binds_never_share_a_gpu_and_a_new_term_respects_old_ones(store):
    for i in range(3):
        await store.create(node(f"n{i}", gpus=4))
    async with running(store, [SchedulerController(ControllerSettings(scheduler_retry=60))]):
        await asyncio.gather(*(store.create(replica(f"r{i}", f"m{i % 3}", gpus=1)) for i in range(8)))
        await until(lambda: _all_placed(store, 8))
    # a new leadership term with a fresh controller must rebuild its books from etcd
    async with running(store, [SchedulerController(ControllerSettings(scheduler_retry=60))]):
        await asyncio.gather(*(store.create(replica(f"s{i}", "late", gpus=1)) for i in range(5)))
        await until(lambda: _all_placed(store, 12))
        reps, _ = await store.list(Replica)
        loser = next(r for r in reps if not r.spec.placement)
        assert get_condition(loser.status.conditions, "Scheduled").reason == "Unschedulable"
    slots = booked(reps)
    assert len(slots) == 12 and len(set(slots)) == 12
    per_node = {n: sum(1 for s in slots if s[0] == n) for n in ("n0", "n1", "n2")}
    assert per_node == {"n0": 4, "n1": 4, "n2": 4}


async def test_a_term_regained_keeps_nothing_the_last_term_booked(store):
    """Lose leadership, regain it: the same controller's ledger of the last term (a replica
    deleted in between still holding its GPU there) must not carry over into the new one."""
    await store.create(node("n1", gpus=1))
    sched = SchedulerController(ControllerSettings(scheduler_retry=0.5))
    m = Manager(store, [sched], identity="test", settings=ManagerSettings(lease_seconds=15))
    task = asyncio.create_task(m.run())
    try:
        await asyncio.wait_for(m.leading.wait(), 30)
        await store.create(replica("first", "m", gpus=1))
        await until(lambda: placed(store, "first"))
        assert sched.ctx.term == 1
        # The term ends with its lease; the test takes the leader key at once (the manager
        # campaigns again only after noticing and a retry interval) and holds it meanwhile.
        await store.leases.revoke(m.leadership.lease_id)
        held = await store.election.campaign("controller-manager", "test-holder", 15)
        assert held is not None
        await until(lambda: not m.is_leader)
        await store.delete(Replica, "first")      # no scheduler runs: no ledger hears of it
        await store.create(replica("second", "m", gpus=1))
        await held.resign()
        await until(lambda: m.is_leader)
        assert (m.terms, sched.ctx.term, sched.ctx.cache) == (2, 2, m.cache)
        second = await until(lambda: placed(store, "second"))   # the GPU "first" held is free
        assert [(p.node, p.gpus) for p in second.spec.placement] == [("n1", [0])]
    finally:
        await asyncio.wait_for(m.stop(), 10)
        task.cancel()


async def test_spreads_replicas_of_a_model_and_honours_selector_and_engines(store):
    await store.create(node("x1", labels={"zone": "x"}))
    await store.create(node("x2", labels={"zone": "x"}))
    await store.create(node("y1", labels={"zone": "y"}, engines=("sim", "vllm")))
    async with running(store, [SchedulerController()]):
        for i in range(2):
            await store.create(replica(f"m-{i}", "m", selector={"zone": "x"}))
        a, b = [await until(lambda i=i: placed(store, f"m-{i}")) for i in range(2)]
        assert {a.spec.placement[0].node, b.spec.placement[0].node} == {"x1", "x2"}

        vr = replica("v", "v")
        vr.spec.profile.engine = "vllm"
        vr.spec.profile.launchMode = "ray"
        await store.create(vr)
        cond = await until(lambda: _cond(store, "v", "Scheduled", "False"))
        assert cond.message == "0/3 nodes: 2 missing engine ray,vllm, 1 missing engine ray"


async def _cond(store, name, type, status=None):
    r = await store.get(Replica, name)
    c = get_condition(r.status.conditions, type)
    return c if c is not None and (status is None or c.status == status) else None


async def _all_placed(store, n):
    reps, _ = await store.list(Replica)
    return sum(1 for r in reps if r.spec.placement) >= n


def _scraped_when(m, name: str, value: float) -> str | None:
    text = generate_latest(m.metrics.registry).decode()
    return text if metric(text, name) == value else None
