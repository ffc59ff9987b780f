"""Pure placement logic: filters, fabric rule, islands, GPU picking, spreading, reasons."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.api import KVBudget, MemoryEstimate, Node, Replica, Shard
from llmgw.scheduling import Fit, Ledger, NodeInfo, Request, Unfit, budget, place, request_for
from llmgw.scheduling.placer import node_reason


def node(name, gpus=8, fabric=None, **kw) -> NodeInfo:
    fabrics = kw.pop("fabrics", (fabric,) if fabric else ())
    return NodeInfo(name=name, gpus=tuple(range(gpus)), fabrics=fabrics, **kw)


def ledger_of(*infos: NodeInfo) -> Ledger:
    led = Ledger()
    for i in infos:
        led.observe_node(i)
    return led


def bind(led: Ledger, req: Request) -> Fit:
    fit = place(led, req)
    assert isinstance(fit, Fit), fit
    led.assume(req.name, req.model, tuple((s.node, s.gpus) for s in fit.slots), req.kv_events)
    return fit


def test_multi_node_replica_stays_on_one_fabric():
    # fab-a has two nodes but only one with room; fab-b has two with room.
    led = ledger_of(node("a1", fabric="fab-a"), node("a2", fabric="fab-a"),
                    node("b1", fabric="fab-b"), node("b2", fabric="fab-b"))
    led.assume("busy", "other", (("a2", tuple(range(8))),))
    fit = bind(led, Request("r", "m", nodes=2, gpus=8))
    assert fit.fabric == "fab-b"
    assert sorted(fit.nodes) == ["b1", "b2"]
    assert [s.rank for s in fit.slots] == [0, 1]
    assert {s.fabric for s in fit.slots} == {"fab-b"}


def test_islands_take_single_node_replicas_only():
    led = ledger_of(node("i1"), node("i2"))
    out = place(led, Request("r", "m", nodes=2, gpus=1))
    assert isinstance(out, Unfit)
    assert out.message.startswith("0/2 nodes: 2 no fabric;")
    fit = bind(led, Request("s", "m", nodes=1, gpus=1))
    assert fit.nodes in (["i1"], ["i2"]) and fit.fabric is None


def test_fitting_nodes_split_across_fabrics_do_not_make_a_replica():
    led = ledger_of(node("a1", fabric="fab-a"), node("b1", fabric="fab-b"))
    out = place(led, Request("r", "m", nodes=2, gpus=4))
    assert isinstance(out, Unfit)
    assert "2 too few fitting nodes on their fabric" in out.message
    assert "fitting per fabric: fab-a 1, fab-b 1" in out.message


def test_gpu_indices_lowest_free_first_and_never_twice():
    led = ledger_of(node("n1", gpus=4))
    first = bind(led, Request("r1", "m1", gpus=2))
    second = bind(led, Request("r2", "m2", gpus=1))
    assert first.slots[0].gpus == (0, 1)
    assert second.slots[0].gpus == (2,)
    assert isinstance(place(led, Request("r3", "m3", gpus=2)), Unfit)
    led.forget_replica("r1")           # the replica object is gone
    assert bind(led, Request("r3", "m3", gpus=2)).slots[0].gpus == (0, 1)


def test_spreads_a_model_then_packs_others():
    led = ledger_of(node("n1"), node("n2"), node("n3"))
    spots = [bind(led, Request(f"m-{i}", "m", gpus=2)).nodes[0] for i in range(3)]
    assert sorted(spots) == ["n1", "n2", "n3"]
    # a fourth replica of m must double up somewhere
    assert bind(led, Request("m-3", "m", gpus=2)).nodes[0] in spots
    # another model packs onto the fullest node (6 GPUs used) rather than a 2-used one
    fullest = max(led.nodes, key=lambda n: 8 - led.free_count(n))
    assert bind(led, Request("x-0", "x", gpus=2)).nodes[0] == fullest


def test_packing_keeps_empty_nodes_for_wide_replicas():
    led = ledger_of(*(node(f"n{i}", fabric="f") for i in range(3)))
    for i in range(4):  # four different models, 2 GPUs each: one node fills up
        bind(led, Request(f"s{i}", f"model{i}", gpus=2))
    assert sorted(led.free_count(n) for n in led.nodes) == [0, 8, 8]
    fit = bind(led, Request("wide", "w", nodes=2, gpus=8))
    assert len(set(fit.nodes)) == 2


def test_reasons_message_counts_each_nodes_first_reason():
    infos = (
        [node(f"full{i}", gpus=2, fabric="f") for i in range(6)]
        + [node(f"isl{i}") for i in range(4)]
        + [node(f"cord{i}", fabric="f", cordoned=True) for i in range(2)]
    )
    out = place(ledger_of(*infos), Request("r", "m", nodes=2, gpus=4))
    assert isinstance(out, Unfit)
    assert out.message == (
        "0/12 nodes: 6 insufficient GPUs, 4 no fabric, 2 cordoned; "
        "needs 2 nodes with 4 free GPUs each on one fabric"
    )
    assert out.reasons == {"insufficient GPUs": 6, "no fabric": 4, "cordoned": 2}


def test_filters_ready_selector_engines_ports():
    req = Request("r", "m", gpus=1, engines=frozenset({"vllm", "ray"}), selector=(("zone", "a"),))
    led = ledger_of(
        node("down", ready=False, engines=frozenset({"vllm", "ray"}), labels={"zone": "a"}),
        node("other-zone", engines=frozenset({"vllm", "ray"}), labels={"zone": "b"}),
        node("no-ray", engines=frozenset({"vllm", "sim"}), labels={"zone": "a"}),
        node("no-ports", engines=frozenset({"vllm", "ray"}), labels={"zone": "a"}, ports=1),
    )
    out = place(led, req)
    assert isinstance(out, Unfit)
    assert out.reasons == {"not ready": 1, "node selector mismatch": 1,
                           "missing engine ray": 1, "no free ports": 1}
    led.observe_node(node("good", engines=frozenset({"vllm", "ray", "sim"}), labels={"zone": "a"}))
    assert bind(led, req).nodes == ["good"]


def test_ports_run_out_two_per_rank():
    led = ledger_of(node("n", gpus=8, ports=5))
    bind(led, Request("a", "a", gpus=1))
    bind(led, Request("b", "b", gpus=1))
    out = place(led, Request("c", "c", gpus=1))
    assert isinstance(out, Unfit) and out.reasons == {"no free ports": 1}


def test_ports_counted_as_the_shards_take_them_kv_events_on_rank_0():
    # rank 0 takes serve and dist-init, and two more where it publishes KV events (precise-prefix);
    # another rank takes its serve port (rank 0's dist-init is on rank 0's node)
    led = ledger_of(node("n", gpus=8, ports=9, fabric="f"), node("o", gpus=8, ports=9, fabric="f"))
    led.observe_node(node("o", gpus=8, ports=0, fabric="f"))
    bind(led, Request("a", "a", gpus=1, kv_events=True))
    bind(led, Request("b", "b", gpus=1, kv_events=True))
    assert led.free_ports("n") == 1
    assert place(led, Request("c", "c", gpus=1)).reasons == {"no free ports": 2}
    led.forget_replica("b")
    led.observe_node(node("o", gpus=8, ports=9, fabric="f"))
    bind(led, Request("d", "d", nodes=2, gpus=1, kv_events=True))
    assert led.free_ports("n") + led.free_ports("o") == 5 + 9 - 5
    rep = _replica("r", "m", placement=[{"rank": 0, "node": "o", "gpus": [7]}], kvEvents=True)
    led.forget_replica("d")
    led.observe_replica(rep)                         # as the scheduler's cache has it: its spec says
    assert led.free_ports("o") == 9 - 4 and request_for(rep).ports == 4
    led.forget_replica("r")
    assert led.free_ports("o") == 9 and list(led.check()) == []


def test_assumed_placement_survives_a_stale_view_until_released():
    led = ledger_of(node("n", gpus=1))
    bind(led, Request("r", "m", gpus=1))
    stale = _replica("r", "m")          # the cache still has it without placement
    led.observe_replica(stale)
    assert isinstance(place(led, Request("r2", "m2")), Unfit)
    led.unassume("r")                    # the write lost a compare
    assert bind(led, Request("r2", "m2")).nodes == ["n"]


def test_observed_placements_are_accounted_and_released():
    led = ledger_of(node("n", gpus=2), node("o", gpus=2))
    rep = _replica("r", "m", placement=[{"rank": 0, "node": "n", "gpus": [1]}])
    led.observe_replica(rep)
    assert led.free_gpus("n") == [0]
    rep.spec.placement[0].gpus = [0, 1]
    led.observe_replica(rep)
    assert led.free_gpus("n") == [] and led.free_count("n") == 0
    led.forget_replica("r")
    assert led.free_gpus("n") == [0, 1] and led.free_count("n") == 2


def test_a_shard_keeps_its_gpus_and_ports_booked_after_its_replica_lets_go():
    # A lost node's shard: its engine may still hold the GPU and the ports until the
    # agent confirms it stopped, whatever became of its replica's placement or object.
    led = ledger_of(node("n", gpus=2, ports=4))
    rep = _replica("r", "m", placement=[{"rank": 0, "node": "n", "gpus": [1]}])
    led.observe_replica(rep)
    led.observe_shard(_shard("r-0", rep, "n", [1]))
    assert led.free_gpus("n") == [0]                 # placement and shard: one booking, not two
    rep.spec.placement = []
    led.observe_replica(rep)                         # placement cleared: the shard still holds GPU 1
    assert led.free_gpus("n") == [0] and led.free_ports("n") == 2
    led.forget_replica("r")                          # replica object gone: still held
    assert led.free_gpus("n") == [0] and "r" in led.replicas
    assert not led.forget_shard("r-9", "r")          # an unknown shard frees nothing
    assert led.forget_shard("r-0", "r")              # the agent confirmed: free
    assert led.free_gpus("n") == [0, 1] and led.free_ports("n") == 4 and "r" not in led.replicas
    assert list(led.check()) == []


def test_foreign_ports_are_not_the_nodes_to_hand_out():
    n = Node.model_validate({"metadata": {"name": "n1"}, "status": {
        "portRange": {"first": 100, "last": 104}, "foreignPorts": [100, 103, 103, 7000],
        "gpus": [{"index": 0}], "engines": [{"name": "sim", "path": "/x"}],
        "conditions": [{"type": "Ready", "status": "True"}]}})
    info = NodeInfo.from_node(n)
    assert info.ports == 3            # 5 in range, 100 and 103 held by others; 7000 is out of range
    led = ledger_of(info)
    bind(led, Request("a", "a", gpus=0))             # takes two of the three
    assert place(led, Request("b", "b", gpus=0)).reasons == {"no free ports": 1}


def test_request_from_replica_needs_ray_for_vllm_ray():
    rep = _replica("r", "m", profile={"engine": "vllm", "launchMode": "ray", "nodes": 2, "gpusPerNode": 8},
                   nodeSelector={"gpu": "h200"})
    req = request_for(rep)
    assert (req.nodes, req.gpus, req.engines, req.selector) == (
        2, 8, frozenset({"vllm", "ray"}), (("gpu", "h200"),))


def test_node_info_from_node_reads_conditions_cordon_and_drain():
    n = Node.model_validate({
        "metadata": {"name": "n1", "labels": {"a": "b"}},
        "spec": {"drain": True},
        "status": {"gpus": [{"index": 1}, {"index": 0}], "fabrics": [{"name": "fab-a"}],
                   "engines": [{"name": "sim", "path": "/x"}],
                   "portRange": {"first": 100, "last": 109},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
    info = NodeInfo.from_node(n)
    assert (info.ready, info.cordoned, info.gpus, info.fabrics, info.ports) == (
        True, True, (0, 1), ("fab-a",), 10)


def _shard(name, rep, node_name, gpus) -> Shard:
    return Shard.model_validate({"metadata": {"name": name}, "spec": {
        "replica": rep.metadata.name, "model": rep.spec.model, "node": node_name, "rank": 0,
        "worldSize": 1, "gpus": gpus, "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "h", "engine": "sim",
        "servedModelNames": [rep.spec.model]}})


def _replica(name, model, placement=(), profile=None, nodeSelector=None, **spec) -> Replica:
    return Replica.model_validate({
        "metadata": {"name": name},
        "spec": {"model": model, "templateHash": "h", "profile": profile or {"engine": "sim"},
                 "placement": list(placement), "nodeSelector": nodeSelector or {}, **spec},
    })


# ----------------------------------------------------------- randomized

node_st = st.builds(
    lambda gpus, fabric, ready, cordoned: (gpus, fabric, ready, cordoned),
    st.integers(0, 8), st.sampled_from([None, "fa", "fb", "fc"]),
    st.booleans(), st.booleans(),
)
op_st = st.one_of(
    st.tuples(st.just("place"), st.integers(1, 3), st.integers(1, 8), st.integers(0, 3)),
    st.tuples(st.just("forget"), st.integers(0, 40)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(node_st, min_size=1, max_size=14), st.lists(op_st, max_size=40))
def test_random_placements_keep_the_invariants(nodes, ops):
    led = Ledger()
    for i, (gpus, fabric, ready, cordoned) in enumerate(nodes):
        led.observe_node(node(f"n{i}", gpus=gpus, fabric=fabric,
                              ready=ready or i == 0, cordoned=cordoned and i != 0))
    placed: dict[str, Fit] = {}
    for k, op in enumerate(ops):
        if op[0] == "forget":
            names = sorted(placed)
            if names:
                gone = names[op[1] % len(names)]
                led.forget_replica(gone)
                del placed[gone]
            continue
        _, width, gpus, model = op
        req = Request(f"r{k}", f"m{model}", nodes=width, gpus=gpus)
        out = place(led, req)
        if isinstance(out, Unfit):
            _assert_nothing_fits(led, req)
            continue
        infos = [led.nodes[s.node] for s in out.slots]
        assert len(set(out.nodes)) == width                        # one rank per node
        for s, info in zip(out.slots, infos, strict=False):
            assert node_reason(led, info, req) is None
            assert len(s.gpus) == gpus and set(s.gpus) <= set(led.free_gpus(s.node))
        if width > 1:
            assert out.fabric and all(out.fabric in i.fabrics for i in infos)   # one fabric, no island
        led.assume(req.name, req.model, tuple((s.node, s.gpus) for s in out.slots))
        placed[req.name] = out
    # no GPU assigned twice, counted independently of the ledger
    booked = [(s.node, g) for fit in placed.values() for s in fit.slots for g in s.gpus]
    assert len(booked) == len(set(booked))
    assert list(led.check()) == []


def _assert_nothing_fits(led: Ledger, req: Request) -> None:
    fitting = [i for i in led.nodes.values() if node_reason(led, i, req) is None]
    if req.nodes == 1:
        assert fitting == []
    else:
        per_fabric: dict[str, int] = {}
        for i in fitting:
            for f in i.fabrics:
                per_fabric[f] = per_fabric.get(f, 0) + 1
        assert all(n < req.nodes for n in per_fabric.values())


D = "sha256:" + "ab" * 32


def test_nodes_holding_the_weights_are_preferred_never_required():
    # pack order alone would pick the fuller a1 (2 free); b1 holds the weights
    led = ledger_of(node("a1", gpus=2), node("b1", gpus=8, weights=frozenset({D})), node("c1", gpus=8))
    assert bind(led, Request("r1", "m", gpus=2, digest=D)).nodes == ["b1"]
    assert bind(led, Request("r2", "other", gpus=2)).nodes == ["a1"]      # no digest: best fit as before
    # spreading still comes first: b1 already holds a rank of m, so the next goes elsewhere
    assert bind(led, Request("r3", "m", gpus=2, digest=D)).nodes == ["c1"]
    # a node full of other work does not block placement: the weights are a preference only
    led2 = ledger_of(node("held", gpus=2, weights=frozenset({D})), node("empty", gpus=8))
    led2.assume("busy", "x", (("held", (0, 1)),))
    assert bind(led2, Request("r", "m", gpus=2, digest=D)).nodes == ["empty"]


def test_a_two_node_replica_prefers_the_fabric_nodes_holding_its_weights():
    led = ledger_of(node("a1", fabric="f"), node("a2", fabric="f"), node("a3", fabric="f", weights=frozenset({D})),
                    node("a4", fabric="f", weights=frozenset({D})))
    assert sorted(bind(led, Request("r", "m", nodes=2, gpus=8, digest=D)).nodes) == ["a3", "a4"]


def test_the_ledger_knows_which_nodes_hold_a_digest_as_nodes_change():
    led = ledger_of(node("n1", weights=frozenset({D})), node("n2", weights=frozenset({D})))
    assert led.holders == {D: {"n1", "n2"}}
    led.observe_node(node("n1"))          # evicted from n1's cache
    assert led.holders == {D: {"n2"}}
    led.forget_node("n2")
    assert led.holders == {}


MiB, GiB = 1 << 20, 1 << 30


def estimate(needed_mib: int, tp: int = 1) -> MemoryEstimate:
    """An estimate needing `needed_mib` per GPU: 1 GiB of overhead, 1 KiB of KV per token x 4096, the weights."""
    weights = needed_mib * MiB - GiB - 1024 * 4096
    return MemoryEstimate(tp=tp, pp=1, weightsBytes=weights, kvBytesPerToken=1024, overheadBytes=GiB,
                          minContext=4096, neededBytes=needed_mib * MiB)


def test_gpus_without_the_estimated_memory_free_are_refused_with_the_bytes_and_the_chosen_get_a_budget():
    # GPU 0 has 10,000 MiB free, GPU 1 30,000 (of 40,960 each); a node reporting no memory counts as roomy
    led = ledger_of(node("n1", gpus=2, memory={0: 10_000, 1: 30_000}, total={0: 40_960, 1: 40_960}))
    fit = bind(led, Request("r", "m", gpus=1, estimate=estimate(20_000)))
    assert fit.slots[0].gpus == (1,)
    # its KV cache: 30,000 MiB free - 18,972 MiB of weights - 1,024 of overhead
    assert budget(led, fit, estimate(20_000)) == KVBudget(gpuMiB=40_960, freeMiB=30_000, bytes=10_004 * MiB,
                                                          tokens=10_004 * 1024)
    assert budget(led, fit, None) is None
    out = place(led, Request("s", "m", gpus=1, estimate=estimate(20_000)))
    assert isinstance(out, Unfit)
    assert out.reasons == {"insufficient GPU memory": 1}
    assert out.message == ("0/1 nodes: 1 insufficient GPU memory; needs 19.5 GiB per GPU at tp=1, largest free "
                           "9.8 GiB (weights 18.5 GiB, overhead 1.0 GiB, KV 0.0 GiB for 4096 tokens)")
    assert bind(led, Request("t", "m", gpus=1, estimate=estimate(10_000))).slots[0].gpus == (0,)
    led.observe_node(node("unknown", gpus=1))
    unknown = bind(led, Request("u", "m", gpus=1, estimate=estimate(20_000)))
    assert unknown.nodes == ["unknown"]
    assert budget(led, unknown, estimate(20_000)) is None   # no memory reported: the engine sizes its cache


def test_the_reason_names_the_parallel_sizes():
    led = ledger_of(node("n1", gpus=2, memory={0: 40_448, 1: 40_448}))
    out = place(led, Request("r", "m", gpus=2, estimate=estimate(42_189, tp=2)))
    assert isinstance(out, Unfit)
    assert "; needs 41.2 GiB per GPU at tp=2, largest free 39.5 GiB (" in out.message
