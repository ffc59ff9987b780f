"""The agent's /metrics: its shards by phase, and its engines' own series joined to the fleet.

One Prometheus scrape of an agent sees every engine on its node: at each scrape the
agent reads the /metrics of each of its shards' serving engines (vLLM's, SGLang's,
llama-server's with --metrics, the sim's) and re-exposes their series as they are,
with the labels `model`, `replica`, `node`, `rank` and `engine` added (an engine's
own label of the same name is kept, renamed `engine_<name>`). An engine that does not
answer within the scrape's bound is left out of that scrape and counted in
`llmgw_agent_engine_scrape_errors_total`. The names are in docs/metrics.md.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

JOINED = ("model", "replica", "node", "rank", "engine")
SCRAPE_TIMEOUT = 2.0  # seconds an engine has to answer one scrape

FETCH_SOURCES = ("origin", "peer")   # where weights bytes come from (llmgw/weights/puller.py)


@dataclass(frozen=True)
class EngineTarget:
    """One serving engine on this node and the labels that place it in the fleet."""

    url: str          # its /metrics
    labels: dict[str, str]


class _Joined:
    """A collector over the families scraped this time (built per scrape)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class _Phases:
    def __init__(self, phases: Callable[[], Iterable[str]]) -> None:
        self.phases = phases

    def collect(self) -> Iterator[Metric]:
        counts: dict[str, int] = {}
        for phase in self.phases():
            counts[phase] = counts.get(phase, 0) + 1
        family = GaugeMetricFamily("llmgw_agent_shards", "Shards on this node, by phase", labels=["phase"])
        for phase, n in sorted(counts.items()):
            family.add_metric([phase], n)
        yield family


@dataclass(frozen=True)
class Pull:
    """A shard's weights on their way into the node's cache."""

    model: str
    replica: str
    done: int
    total: int


@dataclass(frozen=True)
class NodeFacts:
    """What the agent's own series read of it at a scrape."""

    pulls: list[Pull]
    cache_capacity: int | None       # the weights cache's budget and free bytes (None: no cache)
    cache_free: int | None
    failures: dict[str, int]         # model -> shards of it that went Failed on this node
    fetched: dict[str, int] = field(default_factory=dict)    # "peer"|"origin" -> verified weights bytes


class _Node:
    def __init__(self, facts: Callable[[], NodeFacts]) -> None:
        self.facts = facts

    def collect(self) -> Iterator[Metric]:
        f = self.facts()
        done = GaugeMetricFamily("llmgw_agent_pull_bytes", "Bytes of a pulling shard's weights in the "
                                 "node's cache so far", labels=["model", "replica"])
        total = GaugeMetricFamily("llmgw_agent_pull_total_bytes", "Bytes of a pulling shard's weights in all",
                                  labels=["model", "replica"])
        for p in f.pulls:
            done.add_metric([p.model, p.replica], p.done)
            total.add_metric([p.model, p.replica], p.total)
        yield done
        yield total
        if f.cache_capacity is not None and f.cache_free is not None:
            yield GaugeMetricFamily("llmgw_agent_weights_cache_capacity_bytes", "The weights cache's budget",
                                    value=f.cache_capacity)
            yield GaugeMetricFamily("llmgw_agent_weights_cache_free_bytes", "Bytes the weights cache may still "
                                    "take", value=f.cache_free)
        failures = CounterMetricFamily("llmgw_agent_shard_failures", "Shards that went Failed on this node "
                                       "(an engine that exited, was unhealthy, was refused or whose weights "
                                       "could not be pulled), by model", labels=["model"])
        for model, n in sorted(f.failures.items()):
            failures.add_metric([model], n)
        yield failures
        fetched = CounterMetricFamily("llmgw_agent_weights_fetched_bytes", "Bytes of weights files fetched "
                                      "and verified, by where from: a peer node or the origin", labels=["source"])
        for source in FETCH_SOURCES:     # both, from 0: a rate over a series that appears later misses its start
            fetched.add_metric([source], f.fetched.get(source, 0))
        yield fetched


class AgentMetrics:
    """The agent's registry, and the scrape of its engines that each request for /metrics makes."""

    def __init__(self, phases: Callable[[], Iterable[str]], targets: Callable[[], list[EngineTarget]],
                 node: Callable[[], NodeFacts] | None = None, more: Iterable[Collector] = ()) -> None:
        """`more`: other collectors of the agent's own series (its engines' adapters: adapters.py)."""
        self.registry = CollectorRegistry()
        self.registry.register(_Phases(phases))
        if node is not None:
            self.registry.register(_Node(node))
        for collector in more:
            self.registry.register(collector)
        self.scrape_errors = Counter("llmgw_agent_engine_scrape_errors", "Scrapes of an engine's /metrics "
                                     "that failed or took too long", ["model", "replica"], registry=self.registry)
        self.targets = targets

    async def exposition(self, session: aiohttp.ClientSession) -> bytes:
        targets = self.targets()
        texts = await asyncio.gather(*(self._scrape(session, t) for t in targets))
        joined = join([(t, text) for t, text in zip(targets, texts, strict=True) if text is not None])
        engines = CollectorRegistry()
        engines.register(_Joined(joined))
        return generate_latest(self.registry) + generate_latest(engines)

    async def _scrape(self, session: aiohttp.ClientSession, target: EngineTarget) -> str | None:
        try:
            async with session.get(target.url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)) as resp:
                if resp.status == 200:
                    return await resp.text()
                why = f"HTTP {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            why = str(err) or type(err).__name__
        log.debug("scrape of %s failed: %s", target.url, why)
        self.scrape_errors.labels(target.labels["model"], target.labels["replica"]).inc()
        return None


def join(scraped: list[tuple[EngineTarget, str]]) -> list[Metric]:
    """The engines' families, one per name, each sample with its engine's fleet labels added."""
    out: dict[str, Metric] = {}
    for target, text in scraped:
        for family in text_string_to_metric_families(text):
            merged = out.get(family.name)
            if merged is None:
                merged = out[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                labels = {(f"engine_{k}" if k in JOINED else k): v for k, v in s.labels.items()}
                merged.add_sample(s.name, {**labels, **target.labels}, s.value, s.timestamp, s.exemplar)
    return list(out.values())


def metrics_url(probe_url: str) -> str:
    """An engine's /metrics beside its health probe (same host and port)."""
    parts = urlsplit(probe_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


async def serve(metrics: AgentMetrics, host: str, port: int) -> web.AppRunner:
    """GET /metrics on host:port; the runner is returned so the caller can clean it up."""
    session = aiohttp.ClientSession()

    async def get_metrics(_request: web.Request) -> web.Response:
        return web.Response(body=await metrics.exposition(session), content_type="text/plain", charset="utf-8")

    async def close_session(_app: web.Application) -> None:
        await session.close()

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.on_cleanup.append(close_session)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
