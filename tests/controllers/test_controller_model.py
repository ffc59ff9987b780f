"""Model controller: plan() decisions, and the real thing with fake agents."""
from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta, timezone

from controllers.model import plan, replica_name
from llmgw.api import Model, Replica, Shard, template_hash
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT, MODEL_LABEL, SHARDS_FINALIZER
from llmgw.runtime.cache import Cache
from llmgw.runtime.informer import Informer
from tests.fixtures.controlplane import control_plane
from tests.fixtures.poll import until

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def model(name="m", replicas=2, **spec) -> Model:
    spec.setdefault("profiles", [{"engine": "sim"}])
    return Model.model_validate({"metadata": {"name": name, "uid": "u1", "generation": 3},
                                 "spec": {"replicas": replicas, **spec}})


def rep(name, m: Model, phase="Ready", placed=True, age=100, thash=None, annotations=None, profile=0) -> Replica:
    return Replica.model_validate({
        "metadata": {"name": name, "annotations": annotations or {},
                     "creationTimestamp": (NOW - timedelta(seconds=age)).isoformat()},
        "spec": {"model": m.name, "templateHash": thash or template_hash(m.spec), "profileIndex": profile,
                 "profile": m.spec.profiles[profile].model_dump(),
                 "placement": [{"rank": 0, "node": "n1"}] if placed else []},
        "status": {"phase": phase}})


def deleted(p):
    return sorted(r.name for r, _, _ in p.delete)


# ------------------------------------------------------------------ plan()

def test_replica_names_fit_shard_names_in_a_dns_label():
    name = replica_name("x" * 63, "0123456789")
    assert re.fullmatch(r"x+-0123456789-[a-z0-9]{5}", name) and len(name) <= 60


def test_scale_down_removes_unplaced_and_failed_then_ready_ones_while_enough_stay_ready():
    m = model(replicas=1)
    rs = [rep("ready-old", m, age=500), rep("ready-new", m, age=10), rep("starting", m, phase="Starting"),
          rep("pending", m, phase="Pending", placed=False), rep("failed", m, phase="Failed")]
    p = plan(m, rs, NOW)
    # never the one still starting (kserve#1247): the surplus waits until it is Ready
    assert [r.name for r, _, _ in p.delete] == ["pending", "failed", "ready-new"]
    assert p.create == []
    # once it is Ready, it may go (the newest)
    p = plan(m, [rep("ready-old", m, age=500), rep("starting", m, age=5)], NOW)
    assert [r.name for r, _, _ in p.delete] == ["starting"]


def test_scale_down_keeps_a_starting_replica_and_as_many_ready_ones_as_wanted():
    m = model(replicas=1)
    p = plan(m, [rep("ready", m), rep("s1", m, phase="Starting"), rep("s2", m, phase="Scheduled")], NOW)
    assert p.delete == []
    assert plan(model(replicas=0), [rep("ready", m), rep("s1", m, phase="Starting")], NOW).delete[0][0].name == "ready"


def test_scale_down_prefers_the_replica_whose_removal_frees_whole_nodes():
    m = model(replicas=1)
    shared = Replica.model_validate({**rep("shared", m, age=10).model_dump(mode="json")})
    alone = Replica.model_validate({**rep("alone", m, age=500).model_dump(mode="json")})
    alone.spec.placement[0].node = "n2"
    on = {"n1": 2, "n2": 1}                  # n1 also runs another model's replica
    p = plan(m, [shared, alone], NOW, replicas_on=lambda node: on[node])
    assert [r.name for r, _, _ in p.delete] == ["alone"]      # though it is the older
    assert [r.name for r, _, _ in plan(m, [shared, alone], NOW).delete] == ["shared"]   # else: the newest


def test_scale_up_creates_the_missing_and_reports_status():
    m = model(replicas=3)
    p = plan(m, [rep("a", m), rep("b", m, phase="Starting")], NOW)
    assert p.create == [0] and p.delete == []
    assert p.status["replicas"] == 2 and p.status["readyReplicas"] == 1 and p.status["updatedReplicas"] == 2
    assert p.status["templateHash"] == template_hash(m.spec) and p.status["observedGeneration"] == 3
    avail = next(c for c in p.status["conditions"] if c["type"] == "Available")
    assert avail["status"] == "False"


def test_a_replica_failing_again_and_again_shows_as_a_crash_loop():
    m = model(replicas=1)

    def progressing(streak):
        r = Replica.model_validate({**rep("a", m).model_dump(mode="json"), "status": {
            "phase": "Failed", "consecutiveFailures": streak,
            "conditions": [{"type": "Ready", "status": "False", "reason": "Rebuilding",
                            "message": "shard a-0 on n1 failed\nlast lines of its log:\nOSError: no such file"}]}})
        return next(c for c in plan(m, [r], NOW).status["conditions"] if c["type"] == "Progressing")

    assert (progressing(1)["status"], progressing(1)["reason"]) == ("True", "ScalingReplicas")
    looping = progressing(2)
    assert (looping["status"], looping["reason"]) == ("False", "CrashLoop")
    assert looping["message"] == ("replica a failed 2 times in a row: shard a-0 on n1 failed\n"
                                  "last lines of its log:\nOSError: no such file")


def test_rolling_update_is_make_before_break_within_surge():
    m = model(replicas=2)                   # maxSurge 1, maxUnavailable 0
    old = [rep("o1", m, thash="old"), rep("o2", m, thash="old")]
    p = plan(m, old, NOW)
    assert p.create == [0] and p.delete == []                      # surge one, delete nothing
    p = plan(m, old + [rep("n1", m, phase="Starting")], NOW)
    assert p.create == [] and p.delete == []                       # new one not Ready: wait
    p = plan(m, old + [rep("n1", m)], NOW)
    assert len(p.delete) == 1 and p.delete[0][0].name in ("o1", "o2") and p.create == []
    prog = next(c for c in p.status["conditions"] if c["type"] == "Progressing")
    assert prog["reason"] == "ReplicasUpdating"


def test_rolling_update_with_max_unavailable_breaks_first_and_drops_unready_old_at_once():
    m = model(replicas=2, update={"maxSurge": 0, "maxUnavailable": 1})
    p = plan(m, [rep("o1", m, thash="old"), rep("o2", m, thash="old")], NOW)
    assert p.create == [] and len(p.delete) == 1
    m2 = model(replicas=2)
    p = plan(m2, [rep("o1", m2, thash="old"), rep("o2", m2, thash="old", phase="Failed")], NOW)
    assert deleted(p) == ["o2"]


def test_unplaced_past_deadline_moves_to_next_profile():
    m = model(replicas=1, profiles=[{"engine": "sim", "gpusPerNode": 8}, {"engine": "sim"}],
              placementDeadlineSeconds=60)
    young = plan(m, [rep("r", m, phase="Pending", placed=False, age=20)], NOW)
    assert young.create == [] and young.delete == [] and 39 <= young.requeue_after <= 41
    p = plan(m, [rep("r", m, phase="Pending", placed=False, age=61)], NOW)
    assert p.create == [1] and deleted(p) == ["r"] and p.delete[0][1] == "PlacementDeadline"
    last = plan(m, [rep("r", m, phase="Pending", placed=False, age=600, profile=1)], NOW)
    assert last.create == [] and last.delete == []                 # no profile after the last


def test_drain_replacement_and_original_are_not_fought():
    m = model(replicas=2)
    rs = [rep("a", m), rep("orig", m, annotations={EVICT: "drain"}),
          rep("repl", m, phase="Starting", annotations={DRAINING_REPLACEMENT_FOR: "orig"})]
    p = plan(m, rs, NOW)
    assert p.create == [] and p.delete == []          # three replicas for two: tolerated
    p = plan(model(replicas=1), rs, NOW)
    assert deleted(p) == ["a"]                        # scale-down never picks the drain pair


def test_evicted_replica_without_replacement_is_replaced_then_removed():
    m = model(replicas=1)
    p = plan(m, [rep("e", m, annotations={EVICT: "node-lost"})], NOW)
    assert p.create == [0] and p.delete == []         # make first...
    p = plan(m, [rep("e", m, annotations={EVICT: "node-lost"}), rep("new", m)], NOW)
    assert deleted(p) == ["e"]                        # ...then break


# ------------------------------------------------------- with etcd and agents

def spec_model(name, replicas, **spec) -> Model:
    spec.setdefault("profiles", [{"engine": "sim"}])
    return Model.model_validate({"metadata": {"name": name}, "spec": {"replicas": replicas, **spec}})


def ready(cp, name):
    return [r for r in cp.replicas(name) if r.status.phase == "Ready"]


async def test_model_becomes_ready_then_scales_up_and_down(store):
    async with control_plane(store) as cp:
        m = await store.create(spec_model("m", 2))
        await until(lambda: len(ready(cp, "m")) == 2)
        st = await until(lambda: (x := cp.cache.get(Model, "m")) and x.status.readyReplicas == 2 and x.status)
        assert st.templateHash == template_hash(m.spec) and st.updatedReplicas == 2
        assert {c.type: c.status for c in st.conditions} == {"Available": "True", "Progressing": "True"}
        for r in cp.replicas("m"):
            assert r.name.startswith(f"m-{st.templateHash}-")
            assert r.metadata.labels[MODEL_LABEL] == "m" and SHARDS_FINALIZER in r.metadata.finalizers
            assert r.metadata.ownerReferences[0].uid == m.metadata.uid

        cp.agents.hold = lambda shard: True            # new replicas never get Ready
        cur = await store.get(Model, "m")
        cur.spec.replicas = 3
        await store.update(cur)
        starting = await until(lambda: next((r.name for r in cp.replicas("m") if r.status.phase == "Starting"), None))
        readies = {r.name for r in ready(cp, "m")}
        cur = await store.get(Model, "m")
        cur.spec.replicas = 2
        cur = await store.update(cur)
        # the model controller has planned the new generation, and kept the one still starting
        await until(lambda: cp.cache.get(Model, "m").status.observedGeneration == cur.metadata.generation)
        assert starting in {r.name for r in cp.replicas("m")} and len(cp.replicas("m")) == 3
        cp.agents.hold = lambda shard: False
        await cp.agents.release(None)                             # it gets Ready: now it may go (the newest)
        await until(lambda: len(cp.replicas("m")) == 2)
        assert {r.name for r in cp.replicas("m")} == readies
        # and it is torn down completely: shards stopped, finalizer released, object gone
        await until(lambda: cp.cache.get(Replica, starting) is None
                    and cp.cache.index(Shard, "replica", starting) == [])
        assert cp.agents.transitions.count((f"{starting}-0", "Stopped")) == 1


async def test_a_scale_up_is_one_event_per_batch_naming_the_first_replicas(store):
    async with control_plane(store, gpus=8) as cp:
        await store.create(spec_model("burst", 5))
        await until(lambda: len(cp.replicas("burst")) == 5)
        await until(lambda: cp.events("ReplicaCreated", "burst"), "the event")
        [ev] = cp.events("ReplicaCreated", "burst")
        names = sorted(r.name for r in cp.replicas("burst"))
        assert ev.message.startswith("created 5 replicas: ") and " and 2 more (profile 0: sim, " in ev.message
        assert sum(n in ev.message for n in names) == 3


async def test_rolling_update_never_drops_below_spec_replicas_ready(store):
    async with control_plane(store) as cp:
        await store.create(spec_model("m", 2))
        await until(lambda: len(ready(cp, "m")) == 2)
        old = {r.name for r in cp.replicas("m")}

        seen_min = [99]     # Ready, not deleting, as an independent watcher sees it after every event
        watched = Cache()

        def observe(kind, type, obj):
            n = sum(1 for r in watched.list(Replica)
                    if r.status.phase == "Ready" and r.metadata.deletionTimestamp is None)
            seen_min[0] = min(seen_min[0], n)
        inf = Informer(store, "replicas", watched, observe)
        task = asyncio.create_task(inf.run())
        try:
            await asyncio.wait_for(inf.synced.wait(), 30)
            cp.agents.hold = lambda shard: shard.spec.replica not in old
            cur = await store.get(Model, "m")
            cur.spec.profiles[0].env = {"NEW": "1"}
            await store.update(cur)
            new_hash = template_hash(cur.spec)
            await until(lambda: any(r.spec.templateHash == new_hash and r.status.phase == "Starting"
                                    for r in cp.replicas("m")), "the surge replica Starting")
            # A marker: a new generation of the Model with the same template, written once the
            # controller's cache holds the Starting surge replica. When the Model's status has
            # observed it, the controller has planned from that view (and deleted what it meant
            # to: it deletes before it writes status). The surge replica is not Ready: no old
            # replica may be going.
            marker = await store.get(Model, "m")
            marker.spec.placementDeadlineSeconds += 1
            marker = await store.update(marker)
            await until(lambda: cp.cache.get(Model, "m").status.observedGeneration == marker.metadata.generation,
                        "the model controller to observe the marker generation")
            items, _ = await store.list(Replica)
            assert {r.name for r in items if r.spec.templateHash != new_hash and not r.metadata.deletionTimestamp} \
                == old
            assert len(items) == 3                                      # maxSurge 1
            await cp.agents.release()
            await until(lambda: len(ready(cp, "m")) == 2
                        and all(r.spec.templateHash == new_hash for r in cp.replicas("m")))
            st = await until(lambda: (x := cp.cache.get(Model, "m")) and x.status.updatedReplicas == 2
                             and x.status.replicas == 2 and x.status)
            assert next(c for c in st.conditions if c.type == "Progressing").reason == "RolloutComplete"
            await until(lambda: all(watched.get(Replica, n) is None for n in old))
            assert seen_min[0] >= 2
        finally:
            task.cancel()


async def test_unplaceable_profile_falls_back_and_deleting_the_model_removes_replicas(store):
    async with control_plane(store) as cp:
        await store.create(spec_model("m", 1, placementDeadlineSeconds=1,
                                      profiles=[{"engine": "sim", "gpusPerNode": 64}, {"engine": "sim"}]))
        r = await until(lambda: next((r for r in ready(cp, "m")), None))
        assert r.spec.profileIndex == 1 and r.spec.profile.gpusPerNode == 1
        assert cp.events("PlacementDeadline", "m")
        await store.delete(Model, "m")
        await until(lambda: cp.cache.index(Replica, "model", "m") == [] and cp.cache.list(Shard) == [])


def test_an_autoscaled_model_keeps_the_autoscalers_count_not_spec_replicas():
    scaling = {"minReplicas": 0, "maxReplicas": 3}
    m = model(replicas=5, autoscaling=scaling)
    assert plan(m, [], NOW).create == []                  # minReplicas until the autoscaler decides
    m.status.desiredReplicas = 2
    assert plan(m, [], NOW).create == [0, 0]
    m.status.desiredReplicas = 9                          # beyond maxReplicas (the spec changed since)
    assert plan(m, [], NOW).create == [0, 0, 0]
    p = plan(m, [rep(n, m) for n in "abcd"], NOW)
    assert len(p.delete) == 1 and p.delete[0][1] == "ScaledDown"


def test_replica_events_gather_longer_the_more_replicas_a_model_has():
    # a reconcile reads every replica of its model: its rate falls as the model grows, so the
    # controller's cost per replica event stays flat (the 10,000-node benchmark, issue 34)
    from controllers.indexes import REPLICAS_BY_MODEL
    from controllers.model import BATCH_REPLICAS, ModelController
    from llmgw.runtime.controller import Context
    from llmgw.runtime.events import EventRecorder

    cache = Cache(indexes=[REPLICAS_BY_MODEL])
    small, big = model("small"), model("big")
    for m, n in ((small, 10), (big, 5 * BATCH_REPLICAS)):
        for i in range(n):
            cache.assume(rep(f"{m.name}-{i}", m))
    c = ModelController()
    c.start(Context(store=None, cache=cache, events=EventRecorder()))  # type: ignore[arg-type]
    assert c.batch_delay("small") == c.batch_seconds
    assert c.batch_delay("big") == 5 * c.batch_seconds
    assert c.batch_delay("absent") == c.batch_seconds
