"""The fleet as metrics: GPUs per node and fabric, replicas per model and phase, nodes per condition,
LoRA adapters resident per replica.

Read from the leading controller-manager's cache at each scrape (nothing is counted on
the controllers' path); a manager that does not lead exports none of these series. The
names are in docs/metrics.md.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llmgw.api import LoraAdapter, Node, Replica, Shard
from llmgw.runtime.cache import Cache

# Shard phases whose GPUs are held (booked by the scheduler, or an engine still on them).
RELEASED = ("Stopped",)


class FleetCollector:
    def __init__(self, cache: Callable[[], Cache | None]) -> None:
        self.cache = cache

    @staticmethod
    def describe() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                            GaugeMetricFamily]:
        """Its families, empty: GPUs and those allocated, nodes, replicas, resident adapters. A
        scrape that names other series (`/metrics?name[]=...`) is so spared the pass over the cache."""
        return (GaugeMetricFamily("llmgw_fleet_gpus", "GPUs a node reports, by node and fabric",
                                  labels=["node", "fabric"]),
                GaugeMetricFamily("llmgw_fleet_gpus_allocated", "GPUs held by shards, by node and fabric",
                                  labels=["node", "fabric"]),
                GaugeMetricFamily("llmgw_fleet_nodes", "Nodes by condition and its status",
                                  labels=["condition", "status"]),
                GaugeMetricFamily("llmgw_fleet_replicas", "Replicas by model and phase", labels=["model", "phase"]),
                GaugeMetricFamily("llmgw_fleet_adapters_resident", "LoRA adapters resident on a replica, by "
                                  "base model and replica", labels=["model", "replica"]))

    def collect(self) -> Iterator[Metric]:
        cache = self.cache()
        if cache is None:
            return
        gpus, used, nodes, replicas, adapters = self.describe()
        held: Counter[str] = Counter()
        for s in cache.list(Shard):
            if s.status.phase not in RELEASED:
                held[s.spec.node] += len(s.spec.gpus)
        conditions: Counter[tuple[str, str]] = Counter()
        for n in sorted(cache.list(Node), key=lambda n: n.name):
            fabric = ",".join(sorted(f.name for f in n.status.fabrics))   # "" on an island
            gpus.add_metric([n.name, fabric], len(n.status.gpus))
            used.add_metric([n.name, fabric], held.get(n.name, 0))
            for c in n.status.conditions:
                conditions[(c.type, c.status)] += 1
        for (type_, status), count in sorted(conditions.items()):
            nodes.add_metric([type_, status], count)
        phases: Counter[tuple[str, str]] = Counter(
            (r.spec.model, r.status.phase) for r in cache.list(Replica))
        for (model, phase), count in sorted(phases.items()):
            replicas.add_metric([model, phase], count)
        resident: Counter[tuple[str, str]] = Counter(
            (a.spec.baseModel, r) for a in cache.list(LoraAdapter) for r in a.status.resident)
        for (model, replica), count in sorted(resident.items()):
            adapters.add_metric([model, replica], count)
        yield from (gpus, used, nodes, replicas, adapters)
