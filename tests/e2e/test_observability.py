"""What an operator scrapes, against a running local cluster: every row of docs/metrics.md
is exported by its component with the documented type and labels, every expression of
the dashboards in deploy/grafana/ reads series that are exported, and the cluster's
prometheus.yml scrapes every component.

The cluster runs three models: one served (requests, streamed with usage and not), one
whose engine crashes on its first request (an upstream error and a retry at the
gateway), and one too wide for any node (an unschedulable replica).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llmgw.api import Model, Replica
from llmgw.cli.metricsview import MODEL_HEADERS, NODE_HEADERS, REPLICA_HEADERS
from llmgw.client import Client, ClientConfig
from llmgw.dev import prometheus
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import LLMGW, free_port
from tests.fixtures.poll import until
from tests.fixtures.promql import grouping, selectors

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
pytestmark = pytest.mark.timeout(400)

# docs/metrics.md's sections, by the job that scrapes them
SECTIONS = {"Gateway": "llmgw-gateways", "Controller-manager": "llmgw-controller-manager",
            "API server": "llmgw-server", "Agent": "llmgw-agents"}
ROW = re.compile(r"^\| `(llmgw_[a-z_]+)` \| (\w+) \| ([a-z_, ]*) \|", re.M)
# Counted only when it happens, and nothing here makes it happen for sure.
EVENTS_ONLY = {"llmgw_agent_engine_scrape_errors_total", "llmgw_agent_pull_bytes", "llmgw_agent_pull_total_bytes",
               "llmgw_gateway_kv_event_gaps_lost_total"}   # a gap the engine's replay could not fill (tests/kvevents)
# Exported by a gateway run with --watch-api-keys only; this cluster's takes no ApiKeys
# (tests/gateway/test_gateway_admission.py reads them from gateways that do).
WITH_API_KEYS = {"llmgw_gateway_key_requests_total", "llmgw_gateway_key_input_tokens_total",
                 "llmgw_gateway_key_output_tokens_total", "llmgw_gateway_key_rate_limited_total",
                 "llmgw_gateway_key_limit_gateways"}
# Exported by a server with an audit log or webhook only (tests/server/test_server_audit.py reads it).
WITH_AUDIT = {"llmgw_server_audit_dropped_lines_total"}
# Sampled once LoRA adapters are in use; this cluster serves none (tests/e2e/test_adapters_e2e.py reads them).
WITH_ADAPTERS = {"llmgw_fleet_adapters_resident", "llmgw_agent_adapter_loads_total",
                 "llmgw_agent_adapter_unloads_total", "llmgw_agent_adapter_load_seconds"}
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
TARGET_LABELS = {"instance", "job"}   # added by Prometheus to every series it scrapes


def sim_model(name: str, gpus: int = 1, args: tuple[str, ...] = (), routing: str | None = None) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": 1, "profiles": [{"engine": "sim", "gpusPerNode": gpus, "args": list(args)}],
        **({"routing": {"policy": routing}} if routing else {})}})


@dataclass
class Family:
    type: str
    labels: set[frozenset[str]] = field(default_factory=set)   # each sample's label names
    samples: dict[str, set[str]] = field(default_factory=dict)   # sample name -> its label names


Scrape = dict[str, dict[str, Family]]   # job -> family name -> Family


async def scrape(cluster: LocalCluster) -> Scrape:
    out: Scrape = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        for job, targets in prometheus.jobs(cluster.metrics_addresses).items():
            families = out.setdefault(job, {})
            for target in targets:
                async with s.get(f"http://{target}/metrics") as r:
                    assert r.status == 200, (job, target)
                    text = await r.text()
                for f in text_string_to_metric_families(text):
                    fam = families.setdefault(f.name, Family(f.type))
                    for suffix in SAMPLE_SUFFIXES.get(f.type, ("",)):   # named by its HELP even with no sample
                        fam.samples.setdefault(f.name + suffix, set())
                    for x in f.samples:
                        if x.name.endswith("_created"):   # prometheus_client's creation time of a series
                            continue
                        names = frozenset(x.labels) - {"le", "quantile"}
                        fam.labels.add(names)
                        fam.samples.setdefault(x.name, set()).update(names)
    return out


def documented() -> list[tuple[str, str, str, set[str]]]:
    """(job, name, type, labels) of every row of docs/metrics.md."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    rows = []
    for section, job in SECTIONS.items():
        body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
        for name, type_, labels in ROW.findall(body):
            rows.append((job, name, type_, {x.strip() for x in labels.split(",") if x.strip()}))
    return rows


def family_name(name: str, type_: str) -> str:
    return name.removesuffix("_total") if type_ == "counter" else name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("observe"), [NodePlan("node01", "ib-a"), NodePlan("node02", None)],
                     gateway_port=free_port(), lease_seconds=4.0)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def exported(cluster) -> Scrape:
    """The cluster's scrape once every documented series has samples."""
    return asyncio.run(_load_and_scrape(cluster))


async def _load_and_scrape(cluster: LocalCluster) -> Scrape:
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
        for m in (sim_model("obs-chat", args=("--tokens-per-second", "200")),
                  sim_model("obs-crash", args=("--crash-on-request", "1")),
                  sim_model("obs-kv", routing="precise-prefix"),   # the gateway's KV index series
                  sim_model("obs-wide", gpus=16)):
            await c.create(m)

        async def ready() -> bool:
            items, _ = await c.list(Replica)
            return {r.spec.model for r in items if r.status.phase == "Ready"} >= {"obs-chat", "obs-crash", "obs-kv"}
        await until(ready, "a Ready replica of obs-chat, obs-crash and obs-kv", timeout=120, interval=0.3)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        async def post(model: str, **extra) -> int:
            body = {"model": model, "messages": [{"role": "user", "content": "how are you"}], "max_tokens": 4,
                    **extra}
            async with s.post(f"{cluster.gateway_url}/v1/chat/completions", json=body) as r:
                await r.read()
                return r.status
        await until(lambda: _is(post("obs-chat"), 200), "obs-chat served through the gateway", timeout=60)
        assert await post("obs-chat", stream=True, stream_options={"include_usage": True}) == 200
        await until(lambda: _is(post("obs-kv"), 200), "obs-kv served (its engine's KV events)", timeout=60)

        async def predicted() -> bool:   # once its index follows the engine's events (of whole blocks: a
            # long prompt), a request's prediction is checked against the cached tokens the engine reports
            await post("obs-kv", messages=[{"role": "user", "content": "how are you " * 40}])
            return bool((await scrape(cluster)).get("llmgw-gateways", {}).get("llmgw_gateway_kv_predictions",
                                                                       Family("")).labels)
        await until(predicted, "an obs-kv request's predicted cached tokens checked", timeout=60, interval=0.3)
        await until(lambda: _is(post("obs-crash"), 502), "obs-crash's engine crashing on its request",
                    timeout=60)

    def missing(got: Scrape) -> list[str]:
        return [name for job, name, type_, _ in documented()
                if name not in EVENTS_ONLY | WITH_API_KEYS | WITH_AUDIT | WITH_ADAPTERS
                and not got.get(job, {}).get(family_name(name, type_), Family("")).labels]
    last: list[Scrape] = []

    async def complete() -> Scrape | None:
        last[:] = [await scrape(cluster)]
        return last[0] if not missing(last[0]) else None
    return await until(complete, "a sample of every documented series", timeout=60, interval=0.5,
                       detail=lambda: f"missing: {missing(last[0]) if last else '?'}")


async def _is(status, want: int) -> bool:
    return await status == want


def test_every_documented_series_is_exported_with_its_type_and_labels(exported):
    for job, name, type_, labels in documented():
        fam = exported[job].get(family_name(name, type_))
        if name in WITH_API_KEYS | WITH_AUDIT:
            continue
        assert fam is not None, f"{name} is documented but {job} does not export it"
        assert fam.type == type_, f"{name}: documented as a {type_}, exported as a {fam.type}"
        for got in fam.labels:
            assert got == labels, f"{name}: documented labels {sorted(labels)}, exported {sorted(got)}"


def test_an_engines_series_reach_the_agents_job_relabelled(exported):
    running = exported["llmgw-agents"]["vllm:num_requests_running"]
    assert running.labels and all({"model", "replica", "node", "rank", "engine"} <= names
                                  for names in running.labels)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_dashboard_expression_reads_exported_series(exported, path):
    samples: dict[str, set[str]] = {}   # every exported sample name -> its label names
    for families in exported.values():
        for fam in families.values():
            for name, labels in fam.samples.items():
                samples.setdefault(name, set()).update(labels)
    doc = json.loads(path.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs, f"{path.name} has no expressions"
    for var in doc["templating"]["list"]:
        if var["type"] == "query":   # label_values(metric, label)
            metric, label = re.fullmatch(r"label_values\((\S+), (\w+)\)", var["definition"]).groups()
            assert label in samples.get(metric, set()), f"{path.name} ${var['name']}: {var['definition']}"
    for expr in exprs:
        read = selectors(expr)
        assert read, f"{path.name}: no series in {expr!r}"
        labels = set(TARGET_LABELS) | {"le"}
        for name, matched in read:
            assert name in samples, f"{path.name}: {name} is not exported ({expr!r})"
            assert matched <= samples[name] | TARGET_LABELS, f"{path.name}: {name} has no {matched} ({expr!r})"
            labels |= samples[name]
        assert grouping(expr) <= labels, f"{path.name}: grouping by what no series has in {expr!r}"


def test_the_clusters_prometheus_yml_scrapes_every_component(cluster):
    doc = yaml.safe_load((cluster.dir / "prometheus.yml").read_text())
    targets = {t for job in doc["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == set(cluster.metrics_addresses.values())
    assert len(targets) == 6   # server, controller-manager, gateway, two agents, etcd
    fleet = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert [j["job_name"] for j in fleet["scrape_configs"]] == list(prometheus.JOBS)


@pytest.mark.parametrize("found", ["cluster.json", "config"])
def test_llmgw_top_shows_each_models_rate_and_each_nodes_gpus(cluster, exported, found, tmp_path):
    """Through the dev cluster's cluster.json, or (as in production) the config file alone: the
    agents' metrics addresses in their Nodes' status, the other components' under their leases."""
    where = (["--dir", str(cluster.dir)] if found == "cluster.json" else ["--dir", str(tmp_path)])
    env = {**os.environ, "LLMGW_CONFIG": str(cluster.admin_config)} if found == "config" else None

    async def under_load() -> str:
        top = await asyncio.create_subprocess_exec(
            *LLMGW, "top", "--once", *where, "--interval", "3", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        body = {"model": "obs-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": True, "stream_options": {"include_usage": True}}
        async with aiohttp.ClientSession() as s:
            while top.returncode is None:   # requests until top has read its second scrape
                async with s.post(f"{cluster.gateway_url}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(top.wait()), 0.05)
        out, _ = await top.communicate()
        assert top.returncode == 0, out.decode()
        return out.decode()
    text = asyncio.run(under_load())
    sections = text.split("\n\n")
    assert [s.splitlines()[0] for s in sections[:3]] == ["MODELS", "REPLICAS", "NODES"], text
    models, replicas, nodes = (columns(s.splitlines()[1:], h) for s, h in
                               zip(sections, (MODEL_HEADERS, REPLICA_HEADERS, NODE_HEADERS), strict=False))
    assert set(models) == {"obs-chat", "obs-crash", "obs-kv", "obs-wide"}, text
    assert models["obs-wide"]["READY"] == "0/1", text
    chat = models["obs-chat"]
    assert chat["READY"] == "1/1" and float(chat["REQ/S"]) > 0 and chat["TTFT P50"] != "-", text
    assert set(nodes) == {"node01", "node02"}, text
    assert sum(int(n["GPUS"].split("/")[0]) for n in nodes.values()) >= 2, text   # obs-chat's and obs-crash's
    assert any(r["MODEL"] == "obs-chat" and r["NODE"] in nodes for r in replicas.values()), text


def columns(lines: list[str], headers: list[str]) -> dict[str, dict[str, str]]:
    """A plain table's rows by their first cell, each cell under its header (headers hold spaces)."""
    starts = [lines[0].index(h) for h in headers] + [None]
    return {row[:starts[1]].strip(): {h: row[a:b].strip() for h, a, b in zip(headers, starts, starts[1:],
                                                                              strict=False)}
            for row in lines[1:]}


# Grafana's variables, replaced by what Prometheus would be sent
GRAFANA_VARS = {"$__rate_interval": "1m", "$controller": ".*", "$model": ".*"}


def test_every_dashboard_expression_is_promql_that_prometheus_parses(tmp_path):
    """Prometheus' own parser (promtool, from Debian's prometheus package, which
    hack/test.sh installs) reads every dashboard expression as a recording rule."""
    import shutil
    import subprocess
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (hack/test.sh does)"
    rules = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for i, target in enumerate(panel.get("targets", [])):
                expr = target["expr"]
                for var, value in GRAFANA_VARS.items():
                    expr = expr.replace(var, value)
                assert "$" not in expr, f"{path.name}: a variable this test does not know in {expr!r}"
                rules.append({"record": f"dashboard:{path.stem.replace('-', '_')}_{panel['id']}_{i}", "expr": expr})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout
