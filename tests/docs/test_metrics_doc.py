"""docs/metrics.md names exactly what each component exports: every documented series is
exported, and every exported llmgw_ series is documented (once each of its labelled
series has a sample)."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controllers.fleet import FleetCollector
from controllers.scheduler import SchedulerCollector, SchedulerController
from llmgw.agent.adapters import AdapterCounts
from llmgw.agent.metrics import AgentMetrics, NodeFacts, Pull
from llmgw.gateway.admission import Admission
from llmgw.gateway.kvindexes import KVIndexes
from llmgw.gateway.metrics import Metrics as GatewayMetrics
from llmgw.gateway.table import Backend
from llmgw.pki.renewal import ExpiryCollector
from llmgw.runtime.cache import Cache
from llmgw.runtime.metrics import ManagerMetrics
from llmgw.server.audit import AuditLog, WebhookBackend
from llmgw.server.metrics import ServerMetrics
from tests.fixtures.ctrlkit import node, replica, shard
from tests.fixtures.gateway import lora

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
NAME = re.compile(r"^\| `(llmgw_[a-z_]+)` \|", re.M)
# what each command registers beside its component's metrics: the expiry of the certificates it presents
EXPIRY = ExpiryCollector({"node": lambda: datetime.now(timezone.utc)})


def documented(section: str) -> set[str]:
    text = DOC.read_text().split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return set(NAME.findall(text))


def exported(text: bytes) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:   # counters' names carry _total; a histogram's is its family's
            if sample.name.endswith("_created"):   # prometheus_client's creation time of a series
                continue
            names.add(family.name if family.type == "histogram" else sample.name)
    return {n for n in names if n.startswith("llmgw_")}


async def test_the_gateways_series_are_documented():
    m = GatewayMetrics(lambda: [("m", "m-0", 1, True)])
    m.observe("m", 200, 0.01)
    timer = m.stream("m", 0.0, (16, 16))   # a precise-prefix request's, its prediction checked
    timer.chunk(b'data: {"usage":{"prompt_tokens":3,"completion_tokens":2,'
                b'"prompt_tokens_details":{"cached_tokens":16}}}\n\n')
    timer.end()
    m.retry("m")
    m.upstream_error("m", "m-0", "refused")
    admission = Admission(lambda model: {}, lambda name: name)   # the per-key series (--watch-api-keys)
    admission.usage("key-a", "m")
    m.registry.register(admission.collector())
    m.registry.register(EXPIRY)
    kv = KVIndexes()   # precise-prefix's indexes, following a replica's KV events
    kv.sync([Backend("m-0", "m", "127.0.0.1:1", kv_events="tcp://127.0.0.1:1")])
    m.registry.register(kv)
    try:
        assert exported(generate_latest(m.registry)) == documented("Gateway")
    finally:
        await kv.close()


def test_the_controller_managers_series_are_documented():
    m = ManagerMetrics(lambda: {"model": 0}, lambda: {"models": 1})
    m.duration.labels("model").observe(0.01)
    m.errors.labels("model").inc()
    m.leader.set(1)
    m.queue_stats("model").observe_wait(0.01)
    scheduler = SchedulerController()
    scheduler.unschedulable["r2"] = "insufficient GPUs"
    m.registry.register(SchedulerCollector(scheduler, lambda: True))
    cache = Cache()
    for obj in (node("n1", fabric="ib-a"), replica("r1", "m"), shard("r1-0", replica("r1", "m"), "n1"),
                lora("a1", "m", ("r1",))):
        cache.apply(obj.kind_plural, "ADDED", obj, 1)
    m.registry.register(FleetCollector(lambda: cache))
    m.registry.register(EXPIRY)
    assert exported(m.exposition()) == documented("Controller-manager")


def test_the_servers_series_are_documented():
    m = ServerMetrics()
    m.observe("get", "models", 200)
    m.watches.labels("models").inc()
    m.audit(AuditLog([WebhookBackend("http://127.0.0.1:9/", buffer=1)]))   # never sent a line
    m.registry.register(EXPIRY)
    assert exported(generate_latest(m.registry)) == documented("API server")


async def test_the_agents_series_are_documented():
    facts = NodeFacts([Pull("m", "m-1", 10, 100)], cache_capacity=1000, cache_free=900, failures={"m": 1},
                      fetched={"peer": 3, "origin": 1})
    counts = AdapterCounts()
    m = AgentMetrics(lambda: ["Ready"], lambda: [], lambda: facts, [counts])
    m.scrape_errors.labels("m", "m-0").inc()
    counts.loads.labels("m", "loaded").inc()
    counts.unloads.labels("m").inc()
    counts.load_seconds.labels("m").observe(0.5)
    m.registry.register(EXPIRY)
    async with aiohttp.ClientSession() as session:
        assert exported(await m.exposition(session)) == documented("Agent")
