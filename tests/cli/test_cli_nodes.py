"""`llmgw get/describe/cordon/drain/ctl` and the CLI's error lines, against a real server on real etcd."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import yaml

from llmgw.api import Model, Node, parse_object
from llmgw.client import ClientConfig
from llmgw.dev.process import free_port
from tests.fixtures.cluster import admin_cli_config, llmgw, make_pki, shared_api_server  # noqa: F401


def spawn(config: Path, *args: str) -> subprocess.Popen:
    """The real `llmgw` process, its stdout a pipe (so it prints plain lines, as into any pipe)."""
    return subprocess.Popen([sys.executable, "-c", "from llmgw.cli.main import cli; cli()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LLMGW_CONFIG": str(config), "PYTHONUNBUFFERED": "1"})


def obj(kind: str, name: str, spec: dict, status: dict | None = None, labels: dict | None = None):
    return parse_object({"apiVersion": "llmgw.io/v1", "kind": kind,
                         "metadata": {"name": name, "labels": labels or {}}, "spec": spec,
                         "status": status or {}})


def node_status(gpus: int, ready: str = "True", **extra) -> dict:
    return {"conditions": [{"type": "Ready", "status": ready, "reason": "Heartbeat"}],
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(gpus)],
            "addresses": ["10.1.0.5"], "fabrics": [{"name": "ib-east"}], "agentVersion": "0.1.0",
            "engines": [{"name": "vllm", "path": "/usr/bin/vllm", "version": "0.6.3"}], **extra}


def replica_spec(model: str, placement: list[tuple[str, list[int]]]) -> dict:
    return {"model": model, "templateHash": "h1", "profile": {"engine": "vllm", "nodes": len(placement)},
            "servedModelNames": [model],
            "placement": [{"rank": i, "node": n, "gpus": g, "fabric": "ib-east"} for i, (n, g) in enumerate(placement)]}


async def seed(server, *objects, statuses=True):
    async with server.client() as c:
        for o in objects:
            created = await c.create(o)
            if statuses:
                o.metadata = created.metadata
                await c.update_status(o)


def columns(text: str) -> list[list[str]]:
    """Table rows split into cells, without the AGE column (the clock moves between two commands)."""
    lines = text.strip().splitlines()
    age = lines[0].split().index("AGE")
    return [line.split()[:age] + line.split()[age + 1:] for line in lines]


def test_nodes_table_status_gpus_and_ctl_nodes(shared_api_server, config):
    asyncio.run(seed(
        shared_api_server,
        obj("Node", "tbl-a", {}, node_status(4), labels={"pool": "tbl"}),
        obj("Node", "tbl-b", {"unschedulable": True}, node_status(8, ready="False", conditions=[
            {"type": "Ready", "status": "False", "reason": "HeartbeatExpired"},
            {"type": "GPUDiscovery", "status": "False", "reason": "NvidiaSmiFailed", "message": "exit 9"}]),
            labels={"pool": "tbl"}),
        obj("Replica", "tbl-r1", replica_spec("tbl-m", [("tbl-a", [0, 1])]), {"phase": "Ready"}),
        obj("Replica", "tbl-r2", replica_spec("tbl-m", [("tbl-a", [2]), ("tbl-b", [0, 1, 2, 3])]),
            {"phase": "Starting", "endpoint": "10.1.0.5:30000", "restarts": 1}),
    ))
    out = llmgw(config, "get", "nodes", "-l", "pool=tbl")
    assert out.exit_code == 0, out.output
    assert columns(out.stdout) == [
        ["NAME", "STATUS", "GPUS", "FABRICS", "ENGINES", "REPLICAS"],
        ["tbl-a", "Ready", "3/4", "ib-east", "vllm", "2"],
        ["tbl-b", "NotReady,GPUDiscoveryFailed,SchedulingDisabled", "4/8", "ib-east", "vllm", "1"],
    ]
    ctl = llmgw(config, "ctl", "nodes", "-l", "pool=tbl")
    assert columns(ctl.stdout) == columns(out.stdout)

    wide = llmgw(config, "get", "no", "tbl-a", "-o", "wide")
    header, row = wide.stdout.strip().splitlines()
    assert header.split()[-3:] == ["ADDRESS", "GPU-MODEL", "AGENT"]
    assert row.endswith("10.1.0.5   NVIDIA H100 80GB HBM3   0.1.0")

    reps = llmgw(config, "get", "replicas")
    rows = {r[0]: r for r in columns(reps.stdout)}
    assert rows["NAME"] == ["NAME", "MODEL", "PHASE", "NODES", "ENDPOINT", "RESTARTS"]
    assert rows["tbl-r2"] == ["tbl-r2", "tbl-m", "Starting", "tbl-a,tbl-b", "10.1.0.5:30000", "1"]
    assert rows["tbl-r1"] == ["tbl-r1", "tbl-m", "Ready", "tbl-a", "<none>", "0"]

    described = llmgw(config, "describe", "node", "tbl-b").stdout.splitlines()
    assert "Allocated GPUs: 4/8" in described
    cond = described.index("Conditions:")
    assert described[cond + 2].split()[:3] == ["Ready", "False", "HeartbeatExpired"]
    assert described[cond + 3].split()[:3] == ["GPUDiscovery", "False", "NvidiaSmiFailed"]
    reps_at = described.index("Replicas:")
    assert described[reps_at + 2].split() == ["tbl-r2", "tbl-m", "Starting", "0,1,2,3"]


def test_get_outputs_and_describe_events(shared_api_server, config, tmp_path):
    manifest = {"apiVersion": "llmgw.io/v1", "kind": "Model",
                "metadata": {"name": "out-m", "labels": {"app": "out"}},
                "spec": {"replicas": 2, "aliases": ["om"], "profiles": [{"engine": "sim"}]}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(manifest))
    assert llmgw(config, "apply", "-f", str(tmp_path / "m.yaml")).exit_code == 0

    async def event():
        async with shared_api_server.client() as c:
            await c.record_event(Model, "out-m", "Warning", "Unschedulable", "0/3 nodes: 3 insufficient GPUs")
    asyncio.run(event())

    table = llmgw(config, "get", "models", "-l", "app=out")
    assert columns(table.stdout) == [["NAME", "READY", "UP-TO-DATE", "AUTOSCALE", "ENGINE", "ALIASES"],
                                     ["out-m", "0/2", "0", "<none>", "sim", "om"]]
    as_yaml = yaml.safe_load(llmgw(config, "get", "model", "out-m", "-o", "yaml").stdout)
    assert parse_object(as_yaml).spec.aliases == ["om"]
    listed = yaml.safe_load(llmgw(config, "get", "models", "-l", "app=out", "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["out-m"]
    none = llmgw(config, "get", "models", "-l", "app=nothing")
    assert (none.exit_code, none.stdout, none.stderr.strip()) == (0, "", "No resources found.")

    lines = llmgw(config, "describe", "mo", "out-m").stdout.splitlines()
    assert lines[0].split() == ["Name:", "out-m"] and "  replicas: 2" in lines
    ev = lines.index("Events:")
    assert lines[ev + 1].split() == ["TYPE", "REASON", "AGE", "MESSAGE"]
    row = lines[ev + 2].split()
    assert row[:2] == ["Warning", "Unschedulable"] and row[3:] == "0/3 nodes: 3 insufficient GPUs".split()


def test_cordon_uncordon(shared_api_server, config):
    asyncio.run(seed(shared_api_server, obj("Node", "cor-a", {}, node_status(2))))
    assert llmgw(config, "cordon", "cor-a").stdout.strip() == "node/cor-a cordoned"
    assert llmgw(config, "cordon", "cor-a").stdout.strip() == "node/cor-a already cordoned"
    assert columns(llmgw(config, "get", "node", "cor-a").stdout)[1][1] == "Ready,SchedulingDisabled"
    assert llmgw(config, "uncordon", "cor-a").stdout.strip() == "node/cor-a uncordoned"
    assert columns(llmgw(config, "get", "node", "cor-a").stdout)[1][1] == "Ready"
    missing = llmgw(config, "cordon", "no-such-node")
    assert missing.exit_code == 1 and "no-such-node" in missing.stderr


def _expect(proc: subprocess.Popen, line: str) -> None:
    got = proc.stdout.readline().rstrip("\n")
    assert got == line, f"expected {line!r}, got {got!r}; stderr: {proc.stderr.read() if not got else ''}"


def test_drain_wait_follows_status_until_drained(shared_api_server, config):
    asyncio.run(seed(shared_api_server, obj("Node", "dr-a", {}, node_status(2))))
    # a Drained left over from an earlier drain must not end this one
    asyncio.run(_patch(shared_api_server, "dr-a", {"phase": "Drained", "remaining": 0}))
    proc = spawn(config, "drain", "dr-a", "--wait")
    try:
        _expect(proc, "node/dr-a cordoned, drain requested")
        _expect(proc, "node/dr-a drain requested, waiting for the drain controller")
        asyncio.run(_patch(shared_api_server, "dr-a", {"phase": "Draining", "remaining": 2, "current": "rep-1"}))
        _expect(proc, "node/dr-a Draining: 2 replica(s) remaining, moving rep-1")
        asyncio.run(_patch(shared_api_server, "dr-a", {"phase": "Drained", "remaining": 0}))
        _expect(proc, "node/dr-a Drained: 0 replica(s) remaining")
        _expect(proc, "node/dr-a drained")
        assert proc.wait() == 0
    finally:
        proc.kill()
        proc.wait()
    spec = yaml.safe_load(llmgw(config, "get", "node", "dr-a", "-o", "yaml").stdout)["spec"]
    assert spec == {"unschedulable": True, "drain": True}
    status = {r[0]: r[1] for r in columns(llmgw(config, "ctl", "nodes").stdout)}
    assert status["dr-a"] == "Ready,SchedulingDisabled,Drained"

    # asked again when already drained: done at once
    again = llmgw(config, "ctl", "drain", "dr-a", "--wait")
    assert again.exit_code == 0
    assert again.stdout.splitlines()[0] == "node/dr-a drain already requested"
    assert again.stdout.splitlines()[-1] == "node/dr-a drained"


def test_drain_wait_exits_1_when_stuck(shared_api_server, config):
    asyncio.run(seed(shared_api_server, obj("Node", "dr-s", {}, node_status(2))))
    proc = spawn(config, "drain", "dr-s", "--wait")
    try:
        _expect(proc, "node/dr-s cordoned, drain requested")
        _expect(proc, "node/dr-s drain requested, waiting for the drain controller")
        asyncio.run(_patch(shared_api_server, "dr-s", {"phase": "Stuck", "remaining": 1, "current": "rep-9",
                                                       "message": "0/3 nodes fit rep-9: 3 insufficient GPUs"}))
        _expect(proc, "node/dr-s Stuck: 1 replica(s) remaining, moving rep-9: 0/3 nodes fit rep-9: 3 insufficient GPUs")
        assert proc.wait() == 1
        err = proc.stderr.read().strip()
        assert err.startswith("error: the drain of node dr-s is stuck: 0/3 nodes fit rep-9: 3 insufficient GPUs")
        assert len(err.splitlines()) == 1
    finally:
        proc.kill()
        proc.wait()
    # uncordon cancels the drain request
    assert llmgw(config, "uncordon", "dr-s").stdout.strip() == "node/dr-s uncordoned (drain cancelled)"


async def _patch(server, node: str, drain: dict) -> None:
    async with server.client() as c:
        await c.patch_status(Node, node, {"drain": drain})


def test_get_watch_prints_changed_rows(shared_api_server, config, tmp_path):
    doc = {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "w-m", "labels": {"app": "w"}},
           "spec": {"replicas": 1, "profiles": [{"engine": "sim"}]}}
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert llmgw(config, "apply", "-f", str(f)).exit_code == 0
    proc = spawn(config, "get", "models", "-l", "app=w", "-w")
    try:
        assert proc.stdout.readline().split() == ["NAME", "READY", "UP-TO-DATE", "AUTOSCALE", "ENGINE", "ALIASES",
                                                  "AGE"]
        assert proc.stdout.readline().split()[:2] == ["w-m", "0/1"]
        doc["spec"]["replicas"] = 3
        f.write_text(yaml.safe_dump(doc))
        assert llmgw(config, "apply", "-f", str(f)).exit_code == 0
        assert proc.stdout.readline().split()[:2] == ["w-m", "0/3"]
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- error lines

def test_unreachable_server_names_the_url(config):
    port = free_port()
    out = llmgw(config, "get", "models", "--server", f"https://127.0.0.1:{port}")
    assert out.exit_code == 3
    assert out.stderr.startswith(f"error: cannot reach the llmgw server at https://127.0.0.1:{port}/")
    assert len(out.stderr.strip().splitlines()) == 1


def test_wrong_ca_is_a_tls_error_naming_the_server_side(config, tmp_path):
    other = make_pki(tmp_path / "other-ca")
    out = llmgw(config, "get", "models", "--ca", other.ca)
    assert out.exit_code == 3
    assert "TLS failed" in out.stderr and "the server's certificate: not trusted" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_node_certificate_is_forbidden_naming_the_rule(shared_api_server, config, tmp_path):
    cert, key = shared_api_server.issue_node("err-n1")
    node_cfg = tmp_path / "node.yaml"
    ClientConfig(server=shared_api_server.url, ca=shared_api_server.ca, cert=cert, key=key).save(node_cfg)
    out = llmgw(node_cfg, "cordon", "tbl-a")
    assert out.exit_code == 4
    line = out.stderr.strip()
    assert line.startswith("error: forbidden by rule node-self: ") and "err-n1" in line
    assert len(line.splitlines()) == 1
    # overrides on the command line replace the config file's fields
    out = llmgw(config, "delete", "model", "x", "--cert", cert, "--key", key)
    assert out.exit_code == 4 and "forbidden by rule node" in out.stderr
    # with all four on the command line no config file is needed
    out = llmgw(tmp_path / "absent.yaml", "get", "node", "err-n1", "--server", shared_api_server.url,
                "--ca", shared_api_server.ca, "--cert", cert, "--key", key)
    assert out.exit_code == 1 and out.stderr.strip() == "error: nodes/err-n1 not found"


def test_missing_or_bad_config_is_a_usage_error(tmp_path):
    out = llmgw(tmp_path / "none.yaml", "get", "models")
    assert out.exit_code == 2
    assert out.stderr.strip().startswith(f"error: {tmp_path / 'none.yaml'}: no client configuration")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: https://x\nca: ca.crt\ncert: a.crt\nkey: a.key\ntoken: x\n")
    out = llmgw(bad, "get", "models")
    assert out.exit_code == 2 and "unknown field 'token'" in out.stderr
    out = llmgw(bad, "get", "pods")
    assert out.exit_code == 2 and "unknown kind 'pods'" in out.stderr


def test_get_nodes_watch_follows_replica_placements(shared_api_server, config):
    asyncio.run(seed(shared_api_server, obj("Node", "wn-a", {}, node_status(2), labels={"pool": "wn"})))
    proc = spawn(config, "get", "nodes", "-l", "pool=wn", "-w")
    try:
        assert proc.stdout.readline().split()[:3] == ["NAME", "STATUS", "GPUS"]
        assert proc.stdout.readline().split()[:3] == ["wn-a", "Ready", "0/2"]
        # a replica placed on the node changes the node's row, though the Node itself did not change
        asyncio.run(seed(shared_api_server, obj("Replica", "wn-r", replica_spec("wn-m", [("wn-a", [1])])),
                         statuses=False))
        assert proc.stdout.readline().split()[:3] == ["wn-a", "Ready", "1/2"]
    finally:
        proc.kill()
        proc.wait()
