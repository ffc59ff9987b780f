"""Node lifecycle on a real etcd: NotReady on silence; lost nodes' replicas moved make-before-break,
within the disruption budget (mass silence, settle period, rate, a fresh grace for a new leader)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from controllers.nodelifecycle import NodeLifecycleController
from controllers.replica import ReplicaController
from controllers.scheduler import SchedulerController
from controllers.settings import ControllerSettings
from llmgw.api import Node, Replica, Shard, get_condition
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT
from tests.fixtures.controlplane import FAST, control_plane
from tests.fixtures.ctrlkit import (
    ReadyPlayer,
    ReplicaWatch,
    get_or_none,
    heartbeat,
    model,
    node,
    replica,
    running,
    silence,
)
from tests.fixtures.poll import until


def lifecycle(**settings) -> NodeLifecycleController:
    return NodeLifecycleController(ControllerSettings(**settings))


async def cond(store, name, type, status, reason=None):
    n = await store.get(Node, name)
    c = get_condition(n.status.conditions, type)
    return c if c is not None and c.status == status and (reason is None or c.reason == reason) else None


async def verdict(store, name, status, reason):
    return await cond(store, name, "Evicting", status, reason)


async def nodes_with_heartbeats(store, names):
    for n in names:
        await store.create(node(n))
        await heartbeat(store, n)


async def placed_on(store, names, nodes, replicas=None):
    """Ready replicas `names`, the i-th on nodes[i] (or all on nodes[0]); returns the revision after."""
    m = await store.create(model("m", replicas=replicas or len(names)))
    for i, name in enumerate(names):
        on, gpu = (nodes[i], 0) if len(nodes) > 1 else (nodes[0], i)
        await store.create(replica(name, "m", owner=m, finalizers=["test/keep"],
                                   placement=[{"rank": 0, "node": on, "gpus": [gpu]}]))
        await store.patch_status(Replica, name, {"phase": "Ready"})
    _, rev = await store.list(Replica)
    return rev


async def replacement_of(store, orig):
    reps, _ = await store.list(Replica)
    return next((r for r in reps if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) == orig), None)


async def _placed(coro):
    r = await coro
    return r if r is not None and r.spec.placement else None


async def _marked_for_deletion(store, name):
    r = await store.get(Replica, name)
    return r if r.metadata.deletionTimestamp is not None else None


async def test_a_registering_node_is_not_judged_before_its_first_heartbeat(store):
    """An agent creates its Node, then heartbeats: a Node that never reported Ready is
    registering, not silent. Judged against a registered silent node behind it in the queue."""
    await store.create(Node.model_validate({"metadata": {"name": "a-registering"}}))
    await store.create(node("b-silent"))      # Ready (it reported once), no heartbeat
    controller = lifecycle(node_grace=3600)
    controller.workers = 1                    # keys in list order: a-registering is reconciled first
    async with running(store, [controller]):
        await until(lambda: cond(store, "b-silent", "Ready", "False", "HeartbeatExpired"))
        registering = await store.get(Node, "a-registering")
        assert registering.status.conditions == []
        assert [e["reason"] for e in await store.events.list("nodes", "a-registering")] == []


async def test_not_ready_on_silence_and_ready_again(store):
    await nodes_with_heartbeats(store, ("n1", "n2"))
    async with running(store, [lifecycle(node_grace=3600)]) as m:
        await silence(store, "n1")
        c = await until(lambda: cond(store, "n1", "Ready", "False"))
        assert c.reason == "HeartbeatExpired"
        await until(lambda: m.events.find(name="n1", reason="NodeNotReady"))   # recorded after the write
        await heartbeat(store, "n1")
        c = await until(lambda: cond(store, "n1", "Ready", "True"))
        assert c.reason == "HeartbeatResumed"
        assert (await cond(store, "n2", "Ready", "True")).reason == ""     # untouched


async def test_a_lost_nodes_replicas_move_make_before_break(store):
    await nodes_with_heartbeats(store, ("n1", "n2", "n3"))
    rev = await placed_on(store, ["r1", "r2"], ["n1"])
    watch = ReplicaWatch(store, "m", {"r1": True, "r2": True}, rev)
    player = ReadyPlayer()
    player.hold = True          # replacements are placed but not Ready yet
    async with running(store, [SchedulerController(), lifecycle(node_grace=0.5), player]) as m:
        await silence(store, "n1")
        lost = await until(lambda: verdict(store, "n1", "True", "NodeLost"))
        assert "moving its replicas elsewhere" in lost.message
        assert m.events.find(name="n1", reason="NodeLost")
        for orig in ("r1", "r2"):
            repl = await until(lambda orig=orig: _placed(replacement_of(store, orig)))
            assert repl.spec.placement[0].node in ("n2", "n3")     # never back on the lost node
        # its engines may still serve: the originals stay until their replacements are Ready
        for orig in ("r1", "r2"):
            assert (await store.get(Replica, orig)).metadata.deletionTimestamp is None
        player.hold = False
        for orig in ("r1", "r2"):
            gone = await until(lambda orig=orig: _marked_for_deletion(store, orig))
            assert gone.metadata.annotations[EVICT] == "node-lost"
        (evicted,) = m.events.find(name="r1", reason="Evicted")
        assert "is Ready: deleted" in evicted.message
    await watch.stop()
    assert watch.least >= 2, f"Ready replicas of m fell to {watch.least} during the eviction"


async def test_a_node_back_before_its_replacement_is_ready_keeps_its_replicas(store):
    await nodes_with_heartbeats(store, ("n1", "n2", "n3"))
    await placed_on(store, ["r1"], ["n1"])
    player = ReadyPlayer()
    player.hold = True
    async with running(store, [SchedulerController(), lifecycle(node_grace=0.3), player]):
        await silence(store, "n1")
        repl = await until(lambda: _placed(replacement_of(store, "r1")))
        await heartbeat(store, "n1")
        back = await until(lambda: verdict(store, "n1", "False", "HeartbeatResumed"))
        assert f"replacements called off: {repl.metadata.name}" in back.message
        # it never served: it goes (kept, it would be a replica past maxSurge until scaled down)
        await until(lambda: _marked_for_deletion(store, repl.metadata.name))
        assert (await store.get(Replica, "r1")).metadata.deletionTimestamp is None


async def test_exactly_half_the_nodes_silent_holds_eviction_back(store):
    # an even split is the likeliest shape of a partition: nothing is judged lost
    await nodes_with_heartbeats(store, ("n1", "n2", "n3", "n4"))
    await placed_on(store, ["r1"], ["n1"])
    async with running(store, [SchedulerController(), lifecycle(node_grace=0.3)]) as m:
        await silence(store, "n2")
        await until(lambda: cond(store, "n2", "Ready", "False"))
        await silence(store, "n1")
        held = await until(lambda: verdict(store, "n1", "False", "MassSilence"))
        assert held.message.startswith("2/4 nodes are silent (at least 50%)")
        await until(lambda: m.events.find(name="n1", reason="MassSilence"))
        # the hold is decided where the eviction would have been: nothing was replaced
        assert await replacement_of(store, "r1") is None
        assert (await store.get(Replica, "r1")).metadata.deletionTimestamp is None


async def test_stragglers_are_judged_only_after_mass_silence_has_settled(store):
    names = ["n1", "n2", "n3", "n4"]
    await nodes_with_heartbeats(store, names)
    await placed_on(store, ["r1"], ["n1"])
    async with running(store, [SchedulerController(), lifecycle(node_grace=0.3, eviction_settle=0.5),
                               ReadyPlayer()]) as m:
        for n in ("n2", "n3"):                   # these go silent first (no race with n1's grace)
            await silence(store, n)
            await until(lambda n=n: cond(store, n, "Ready", "False"))
        await silence(store, "n1")               # now 3 of 4 are silent
        held = await until(lambda: verdict(store, "n1", "False", "MassSilence"))
        assert held.message.startswith("3/4 nodes are silent")
        assert await replacement_of(store, "r1") is None

        for n in names[1:3]:                     # two come back: 1/4 silent, but only just
            await heartbeat(store, n)
        settling = await until(lambda: verdict(store, "n1", "False", "Settling"))
        assert "0.5s after it" in settling.message
        await until(lambda: m.events.find(name="n1", reason="Settling"))
        await until(lambda: verdict(store, "n1", "True", "NodeLost"))   # settled and still silent
        await until(lambda: _placed(replacement_of(store, "r1")))
        lost = await until(lambda: _marked_for_deletion(store, "r1"))
        assert lost.metadata.annotations[EVICT] == "node-lost"


async def test_a_healing_partition_rebuilds_nothing(store):
    # 4 of 5 agents silent, coming back one by one: the moment the silent share drops
    # below half, the two still silent are not judged lost but given the settle period
    names = ["n1", "n2", "n3", "n4", "n5"]
    await nodes_with_heartbeats(store, names)
    rev = await placed_on(store, ["r1", "r2", "r3", "r4"], names[:4])
    watch = ReplicaWatch(store, "m", {f"r{i}": True for i in range(1, 5)}, rev)
    async with running(store, [SchedulerController(), lifecycle(node_grace=0.3, eviction_settle=3600), ReadyPlayer()]):
        for n in names[:4]:
            await silence(store, n)
        for n in names[:4]:
            await until(lambda n=n: verdict(store, n, "False", "MassSilence"))
        for n in ("n1", "n2"):
            await heartbeat(store, n)
            await until(lambda n=n: verdict(store, n, "False", "HeartbeatResumed"))
        for n in ("n3", "n4"):                   # 2/5 silent now: past mass silence, settling
            held = await until(lambda n=n: verdict(store, n, "False", "Settling"))
            assert "3600s after it" in held.message
        for n in ("n3", "n4"):
            await heartbeat(store, n)
            await until(lambda n=n: verdict(store, n, "False", "HeartbeatResumed"))
    await watch.stop()
    assert watch.seen == {"r1", "r2", "r3", "r4"} and watch.least == 4   # no replacement, nothing deleted


async def test_nodes_are_judged_lost_at_a_bounded_rate(store):
    names = ["n1", "n2", "n3", "n4", "n5"]
    await nodes_with_heartbeats(store, names)
    await placed_on(store, ["r1", "r2"], ["n1", "n2"])
    async with running(store, [SchedulerController(), lifecycle(node_grace=0.3, eviction_rate=0.001)]) as m:
        await silence(store, "n1")
        await silence(store, "n2")               # 2/5: not a mass silence

        async def reasons():
            got = {}
            for n in ("n1", "n2"):
                c = get_condition((await store.get(Node, n)).status.conditions, "Evicting")
                got[n] = c.reason if c else None
            return got if sorted(got.values(), key=str) == ["NodeLost", "RateLimited"] else None
        got = await until(reasons)
        waiting = next(n for n, why in got.items() if why == "RateLimited")
        first = next(n for n, why in got.items() if why == "NodeLost")
        assert "at most 0.001 per second" in (await verdict(store, waiting, "False", "RateLimited")).message
        assert m.events.find(name=waiting, reason="RateLimited")
        await until(lambda: _placed(replacement_of(store, "r1" if first == "n1" else "r2")))
        assert await replacement_of(store, "r2" if first == "n1" else "r1") is None


async def test_a_new_leader_gives_silent_nodes_a_fresh_grace(store):
    await nodes_with_heartbeats(store, ("n1", "n2", "n3"))
    await placed_on(store, ["r1"], ["n1"])
    nlc = lifecycle(node_grace=3600)            # one controller object through two terms, as in a process
    async with running(store, [nlc]):
        await silence(store, "n1")
        await until(lambda: cond(store, "n1", "Ready", "False", "HeartbeatExpired"))
    async with running(store, [SchedulerController(), nlc]) as m:
        fresh = await until(lambda: verdict(store, "n1", "False", "LeaderChanged"))
        assert "fresh grace of 3600s" in fresh.message
        assert m.events.find(name="n1", reason="LeaderChanged")
        assert await replacement_of(store, "r1") is None


async def test_only_the_node_lifecycle_verdict_counts_not_how_long_ago_ready_went_false(store):
    # n1 has been NotReady for two hours, as a previous leader recorded; the replica
    # controller does not judge it lost from that timestamp: the node lifecycle controller
    # gives it a fresh grace first, and nothing else decides
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    n1 = node("n1")
    n1.status.conditions[0] = n1.status.conditions[0].model_copy(update={
        "status": "False", "reason": "HeartbeatExpired", "lastTransitionTime": long_ago})
    await store.create(n1)
    await nodes_with_heartbeats(store, ("n2", "n3"))
    await placed_on(store, ["r1"], ["n1"])
    async with running(store, [ReplicaController(), lifecycle(node_grace=600)]) as m:
        await until(lambda: verdict(store, "n1", "False", "LeaderChanged"))
        # the replica controller went on to make shards (n1 reports no address): it did not fail r1
        await until(lambda: m.events.find(name="r1", reason="NoHeadAddress"))
        assert not m.events.find(name="r1", reason="ReplicaFailed")


# ------------------------------------------- with the replica controller and agents

def _ready(cp, model_name):
    return next((r for r in cp.replicas(model_name) if r.status.phase == "Ready"), None)


async def _evicted_and_replaced(cp):
    """m's replica on a node whose agent falls silent: moved to the other node, original Terminating."""
    await cp.store.create(model("m"))
    orig = await until(lambda: _ready(cp, "m"))
    lost = orig.spec.placement[0].node
    await cp.agents.silence(lost)
    await until(lambda: (r := cp.cache.get(Replica, orig.name)) and r.metadata.deletionTimestamp and r)
    repl = _ready(cp, "m")
    assert repl is not None and repl.spec.placement[0].node != lost
    # the original's shard stays: only its agent can say its engine is gone
    await until(lambda: (s := cp.cache.get(Shard, f"{orig.name}-0")) and s.metadata.deletionTimestamp)
    return orig, lost


async def test_a_lost_nodes_gpus_stay_booked_until_its_agent_confirms(store):
    async with control_plane(store, nodes=("n1", "n2"), gpus=1, placer=SchedulerController(),
                             extra=(NodeLifecycleController(FAST),)) as cp:
        orig, lost = await _evicted_and_replaced(cp)
        await store.create(model("m2"))
        await until(lambda: (r := next(iter(cp.replicas("m2")), None)) and
                    (c := get_condition(r.status.conditions, "Scheduled")) and c.reason == "Unschedulable")
        # the node's heartbeat comes back, its agent has not yet confirmed: the GPU stays booked
        await heartbeat(store, lost)
        await until(lambda: verdict(store, lost, "False", "HeartbeatResumed"))
        await until(lambda: (r := next(iter(cp.replicas("m2")), None)) and
                    (c := get_condition(r.status.conditions, "Scheduled")) and
                    c.message == "0/2 nodes: 2 insufficient GPUs")
        # the agent confirms its engine stopped: the original goes, m2 gets the GPU
        await cp.agents.revive(lost)
        await until(lambda: cp.cache.get(Replica, orig.name) is None)
        m2 = await until(lambda: _ready(cp, "m2"))
        assert m2.spec.placement[0].node == lost
        assert not cp.events("ShardAbandoned")


async def test_deleting_a_lost_node_releases_its_shards(store):
    async with control_plane(store, nodes=("n1", "n2"), gpus=1, placer=SchedulerController(),
                             extra=(NodeLifecycleController(FAST),)) as cp:
        orig, lost = await _evicted_and_replaced(cp)
        await store.delete(Node, lost)        # `llmgw delete node`: the operator gives up on the agent
        await until(lambda: cp.cache.get(Replica, orig.name) is None)
        assert await get_or_none(store, Shard, f"{orig.name}-0") is None
        (abandoned,) = cp.events("ShardAbandoned", orig.name)
        assert f"node {lost} was deleted" in abandoned.message

