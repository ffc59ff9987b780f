"""The `get` tables: node status words, GPU accounting, per-kind columns, ages; selectors."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from llmgw.api import KINDS, CachedWeights, Model, Node, Replica, Shard, WeightsCache, parse_object
from llmgw.api.selectors import SelectorError, parse_selector
from llmgw.printers.kinds import PRINTERS, Beside, table
from llmgw.printers.kinds.node import node_status
from llmgw.printers.table import format_table, human_age
from llmgw.printers.weights import weights_rows

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def node(name="n1", ready="True", unschedulable=False, drain=False, drain_phase=None, gpu_discovery=None,
         gpus=4, age=timedelta(hours=2), evicting=None):
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    if evicting:
        status_, reason = evicting
        conditions.append({"type": "Evicting", "status": status_, "reason": reason})
    if gpu_discovery:
        conditions.append({"type": "GPUDiscovery", "status": gpu_discovery, "reason": "SmiFailed"})
    status = {
        "conditions": conditions, "addresses": ["10.0.0.7"], "agentVersion": "0.1.0",
        "gpus": [{"index": i, "name": "NVIDIA H100"} for i in range(gpus)],
        "fabrics": [{"name": "ib-a"}], "engines": [{"name": "vllm", "path": "/bin/vllm"},
                                                 {"name": "sim", "path": "/bin/sim"}],
    }
    if drain_phase:
        status["drain"] = {"phase": drain_phase, "remaining": 1}
    return parse_object({"apiVersion": "llmgw.io/v1", "kind": "Node",
                         "metadata": {"name": name, "creationTimestamp": (NOW - age).isoformat()},
                         "spec": {"unschedulable": unschedulable, "drain": drain}, "status": status})


def replica(name, placement, model="llama", phase="Ready"):
    return parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Replica",
        "metadata": {"name": name, "creationTimestamp": (NOW - timedelta(seconds=75)).isoformat()},
        "spec": {"model": model, "templateHash": "abc", "profile": {"engine": "vllm", "nodes": max(1, len(placement))},
                 "servedModelNames": [model],
                 "placement": [{"rank": i, "node": n, "gpus": g} for i, (n, g) in enumerate(placement)]},
        "status": {"phase": phase, "endpoint": "10.0.0.7:30000", "restarts": 2},
    })


@pytest.mark.parametrize("kw, expected", [
    ({}, "Ready"),
    ({"ready": "False"}, "NotReady"),
    ({"ready": "Unknown"}, "NotReady"),
    ({"ready": None}, "NotReady"),
    ({"unschedulable": True}, "Ready,SchedulingDisabled"),
    ({"gpu_discovery": "False"}, "Ready,GPUDiscoveryFailed"),
    ({"gpu_discovery": "True"}, "Ready"),
    ({"unschedulable": True, "drain": True}, "Ready,SchedulingDisabled,Draining"),
    ({"unschedulable": True, "drain": True, "drain_phase": "Drained"}, "Ready,SchedulingDisabled,Drained"),
    ({"unschedulable": True, "drain": True, "drain_phase": "Stuck"}, "Ready,SchedulingDisabled,DrainStuck"),
    # a leftover drain status without a drain request is not shown
    ({"drain_phase": "Drained"}, "Ready"),
    ({"ready": "False", "unschedulable": True}, "NotReady,SchedulingDisabled"),
    # the node lifecycle controller's verdict (condition Evicting), right after readiness
    ({"ready": "False", "evicting": ("True", "NodeLost")}, "NotReady,Lost"),
    ({"ready": "False", "evicting": ("False", "MassSilence")}, "NotReady,EvictionHeld(MassSilence)"),
    ({"ready": "False", "evicting": ("False", "Settling")}, "NotReady,EvictionHeld(Settling)"),
    ({"ready": "False", "evicting": ("False", "RateLimited")}, "NotReady,EvictionHeld(RateLimited)"),
    ({"ready": "False", "evicting": ("False", "LeaderChanged"), "unschedulable": True},
     "NotReady,EvictionHeld(LeaderChanged),SchedulingDisabled"),
    ({"ready": "True", "evicting": ("False", "HeartbeatResumed")}, "Ready"),
])
def test_node_status_combines_like_kubectl(kw, expected):
    assert node_status(node(**kw)) == expected


def test_node_table_counts_gpus_and_replicas_from_placements():
    nodes = [node("n1"), node("n2", gpus=8), node("n3", gpus=0)]
    replicas = [
        replica("r1", [("n1", [0, 1])]),
        replica("r2", [("n1", [2]), ("n2", [0, 1, 2, 3])]),   # spans two nodes
        replica("r3", []),                                     # unplaced: holds nothing
    ]
    headers, rows = table(Node, nodes, Beside({Replica: replicas}), now=NOW)
    assert headers == ["NAME", "STATUS", "GPUS", "FABRICS", "ENGINES", "REPLICAS", "AGE"]
    assert rows == [
        ["n1", "Ready", "3/4", "ib-a", "vllm,sim", "2", "120m"],
        ["n2", "Ready", "4/8", "ib-a", "vllm,sim", "1", "120m"],
        ["n3", "Ready", "0/0", "ib-a", "vllm,sim", "0", "120m"],
    ]
    headers, rows = table(Node, nodes[:1], Beside({Replica: replicas}), wide=True, now=NOW)
    assert headers[-4:] == ["WEIGHTS", "ADDRESS", "GPU-MODEL", "AGENT"]
    assert rows[0][-4:] == ["<none>", "10.0.0.7", "NVIDIA H100", "0.1.0"]
    cached = node("n4")
    cached.status.weights = WeightsCache(capacityBytes=500 << 30, freeBytes=(120 << 30) + 5, models=[
        CachedWeights(digest="sha256:" + "a" * 64, bytes=1 << 30), CachedWeights(digest="sha256:" + "b" * 64, bytes=1)])
    assert table(Node, [cached], wide=True, now=NOW)[1][0][-4] == "2 models, 120Gi free"
    assert headers[-5] == "GPU-MEM" and rows[0][-5] == "<none>"     # no GPU reports its memory
    cached.status.gpus[0].memoryMiB, cached.status.gpus[0].memoryFreeMiB = 81559, 40960
    cached.status.gpus[1].memoryMiB, cached.status.gpus[1].memoryFreeMiB = 81559, 81556
    assert table(Node, [cached], wide=True, now=NOW)[1][0][-5] == "40Gi/79Gi"   # the least free / the most


def test_model_replica_shard_tables():
    model = parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Model",
        "metadata": {"name": "llama", "creationTimestamp": (NOW - timedelta(days=3, hours=4)).isoformat()},
        "spec": {"replicas": 3, "aliases": ["l3", "llama-big"],
                 "profiles": [{"engine": "vllm"}, {"engine": "sim"}, {"engine": "vllm", "nodes": 2}]},
        "status": {"readyReplicas": 2, "updatedReplicas": 1},
    })
    assert table(Model, [model], now=NOW)[1] == [["llama", "2/3", "1", "<none>", "vllm,sim", "l3,llama-big",
                                                      "3d4h"]]
    scaled = parse_object({**model.model_dump(mode="json"),
                           "spec": {**model.spec.model_dump(mode="json"), "autoscaling": {"maxReplicas": 4}},
                           "status": {"readyReplicas": 2, "updatedReplicas": 2, "desiredReplicas": 4, "conditions": [
                               {"type": "Scaled", "status": "True", "reason": "ScaledUp"}]}})
    assert table(Model, [scaled], now=NOW)[1][0][:4] == ["llama", "2/4", "2", "1-4 ScaledUp"]

    headers, rows = table(Replica, [replica("r2", [("n1", [2]), ("n2", [0, 1])])], now=NOW)
    assert headers == ["NAME", "MODEL", "PHASE", "NODES", "ENDPOINT", "RESTARTS", "AGE"]
    assert rows == [["r2", "llama", "Ready", "n1,n2", "10.0.0.7:30000", "2", "75s"]]
    pending = replica("r4", [], phase="Pending")
    pending.status.endpoint = None
    pending.status.conditions = []
    assert table(Replica, [pending], now=NOW)[1][0][2:5] == ["Pending", "<none>", "<none>"]

    shard = parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Shard",
        "metadata": {"name": "r2-1", "creationTimestamp": (NOW - timedelta(minutes=4, seconds=5)).isoformat()},
        "spec": {"replica": "r2", "model": "llama", "node": "n2", "rank": 1, "worldSize": 2, "gpus": [0, 1],
                 "ports": {"serve": 30001, "distInit": 30002}, "headAddress": "10.0.0.7", "engine": "vllm",
                 "servedModelNames": ["llama"]},
        "status": {"phase": "Running", "pid": 4242},
    })
    assert table(Shard, [shard], now=NOW)[1] == [["r2-1", "n2", "1/2", "Running", "0,1", "30001", "4m5s"]]
    assert table(Shard, [shard], wide=True, now=NOW)[1][0][-4:] == ["r2", "vllm", "4242", "<none>"]


@pytest.mark.parametrize("delta, expected", [
    (timedelta(seconds=0), "0s"), (timedelta(seconds=119), "119s"), (timedelta(minutes=3, seconds=20), "3m20s"),
    (timedelta(minutes=5), "5m"), (timedelta(minutes=95), "95m"), (timedelta(hours=5, minutes=12), "5h12m"),
    (timedelta(hours=30), "30h"), (timedelta(days=3, hours=4), "3d4h"), (timedelta(days=120), "120d"),
    (timedelta(days=800), "2y"), (timedelta(seconds=-5), "0s"),
])
def test_human_age(delta, expected):
    assert human_age(NOW - delta, NOW) == expected


def test_format_table_aligns_columns_without_trailing_space():
    text = format_table(["NAME", "X"], [["a", "1"], ["longer-name", "22"]])
    assert text.splitlines() == ["NAME          X", "a             1", "longer-name   22"]


@pytest.mark.parametrize("text, labels, expected", [
    ("app=llama", {"app": "llama"}, True),
    ("app==llama", {"app": "llama"}, True),
    ("app=llama", {"app": "mistral"}, False),
    ("app!=llama", {}, True),
    ("app!=llama", {"app": "llama"}, False),
    ("team", {"team": ""}, True),
    ("!team", {"team": "x"}, False),
    ("app=llama, tier!=cache ,gitops.io/owner", {"app": "llama", "gitops.io/owner": "a"}, True),
    ("app=llama,!gitops.io/owner", {"app": "llama", "gitops.io/owner": "a"}, False),
    ("", {"anything": "1"}, True),
])
def test_selector_matches(text, labels, expected):
    assert parse_selector(text).matches(labels) is expected


def test_selector_round_trips_and_refuses_bad_parts():
    assert str(parse_selector("a==1, b!=2,c,!d")) == "a=1,b!=2,c,!d"
    for bad, why in [("a=b,,c", "empty requirement"), ("=x", "not a valid label key"),
                     ("app=a b", "not a valid label value"), ("app in (a,b)", "set-based")]:
        with pytest.raises(SelectorError, match=why):
            parse_selector(bad)
    assert parse_selector("app=").matches({"app": ""})   # empty value is a valid label value


def test_every_kind_has_a_printer():
    assert set(PRINTERS) == set(KINDS.values())


def test_a_table_refuses_objects_of_another_kind():
    with pytest.raises(TypeError, match="expected a Node, got a Replica"):
        table(Node, [replica("r1", [])], now=NOW)


WATCH_ON_A_TERMINAL = """
from llmgw.printers.table import WatchTable
with WatchTable() as view:
    assert view.live and not view.redraws
    view.show(["NAME", "PHASE"], [["r1", "Pending"]])
    assert view.redraws
    view.show(["NAME", "PHASE"], [["r1", "Ready"]])
print("stopped")
"""


def test_watch_table_redraws_in_place_on_a_terminal_and_stops():
    """`get -w` on a terminal: a live table, redrawn with each change, stopped when the watch ends."""
    import os
    import pty
    import subprocess
    import sys

    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", WATCH_ON_A_TERMINAL], stdin=sub, stdout=sub, stderr=sub,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "80"})
    os.close(sub)
    out = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:     # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(timeout=30) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "Pending" in text and "Ready" in text and text.index("Pending") < text.index("Ready")
    assert "\x1b[" in text                      # drawn by rich, cursor moves included: not plain rows
    assert text.rstrip().endswith("stopped")


def test_weights_rows_name_the_models_of_each_cached_digest_and_the_shards_using_it():
    a, b, c = ("sha256:" + x * 64 for x in "abc")
    full, empty, none = node("n1"), node("n2"), node("n3")
    full.status.weights = WeightsCache(capacityBytes=100 << 30, freeBytes=40 << 30, models=[
        CachedWeights(digest=b, bytes=20 << 30), CachedWeights(digest=a, bytes=40 << 30),
        CachedWeights(digest=c, bytes=1 << 20)])
    empty.status.weights = WeightsCache(capacityBytes=100 << 30, freeBytes=100 << 30)
    pinned = parse_object({"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "llama"},
                           "spec": {"source": "hf://org/llama", "digest": a, "profiles": [{"engine": "sim"}]}})

    def shard(name: str, model: str, on: str, pulled: str) -> Shard:
        return parse_object({
            "apiVersion": "llmgw.io/v1", "kind": "Shard", "metadata": {"name": name},
            "spec": {"replica": name, "model": model, "node": on, "rank": 0, "worldSize": 1, "engine": "sim",
                     "ports": {"serve": 30001, "distInit": 30002}, "headAddress": "10.0.0.7",
                     "servedModelNames": [model]},
            "status": {"phase": "Ready", "pull": {"digest": pulled, "bytesDone": 1, "bytesTotal": 1}}})
    shards = [shard("l-1", "llama", "n1", a), shard("l-2", "llama", "n1", a), shard("q-1", "qwen", "n9", b)]
    assert weights_rows([none, empty, full], [pinned], shards) == [
        ["n1", "sha256:" + "a" * 12, "40Gi", "llama", "2", "40Gi", "100Gi"],
        ["n1", "sha256:" + "b" * 12, "20Gi", "qwen", "0", "40Gi", "100Gi"],   # pulled elsewhere, unused here
        ["n1", "sha256:" + "c" * 12, "1Mi", "<none>", "0", "40Gi", "100Gi"],  # no model known for it
        ["n2", "<none>", "<none>", "<none>", "0", "100Gi", "100Gi"],
    ]
