"""Prometheus metrics of one gateway (own registry, so several can live in a process)."""
from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, inflight: Callable[[], Iterable[tuple[str, str, int, bool]]]) -> None:
        """`inflight` yields (model, replica, outstanding, routable) at scrape time: nothing on the hot path."""
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "llmgw_gateway_requests", "Requests answered, by model and HTTP status code",
            ["model", "code"], registry=r)
        self.latency = Histogram(
            "llmgw_gateway_request_duration_seconds",
            "Time from request to the last byte of the response, by model",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter(
            "llmgw_gateway_upstream_errors",
            "Failed attempts to reach an engine, by model, replica and reason",
            ["model", "replica", "reason"], registry=r)
        self.retries = Counter(
            "llmgw_gateway_retries", "Requests retried on another replica, by model",
            ["model"], registry=r)
        r.register(_Inflight(inflight))
        self._latency_children: dict[str, object] = {}
        self._request_children: dict[tuple[str, int], object] = {}

    def observe(self, model: str, code: int, seconds: float) -> None:
        # Cache label children: labels() costs more than the increment itself.
        c = self._request_children.get((model, code))
        if c is None:
            c = self._request_children[(model, code)] = self.requests.labels(model, str(code))
        c.inc()
        h = self._latency_children.get(model)
        if h is None:
            h = self._latency_children[model] = self.latency.labels(model)
        h.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Inflight:
    """Collector of the in-flight and routable gauges, read from the gateway at scrape time."""

    def __init__(self, samples: Callable[[], Iterable[tuple[str, str, int, bool]]]):
        self.samples = samples

    def describe(self):
        return []

    def collect(self):
        inflight = GaugeMetricFamily(
            "llmgw_gateway_inflight_requests", "Requests outstanding at each replica",
            labels=["model", "replica"])
        routable = GaugeMetricFamily(
            "llmgw_gateway_routable_replicas", "Replicas the gateway routes to, by model",
            labels=["model"])
        per_model: dict[str, int] = {}
        for model, replica, n, is_routable in self.samples():
            inflight.add_metric([model, replica], n)
            if is_routable:
                per_model[model] = per_model.get(model, 0) + 1
        for model, n in sorted(per_model.items()):
            routable.add_metric([model], n)
        yield inflight
        yield routable
