"""The invariant checkers on hand-made histories: each reports the violation it exists for, and
stays quiet on the same history without it (so a green scenario means something)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from llmgw.api import Node, Replica, Shard
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT
from tests.robustness import invariants as inv
from tests.robustness.history import Change, Engine, History, Request, Sample, WatchResume

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def replica(name: str, phase: str = "Ready", node: str = "n1", model: str = "m", deleting: bool = False,
            annotations: dict | None = None, **status) -> Replica:
    return Replica.model_validate({
        "metadata": {"name": name, "annotations": annotations or {}, "uid": f"u-{name}",
                     "deletionTimestamp": T0 if deleting else None},
        "spec": {"model": model, "templateHash": "t1", "profile": {"engine": "sim"},
                 "placement": [{"rank": 0, "node": node, "gpus": [0]}]},
        "status": {"phase": phase, **status}})


def shard(name: str, phase: str, node: str = "n1", port: int = 30000, uid: str = "s1", **status) -> Shard:
    return Shard.model_validate({
        "metadata": {"name": name, "uid": uid},
        "spec": {"replica": name, "model": "m", "node": node, "rank": 0, "worldSize": 1, "gpus": [0],
                 "ports": {"serve": port, "distInit": port + 1}, "headAddress": "127.0.9.1", "engine": "sim",
                 "servedModelNames": ["m"]},
        "status": {"phase": phase, "startedAt": T0, **status}})


def changes(kind: str, *objs, start: int = 1) -> list[Change]:
    return [Change(float(i), start + i, kind, o.name, o) for i, o in enumerate(objs)]


def engine(pid: int, gpus=(0,), port: int = 30000, node: str = "n1") -> Engine:
    return Engine(pid, node, "127.0.9.1", tuple(gpus), (port,))


def test_exclusive_engines_reports_a_shared_gpu_and_a_shared_port():
    shared = History(samples=[Sample(1.0, (engine(10, (0,), 30000), engine(11, (0,), 30000)))])
    found = inv.exclusive_engines(shared)
    assert any("GPU 0 on n1" in v for v in found) and any("port 30000 on 127.0.9.1" in v for v in found)
    assert not inv.exclusive_engines(History(samples=[Sample(1.0, (engine(10, (0,), 30000),
                                                                   engine(11, (1,), 30002)))]))
    two_nodes = History(samples=[Sample(1.0, (engine(10), Engine(11, "n2", "127.0.9.2", (0,), (30000,))))])
    assert not inv.exclusive_engines(two_nodes)


def test_surge_bound_counts_replicas_not_being_deleted():
    three = History(changes=changes("replicas", replica("a"), replica("b"), replica("c"), replica("d")))
    assert inv.surge_bound(three, "m", replicas=2, max_surge=1)
    going = History(changes=changes("replicas", replica("a"), replica("b"), replica("c", deleting=True),
                                    replica("d")))
    assert not inv.surge_bound(going, "m", replicas=2, max_surge=1)
    drained = History(changes=changes("replicas", replica("a"), replica("b"), replica("c"),
                                      replica("d", annotations={DRAINING_REPLACEMENT_FOR: "a"})))
    assert not inv.surge_bound(drained, "m", replicas=2, max_surge=1)


def test_surge_bound_reports_a_drain_that_made_two_replacements_for_one_original():
    """Two replacements of a (a leader killed mid-drain re-creating one, say) stay within
    replicas + maxSurge once a is left out, but a drain's budget is one per original."""
    twice = History(changes=changes("replicas", replica("a"), replica("b"),
                                    replica("r1", annotations={DRAINING_REPLACEMENT_FOR: "a"}),
                                    replica("r2", annotations={DRAINING_REPLACEMENT_FOR: "a"})))
    found = inv.surge_bound(twice, "m", replicas=2, max_surge=1)
    assert found and "2 replacements for a" in found[0]
    once_more = History(changes=twice.changes[:3] + changes("replicas", replica("r1", deleting=True,
                        annotations={DRAINING_REPLACEMENT_FOR: "a"}), replica("r2", annotations={
                        DRAINING_REPLACEMENT_FOR: "a"}), start=4))
    assert not inv.surge_bound(once_more, "m", replicas=2, max_surge=1)    # the first was deleted first


def test_ready_floor_only_inside_its_windows():
    h = History(changes=changes("replicas", replica("a"), replica("b"), replica("a", phase="Starting")))
    assert inv.ready_floor(h, "m", 2, [(0.0, 5.0)])
    assert not inv.ready_floor(h, "m", 2, [(1.0, 1.5)])
    assert not inv.ready_floor(h, "m", 1, [(0.0, 5.0)])


def test_no_orphans_reports_an_engine_outliving_its_shard_past_the_bound():
    s = shard("m-a-0", "Ready")
    h = History(changes=[Change(0.0, 1, "shards", s.name, s), Change(1.0, 2, "shards", s.name, s, deleted=True)],
                samples=[Sample(float(t), (engine(10),)) for t in range(0, 40, 2)])
    assert inv.no_orphans(h, bound=30.0)
    assert not inv.no_orphans(h, bound=60.0)
    kept = History(changes=h.changes[:1], samples=h.samples)
    assert not inv.no_orphans(kept, bound=30.0)


def test_ready_on_own_engine_reports_a_ready_answered_by_another_process():
    ready = shard("m-a-0", "Ready", pid=10)
    died = shard("m-a-0", "Failed", exitCode=2,
                 logTail=["cannot bind the serve port 127.0.9.1:30000: [Errno 98] address already in use"])
    assert inv.ready_on_own_engine(History(changes=changes("shards", ready, died)))
    crashed = shard("m-a-0", "Failed", exitCode=137, message="sim (pid 10) killed by SIGKILL")
    assert not inv.ready_on_own_engine(History(changes=changes("shards", ready, crashed)))
    never_ready = History(changes=changes("shards", shard("m-a-0", "Running"), died))
    assert not inv.ready_on_own_engine(never_ready)


def test_ports_free_when_given_blames_a_port_another_engine_held_not_a_foreign_one():
    died = shard("m-a-0", "Failed", exitCode=2,
                 logTail=["cannot bind the serve port 127.0.9.1:30000: [Errno 98] address already in use"])
    h = History(changes=changes("shards", shard("m-a-0", "Running"), died), addresses={"n1": "127.0.9.1"})
    assert "was given port 30000, which another engine held" in inv.ports_free_when_given(h)[0]
    h.samples = [Sample(0.5, (), (("127.0.9.1", 30000, 77),))]
    assert not inv.ports_free_when_given(h)
    crashed = shard("m-a-0", "Failed", exitCode=137, message="sim (pid 10) killed by SIGKILL")
    assert not inv.ports_free_when_given(History(changes=changes("shards", crashed)))


def test_no_failed_requests_within_windows():
    h = History(requests=[Request(1.0, 1.1, "m", True), Request(5.0, 5.2, "m", False, "502 upstream")])
    assert "1 of 2 requests failed" in inv.no_failed_requests(h)[0]
    assert not inv.no_failed_requests(h, [(0.0, 2.0)])


def test_prompt_requests_reports_a_slow_request_inside_the_windows():
    h = History(requests=[Request(1.0, 6.0, "m", True, replica="m-b"), Request(9.0, 9.1, "m", True)])
    assert "1 requests waited longer than 3s for a response; e.g. t=1.0 waited 5.0s (m-b)" in \
        inv.prompt_requests(h, [(0.0, 10.0)], 3.0)[0]
    assert not inv.prompt_requests(h, [(5.0, 10.0)], 3.0)


def test_prompt_requests_counts_a_streams_wait_for_its_start_not_its_tokens():
    h = History(requests=[Request(1.0, 9.0, "m", True, first=1.2, streamed=True),
                          Request(2.0, 9.0, "m", True, replica="m-b", first=6.0, streamed=True)])
    assert inv.prompt_requests(h, [(0.0, 10.0)], 3.0) == [
        "1 requests waited longer than 3s for a response; e.g. t=2.0 waited 4.0s (m-b)"]


def test_ended_by_reports_a_request_in_flight_at_a_fault_that_outlived_the_bound():
    h = History(requests=[Request(1.0, 4.0, "m", True), Request(2.0, 20.0, "m", True, replica="m-a", streamed=True),
                          Request(6.0, 25.0, "m", True)])
    assert inv.ended_by(h, 3.0, 10.0) == [
        "t=2.0: in flight at t=3.0, ended at t=20.0, not before t=10.0 (stream, m-a)"]
    assert not inv.ended_by(h, 3.0, 30.0)


def test_no_eviction_sees_the_evict_mark_and_a_lost_node_rebuild():
    marked = replica("a", annotations={EVICT: "node-lost"})
    assert inv.no_eviction(History(changes=changes("replicas", replica("a"), marked)), {"n1"})
    assert not inv.no_eviction(History(changes=changes("replicas", replica("a"), marked)), {"n2"})
    lost = replica("b", phase="Failed", message="node n1 is lost; rebuilding in 10s")
    assert inv.no_eviction(History(changes=changes("replicas", lost)), {"n1"})
    assert not inv.no_eviction(History(changes=changes("replicas", lost)), {"n1"}, after=5.0)


def test_first_rebuild_at_once_reports_a_backoff_on_the_first_failure():
    def failed(streak: int, delay: float) -> Replica:
        return replica("a", phase="Failed", consecutiveFailures=streak, restarts=streak,
                       backoffUntil=T0 + timedelta(seconds=delay),
                       conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": T0}])
    assert inv.first_rebuild_at_once(History(changes=changes("replicas", failed(1, 10.0))))
    assert not inv.first_rebuild_at_once(History(changes=changes("replicas", failed(1, 0.0))))
    assert not inv.first_rebuild_at_once(History(changes=changes("replicas", failed(2, 20.0))))


def test_nodes_stay_ready_reports_a_node_written_not_ready_inside_its_window():
    def node(status: str) -> Node:
        return Node.model_validate({"metadata": {"name": "n1"}, "status": {"conditions": [
            {"type": "Ready", "status": status, "reason": "NodeStatusUnknown", "lastTransitionTime": T0}]}})
    h = History(changes=changes("nodes", node("True"), node("Unknown"), node("True")))   # at t = 0, 1, 2
    assert inv.nodes_stay_ready(h) == ["t=1.0 revision 2: node n1 Ready Unknown (NodeStatusUnknown: )"]
    assert not inv.nodes_stay_ready(h, after=1.5)
    assert not inv.nodes_stay_ready(h, until=0.5)


def test_watches_resume_only_blames_the_server_when_etcd_had_the_history():
    assert inv.watches_resume(History(resumes=[WatchResume(1.0, 40, "events", "Expired")]))
    assert not inv.watches_resume(History(resumes=[WatchResume(1.0, 40, "Expired", "Expired")]))
    assert not inv.watches_resume(History(resumes=[WatchResume(1.0, 40, "events", "events")]))


def test_foreign_port_once_counts_shards_given_a_squatted_port():
    squat = [Sample(float(t), (), (("127.0.9.1", 30000, 77),)) for t in range(0, 30, 5)]
    twice = changes("shards", shard("m-a-0", "Pending", uid="u1"), shard("m-b-0", "Pending", uid="u2"))
    h = History(changes=twice, samples=squat, addresses={"n1": "127.0.9.1"})
    assert "given to 2 shards" in inv.foreign_port_once(h)[0]
    once = History(changes=twice[:1], samples=squat, addresses={"n1": "127.0.9.1"})
    assert not inv.foreign_port_once(once)
    elsewhere = History(changes=changes("shards", shard("m-a-0", "Pending", uid="u1", port=30002),
                                        shard("m-b-0", "Pending", uid="u2", port=30002)),
                        samples=squat, addresses={"n1": "127.0.9.1"})
    assert not inv.foreign_port_once(elsewhere)


def test_foreign_port_once_counts_a_shard_when_made_and_only_the_ports_its_engine_binds():
    """A squatter on port 30001 from t=0: a shard made before it (t=-1) reporting its phases during
    the squat was not given the port then; the dist-init port of a single-node shard is never
    bound (soak seed 5150 blamed five such shards); a two-node replica's rank 0 binds it."""
    squat = [Sample(float(t), (), (("127.0.9.1", 30001, 77),)) for t in range(0, 30, 5)]
    early = shard("m-a-0", "Pending", port=29999, uid="u0")
    early.spec.ports.serve = 30001
    later = [Change(float(t), 10 + t, "shards", "m-a-0", shard("m-a-0", phase, port=29999, uid="u0"))
             for t, phase in ((2, "Starting"), (4, "Ready"))]
    for c in later:
        c.obj.spec.ports.serve = 30001
    single = changes("shards", shard("m-b-0", "Pending", uid="u1"), shard("m-c-0", "Pending", uid="u2"),
                     start=20)      # serve 30000, dist-init 30001: not bound with one node
    h = History(changes=[Change(-1.0, 1, "shards", "m-a-0", early), *later, *single], samples=squat,
                addresses={"n1": "127.0.9.1"})
    assert not inv.foreign_port_once(h)
    for c in single:
        c.obj.spec.worldSize = 2
    assert "given to 2 shards: m-b-0 t=0.0, m-c-0 t=1.0" in inv.foreign_port_once(h)[0]


def test_foreign_port_once_counts_each_squatters_run_apart():
    """Two squatters on one port in two rounds (t=0-5 and t=20-25), each run giving it to one shard:
    no violation (soak seed 5150 added them up); two shards within one run: one."""
    samples = [Sample(float(t), (), (("127.0.9.1", 30000, 77),) if t <= 5 or 20 <= t <= 25 else ())
               for t in range(30)]
    apart = [Change(2.0, 1, "shards", "m-a-0", shard("m-a-0", "Pending", uid="u1")),
             Change(22.0, 2, "shards", "m-b-0", shard("m-b-0", "Pending", uid="u2"))]
    assert not inv.foreign_port_once(History(changes=apart, samples=samples, addresses={"n1": "127.0.9.1"}))
    within = [*apart, Change(24.0, 3, "shards", "m-c-0", shard("m-c-0", "Pending", uid="u3"))]
    assert inv.foreign_port_once(History(changes=within, samples=samples, addresses={"n1": "127.0.9.1"})) == [
        "127.0.9.1:30000, held by a foreign process (holder not seen) at t=20.0-25.0, was given to 2 shards: "
        "m-b-0 t=22.0, m-c-0 t=24.0"]


def test_foreign_port_once_splits_sightings_by_gaps():
    """An engine's port seen as foreign twice around its end (the sampler's race), at t=1-2 and
    t=20-21, with samples without it between: the shards given it at t=5 and t=10 took a free port
    (soak seed 4242 blamed them)."""
    def seen(t: float, foreign: bool) -> Sample:
        return Sample(t, (), (("127.0.9.1", 30000, 77),) if foreign else ())
    samples = [seen(float(t), t in (1, 2, 20, 21)) for t in range(25)]
    given = [Change(5.0, 1, "shards", "m-a-0", shard("m-a-0", "Pending", uid="u1")),
             Change(10.0, 2, "shards", "m-b-0", shard("m-b-0", "Pending", uid="u2"))]
    assert not inv.foreign_port_once(History(changes=given, samples=samples, addresses={"n1": "127.0.9.1"}))
    held = [seen(float(t), 1 <= t <= 21) for t in range(25)]
    assert inv.foreign_port_once(History(changes=given, samples=held, addresses={"n1": "127.0.9.1"}))


def test_converged_reports_what_settle_waited_for_in_vain():
    assert inv.converged(History(unconverged=["every model Ready"])) == ["never settled: every model Ready"]
    assert not inv.converged(History())


def test_no_failed_requests_excuses_a_request_overlapping_a_round_without_the_promise():
    h = History(requests=[Request(1.0, 3.5, "m", False, "error event"), Request(2.0, 2.5, "m", False, "502"),
                          Request(4.0, 4.1, "m", True)])
    assert inv.no_failed_requests(h, [(0.0, 3.0)]) == ["2 of 3 requests failed; e.g. 1x error event; 1x 502"]
    assert inv.no_failed_requests(h, [(0.0, 3.0)], excused=[(3.0, 5.0)]) == [
        "1 of 3 requests failed; e.g. 1x 502"]
