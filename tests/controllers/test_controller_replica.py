"""Replica controller with fake agents: shards, phases, rebuild with backoff, teardown."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from controllers.replica import LOG_TAIL_CHARS, backoff_seconds, fold_phase, held_ports
from llmgw.api import Model, Node, Replica, Shard, get_condition, template_hash
from llmgw.api.wellknown import PROCESS_FINALIZER, SHARDS_FINALIZER
from tests.fixtures.controlplane import control_plane
from tests.fixtures.poll import until

SLOW_BACKOFF = {"rebuild_backoff_base": 3600, "rebuild_backoff_max": 3600}   # a wait no test sits out


def model(name, replicas=1, nodes=1, gpus=1, **spec) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": replicas, "profiles": [{"engine": "sim", "nodes": nodes, "gpusPerNode": gpus}], **spec}})


def test_first_rebuild_is_at_once_then_backoff_doubles_from_10s_to_5min():
    assert [backoff_seconds(n) for n in (1, 2, 3, 6, 7, 20)] == [0, 10, 20, 160, 300, 300]


async def test_multi_node_replica_gets_consistent_shards_and_becomes_ready(store):
    async with control_plane(store) as cp:
        await store.create(model("big", nodes=2, gpus=2))
        await store.create(model("small", replicas=2, routing={"policy": "precise-prefix"}))  # 4 ports on rank 0
        rep = await until(lambda: next((r for r in cp.replicas("big") if r.status.phase == "Ready"), None))
        shards = sorted(cp.cache.index(Shard, "replica", rep.name), key=lambda s: s.spec.rank)
        assert [s.name for s in shards] == [f"{rep.name}-0", f"{rep.name}-1"]
        assert [s.spec.node for s in shards] == [p.node for p in sorted(rep.spec.placement, key=lambda p: p.rank)]
        head_node = cp.cache.get(Node, shards[0].spec.node)
        assert {s.spec.headAddress for s in shards} == {head_node.status.addresses[0]}
        assert shards[0].spec.ports.distInit == shards[1].spec.ports.distInit
        assert shards[0].spec.ports.serve != shards[0].spec.ports.distInit
        assert all(s.spec.worldSize == 2 and s.spec.gpus == [0, 1] and s.spec.fabric == "fab-a" for s in shards)
        assert all(PROCESS_FINALIZER in s.metadata.finalizers for s in shards)
        assert all(s.metadata.ownerReferences[0].uid == rep.metadata.uid for s in shards)
        assert rep.status.endpoint == f"{head_node.status.addresses[0]}:{shards[0].spec.ports.serve}"
        assert cp.events("ShardsCreated", rep.name) and cp.events("Ready", rep.name)
        scheduled = get_condition(rep.status.conditions, "Scheduled")
        ranks = sorted(rep.spec.placement, key=lambda p: p.rank)
        assert (scheduled.status, scheduled.reason) == ("True", "Scheduled")
        assert scheduled.message == (f"rank 0 on {ranks[0].node} GPUs 0,1, rank 1 on {ranks[1].node} GPUs 0,1 "
                                     f"over fabric fab-a")

        # the small replicas (their events' ports too) share nodes with the big one: no port twice on a node
        await until(lambda: sum(r.status.phase == "Ready" for r in cp.replicas("small")) == 2)
        for node in ("n1", "n2", "n3"):
            ports = [p for s in cp.cache.index(Shard, "node", node) for p in s.spec.ports.own(s.spec.rank)]
            assert len(ports) == len(set(ports)), (node, ports)
            assert all(30000 <= p <= 32767 for p in ports)


async def test_failed_shard_rebuilds_whole_replica_with_growing_backoff(store):
    async with control_plane(store) as cp:
        await store.create(model("m", nodes=2))
        rep = await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))
        old_uids = {s.metadata.uid for s in cp.cache.index(Shard, "replica", rep.name)}

        await cp.agents.fail_shard(f"{rep.name}-1", message="NCCL timeout")
        # the Failed phase is brief (the first rebuild waits no backoff): the event and the counters say it happened
        (failure,) = await until(lambda: cp.events("ReplicaFailed", rep.name))
        assert "NCCL timeout" in failure.message and "in 0s (restart 1, 1 in a row)" in failure.message
        failed = cp.cache.get(Replica, rep.name)
        assert failed.status.restarts == 1 and failed.status.backoffUntil is not None
        # rebuilt as a unit: both ranks are new shards, the replica is Ready again
        back = await until(lambda: (r := cp.cache.get(Replica, rep.name)) and r.status.phase == "Ready" and r)
        new_shards = cp.cache.index(Shard, "replica", rep.name)
        assert len(new_shards) == 2 and not ({s.metadata.uid for s in new_shards} & old_uids)
        assert back.status.restarts == 1 and cp.events("Rebuilding", rep.name)
        stopped = {name for name, phase in cp.agents.transitions if phase == "Stopped"}
        assert {f"{rep.name}-0", f"{rep.name}-1"} <= stopped    # agents stopped both old ranks

        # a crash loop: each failure waits twice as long as the one before (read from the
        # events: polling for one value of a counter that keeps moving can miss it)
        cp.agents.fail_replicas.add(rep.name)
        await cp.agents.fail_shard(f"{rep.name}-0")
        failures = await until(lambda: (f := cp.events("ReplicaFailed", rep.name)) and len(f) >= 3 and f)
        assert [f.message.split("rebuilding the whole replica in ")[1] for f in failures[:3]] == [
            "0s (restart 1, 1 in a row)", "0.5s (restart 2, 2 in a row)", "1s (restart 3, 3 in a row)"]


async def test_a_replica_ready_for_the_reset_period_starts_its_backoff_over(store):
    async with control_plane(store, settings={"rebuild_backoff_reset": 3.0}) as cp:
        await store.create(model("m"))

        async def ready_again(restarts):
            return await until(lambda: (r := cp.cache.get(Replica, name)) and r.status.restarts == restarts
                               and r.status.phase == "Ready" and r)

        async def fail(restarts):
            await cp.agents.fail_shard(f"{name}-0")
            return await until(lambda: (r := cp.cache.get(Replica, name)) and r.status.restarts == restarts and r)

        name = (await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))).name
        await fail(1)
        # a rebuild in 0s is at once "waiting to be placed again" in the status: its event says the delay
        await until(lambda: any("in 0s (restart 1, 1 in a row)" in e.message for e in cp.events("ReplicaFailed", name)))
        await ready_again(1)
        second = await fail(2)      # failed again soon after coming back: the streak goes on
        assert "rebuilding in 0.5s" in second.status.message and second.status.consecutiveFailures == 2
        back = await ready_again(2)
        since = get_condition(back.status.conditions, "Ready").lastTransitionTime
        await asyncio.sleep(3.5 - (datetime.now(timezone.utc) - since).total_seconds())
        third = await fail(3)       # Ready for longer than the reset period: the streak starts over
        assert (third.status.restarts, third.status.consecutiveFailures) == (3, 1)
        await until(lambda: any("in 0s (restart 3, 1 in a row)" in e.message for e in cp.events("ReplicaFailed", name)))


async def test_deleted_replica_waits_for_stopped_shards_then_goes(store):
    async with control_plane(store) as cp:
        await store.create(model("m", nodes=2))
        rep = await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))
        assert SHARDS_FINALIZER in rep.metadata.finalizers
        await cp.agents.silence(rep.spec.placement[1].node)     # that agent will never confirm
        await store.delete(Replica, rep.name)
        term = await until(lambda: (r := cp.cache.get(Replica, rep.name)) and r.status.phase == "Terminating" and r)
        assert term.status.endpoint is None
        await until(lambda: cp.agents.phase(f"{rep.name}-0") in ("Stopped", None))
        # the silent node's shard holds the replica, NotReady or not: its engine may still run
        await cp.agents.set_node_ready(rep.spec.placement[1].node, False)
        await until(lambda: cp.cache.get(Shard, f"{rep.name}-0") is None)
        assert cp.cache.get(Shard, f"{rep.name}-1") is not None
        assert cp.cache.get(Replica, rep.name) is not None
        # only deleting the Node gives up on its agent
        await store.delete(Node, rep.spec.placement[1].node)
        await until(lambda: cp.cache.get(Replica, rep.name) is None)
        assert cp.cache.index(Shard, "replica", rep.name) == []
        (abandoned,) = cp.events("ShardAbandoned", rep.name)
        assert f"node {rep.spec.placement[1].node} was deleted" in abandoned.message


async def test_deleted_node_rebuilds_replica_elsewhere(store):
    async with control_plane(store, nodes=("n1", "n2")) as cp:
        await store.create(model("m", gpus=2))
        rep = await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))
        node = rep.spec.placement[0].node
        await cp.agents.silence(node)
        await store.delete(Node, node)
        moved = await until(lambda: (r := cp.cache.get(Replica, rep.name)) and r.status.phase == "Ready"
                            and r.spec.placement[0].node != node and r)
        assert moved.status.restarts == 1
        assert any(f"node {node} was deleted" in e.message for e in cp.events("ReplicaFailed", rep.name))
        assert cp.events("ShardAbandoned", rep.name)


async def test_first_crash_rebuilds_at_once_and_the_second_waits_the_backoff(store):
    async with control_plane(store, nodes=("n1",), settings=SLOW_BACKOFF) as cp:
        await store.create(model("m"))
        name = (await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))).name
        await cp.agents.fail_shard(f"{name}-0")
        back = await until(lambda: (r := cp.cache.get(Replica, name)) and r.status.restarts == 1
                           and r.status.phase == "Ready" and r)
        assert back.status.consecutiveFailures == 1
        await cp.agents.fail_shard(f"{name}-0")
        second = await until(lambda: (r := cp.cache.get(Replica, name)) and r.status.restarts == 2 and r)
        assert second.status.phase == "Failed" and "rebuilding in 3600s" in second.status.message


async def test_port_held_by_a_foreign_process_is_never_handed_out_again(store):
    # one node, one GPU: the rebuild can only land on the same node, so the ports must change
    async with control_plane(store, nodes=("n1",), gpus=1, settings=SLOW_BACKOFF) as cp:
        await store.patch_status(Node, "n1", {"foreignPorts": [30000]})   # as its agent reports
        await until(lambda: (n := cp.cache.get(Node, "n1")) and n.status.foreignPorts == [30000])
        await store.create(model("m"))
        name = (await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))).name
        first = cp.cache.get(Shard, f"{name}-0").spec.ports
        assert 30000 not in (first.serve, first.distInit)

        # the agent refuses the next start: another process took the serve port meanwhile
        shard = cp.cache.get(Shard, f"{name}-0")
        await store.patch_status(Shard, shard.name, {
            "phase": "Failed", "message": f"PortInUse: port {first.serve} held by pid 4242 (nc)",
            "conditions": [{"type": "Started", "status": "False", "reason": "PortInUse",
                            "message": f"port {first.serve} held by pid 4242 (nc)"}]}, node="n1")
        back = await until(lambda: (r := cp.cache.get(Replica, name)) and r.status.restarts == 1
                           and r.status.phase == "Ready" and r)      # at once, despite the 3600 s backoff
        assert back.status.consecutiveFailures == 0                   # not counted as a crash
        again = cp.cache.get(Shard, f"{name}-0").spec.ports
        assert not {again.serve, again.distInit} & {30000, first.serve, first.distInit}
        (failed,) = cp.events("ReplicaFailed", name)
        assert "not counted" in failed.message


def test_fold_phase_needs_rank0_ready_and_workers_up():
    from llmgw.api import Replica, Shard
    rep = Replica.model_validate({"metadata": {"name": "r"}, "spec": {
        "model": "m", "templateHash": "t", "profile": {"engine": "vllm", "nodes": 2}}})

    def sh(rank, phase):
        return Shard.model_validate({"metadata": {"name": f"r-{rank}"}, "spec": {
            "replica": "r", "model": "m", "node": "n", "rank": rank, "worldSize": 2,
            "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "h", "engine": "vllm",
            "servedModelNames": ["m"]}, "status": {"phase": phase}})
    assert fold_phase(rep, [sh(0, "Pending"), sh(1, "Pending")]) == "Scheduled"
    assert fold_phase(rep, [sh(0, "Starting"), sh(1, "Pending")]) == "Starting"
    assert fold_phase(rep, [sh(0, "Ready"), sh(1, "Starting")]) == "Starting"
    assert fold_phase(rep, [sh(0, "Running"), sh(1, "Ready")]) == "Starting"
    assert fold_phase(rep, [sh(0, "Ready"), sh(1, "Running")]) == "Ready"


def test_held_ports_are_the_refused_shards_own_and_any_the_refusal_names():
    from llmgw.api import Shard

    def sh(rank, status):
        return Shard.model_validate({"metadata": {"name": f"r-{rank}"}, "spec": {
            "replica": "r", "model": "m", "node": "n", "rank": rank, "worldSize": 2,
            "ports": {"serve": 30002 + rank, "distInit": 30001}, "headAddress": "h", "engine": "vllm",
            "servedModelNames": ["m"]}, "status": status})
    refused = {"phase": "Failed", "message": "PortInUse: port 30009 held by pid 7 (nc)", "conditions": [
        {"type": "Started", "status": "False", "reason": "PortInUse", "message": "port 30009 held by pid 7 (nc)"}]}
    assert held_ports(sh(0, refused)) == {30002, 30001, 30009}
    assert held_ports(sh(1, refused)) == {30003, 30009}       # rank 0's dist-init port is on rank 0's node
    assert held_ports(sh(0, {"phase": "Failed", "message": "PortInUse: port 30005 held"})) == {30002, 30001, 30005}
    assert held_ports(sh(0, {"phase": "Failed", "message": "engine exited with code 1"})) == set()


async def test_a_failed_engines_last_log_lines_outlive_its_shard(store):
    async with control_plane(store) as cp:
        await store.create(model("m"))
        rep = await until(lambda: next((r for r in cp.replicas("m") if r.status.phase == "Ready"), None))
        log_tail = [f"line {i}: " + "x" * 150 for i in range(30)] + ["ValueError: unknown architecture 'llamax'"]
        cp.placer.paused = True     # the first rebuild waits no backoff: keep it unplaced while we look
        await cp.agents.fail_shard(f"{rep.name}-0", message="llama-server (pid 7) exited with code 1; log: /x",
                                   log_tail=log_tail)
        (failure,) = await until(lambda: cp.events("ReplicaFailed", rep.name))
        assert failure.message.endswith("\nValueError: unknown architecture 'llamax'")
        assert "last lines of its log:\n" in failure.message and "line 10: " not in failure.message
        assert len(failure.message) < LOG_TAIL_CHARS + 400
        ready = await until(lambda: (c := get_condition(cp.cache.get(Replica, rep.name).status.conditions, "Ready"))
                            and c.reason == "Rebuilding" and c)
        assert ready.message.startswith(f"shard {rep.name}-0 on ")
        assert ready.message.endswith("ValueError: unknown architecture 'llamax'")
        assert len(ready.message) < LOG_TAIL_CHARS + 400


async def test_a_precise_prefix_model_gets_kv_event_ports_on_rank_0_named_in_the_replicas_status(store):
    async with control_plane(store) as cp:
        await store.create(model("kv", nodes=2, routing={"policy": "precise-prefix"}))
        await store.create(model("plain"))
        rep = await until(lambda: next((r for r in cp.replicas("kv") if r.status.phase == "Ready"), None))
        head, worker = sorted(cp.cache.index(Shard, "replica", rep.name), key=lambda s: s.spec.rank)
        p = head.spec.ports
        assert rep.spec.kvEvents and p.kvEvents and p.kvReplay
        assert len({p.serve, p.distInit, p.kvEvents, p.kvReplay}) == 4
        assert (worker.spec.ports.kvEvents, worker.spec.ports.kvReplay) == (None, None)
        assert rep.status.kvEvents == f"tcp://{head.spec.headAddress}:{p.kvEvents}"
        assert rep.status.kvReplay == f"tcp://{head.spec.headAddress}:{p.kvReplay}"
        plain = await until(lambda: next((r for r in cp.replicas("plain") if r.status.phase == "Ready"), None))
        assert not plain.spec.kvEvents and plain.status.kvEvents is None
        assert template_hash(model("kv").spec) != template_hash(model("kv", routing={"policy": "precise-prefix"}).spec)
        assert template_hash(model("kv").spec) == template_hash(model("kv", routing={"policy": "prefix-score"}).spec)
