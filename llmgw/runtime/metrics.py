"""Prometheus metrics of the controller manager and its /metrics + /healthz HTTP endpoint.

Metrics (one registry per Manager, so several managers can live in one process):

* ``llmgw_controller_queue_depth{controller}``: keys waiting in the work queue.
* ``llmgw_controller_queue_adds_total{controller}``, ``llmgw_controller_queue_retries_total{controller}``
  and ``llmgw_controller_queue_wait_seconds{controller}``: from the queues' QueueStats.
* ``llmgw_controller_reconcile_duration_seconds{controller}``: histogram.
* ``llmgw_controller_reconcile_errors_total{controller}``: reconciles that raised.
* ``llmgw_controller_manager_leader``: 1 while this manager is the leader.
* ``llmgw_informer_lists_total{kind}``: lists an informer made (1 + relists), leader or standby:
  a warm standby that wins lists nothing more.

``/metrics?name[]=A&name[]=B`` exports only the series named (as Prometheus' own exporters do):
the fleet's series (controllers/fleet.py), a pass over the whole cache, are left out unless named.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from llmgw.runtime.workqueue import QueueStats

# A reconcile is a cache read and a write or two; a key's wait in its queue can be a
# controller's batching delay (seconds) or a backlog after a relist (minutes).
RECONCILE_BUCKETS = (.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
WAIT_BUCKETS = (.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300)


class _Queues:
    def __init__(self, depths: Callable[[], dict[str, int]], stats: dict[str, QueueStats]):
        self._depths, self._stats = depths, stats

    @staticmethod
    def describe() -> tuple[GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        """Its families, empty (the registry finds a `name[]` scrape's collectors by them)."""
        return (GaugeMetricFamily("llmgw_controller_queue_depth", "Keys waiting in a controller's work queue",
                                  labels=["controller"]),
                CounterMetricFamily("llmgw_controller_queue_adds", "Keys added to a controller's work queue",
                                    labels=["controller"]),
                CounterMetricFamily("llmgw_controller_queue_retries",
                                    "Keys re-added after a failed reconcile, with backoff", labels=["controller"]))

    def collect(self) -> Iterator[Metric]:
        g, adds, retries = self.describe()
        for name, depth in self._depths().items():
            g.add_metric([name], depth)
        for name, stats in sorted(self._stats.items()):
            adds.add_metric([name], stats.adds)
            retries.add_metric([name], stats.retries)
        yield from (g, adds, retries)


class _Lists:
    def __init__(self, lists: Callable[[], dict[str, int]]):
        self._lists = lists

    @staticmethod
    def describe() -> tuple[CounterMetricFamily]:
        return (CounterMetricFamily("llmgw_informer_lists", "Lists an informer made (1 + relists)", labels=["kind"]),)

    def collect(self) -> Iterator[Metric]:
        (c,) = self.describe()
        for kind, lists in self._lists().items():
            c.add_metric([kind], lists)
        yield c


class ManagerMetrics:
    def __init__(self, depths: Callable[[], dict[str, int]], lists: Callable[[], dict[str, int]] = dict):
        """`depths()`: each controller's queue depth; `lists()`: each informer's lists, by kind."""
        self.registry = CollectorRegistry()
        self.duration = Histogram("llmgw_controller_reconcile_duration_seconds", "Time spent in reconcile",
                                  ["controller"], registry=self.registry, buckets=RECONCILE_BUCKETS)
        self.wait = Histogram("llmgw_controller_queue_wait_seconds",
                              "Time a key waited in a controller's work queue before a worker took it",
                              ["controller"], registry=self.registry, buckets=WAIT_BUCKETS)
        self.errors = Counter("llmgw_controller_reconcile_errors_total", "Reconciles that raised",
                              ["controller"], registry=self.registry)
        self.leader = Gauge("llmgw_controller_manager_leader", "1 while this manager is the leader",
                            registry=self.registry)
        self._stats: dict[str, QueueStats] = {}
        self.registry.register(_Queues(depths, self._stats))
        self.registry.register(_Lists(lists))

    def queue_stats(self, controller: str) -> QueueStats:
        """The controller's queue counts, the same object every term."""
        stats = self._stats.get(controller)
        if stats is None:
            stats = self._stats[controller] = QueueStats(self.wait.labels(controller).observe)
        return stats

    def exposition(self, names: Sequence[str] = ()) -> bytes:
        """The text exposition; with `names`, only those series (as Prometheus' `name[]`), and
        collectors that describe what they export and export none of them are not run."""
        return generate_latest(self.registry.restricted_registry(names) if names else self.registry)


async def serve(metrics: ManagerMetrics, healthy: Callable[[], tuple[bool, str]], host: str,
                port: int) -> web.AppRunner:
    """Start /metrics and /healthz on host:port; returns the runner (``await runner.cleanup()``)."""

    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(request.query.getall("name[]", [])),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_healthz(_request: web.Request) -> web.Response:
        ok, text = healthy()
        return web.Response(status=200 if ok else 503, text=text + "\n")

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def parse_listen(addr: str) -> tuple[str, int]:
    """`0.0.0.0:9090`, `:9090` or `[::1]:9090` -> (host, port)."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
