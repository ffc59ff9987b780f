"""Prometheus metrics of one gateway (own registry, so several can live in a process).

The two series every request touches (requests_total and the latency
histogram) are plain dicts of numbers read at scrape time: prometheus_client's
Counter and Histogram take a lock and walk the buckets in Python on every
observation, a few per cent of the gateway's CPU. The event loop is one
thread, so nothing here needs a lock.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, inflight: Callable[[], Iterable[tuple[str, str, int, bool]]]) -> None:
        """`inflight` yields (model, replica, outstanding, routable) at scrape time: nothing on the hot path."""
        self.registry = r = CollectorRegistry()
        self._requests: dict[tuple[str, int], int] = {}  # (model, code) -> count
        self._latency: dict[str, list[Any]] = {}  # model -> [count per bucket (+Inf last), sum]
        r.register(_Requests(self._requests, self._latency))
        self.upstream_errors = Counter(
            "llmgw_gateway_upstream_errors",
            "Failed attempts to reach an engine, by model, replica and reason",
            ["model", "replica", "reason"], registry=r)
        self.retries = Counter(
            "llmgw_gateway_retries", "Requests retried on another replica, by model",
            ["model"], registry=r)
        r.register(_Inflight(inflight))
        self._retry_children: dict[str, Counter] = {}

    def observe(self, model: str, code: int, seconds: float) -> None:
        key = (model, code)
        requests = self._requests
        requests[key] = requests.get(key, 0) + 1
        h = self._latency.get(model)
        if h is None:
            h = self._latency[model] = [[0] * (len(LATENCY_BUCKETS) + 1), 0.0]
        h[0][bisect_left(LATENCY_BUCKETS, seconds)] += 1  # the first bucket with seconds <= le
        h[1] += seconds

    def retry(self, model: str) -> None:
        # Cache label children: labels() costs more than the increment itself.
        c = self._retry_children.get(model)
        if c is None:
            c = self._retry_children[model] = self.retries.labels(model)
        c.inc()

    def upstream_error(self, model: str, replica: str, reason: str) -> None:
        # Not cached: rare, and replicas come and go (a cache would only grow).
        self.upstream_errors.labels(model, replica, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Requests:
    """Collector of llmgw_gateway_requests_total and llmgw_gateway_request_duration_seconds."""

    _BOUNDS = [str(floatToGoString(b)) for b in LATENCY_BUCKETS] + ["+Inf"]  # type: ignore[no-untyped-call]

    def __init__(self, requests: dict[tuple[str, int], int], latency: dict[str, list[Any]]) -> None:
        self.requests, self.latency = requests, latency

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "llmgw_gateway_requests", "Requests answered, by model and HTTP status code",
            labels=["model", "code"])
        for (model, code), n in sorted(self.requests.items()):
            total.add_metric([model, str(code)], n)
        hist = HistogramMetricFamily(
            "llmgw_gateway_request_duration_seconds",
            "Time from request to the last byte of the response, by model", labels=["model"])
        for model, (counts, sum_) in sorted(self.latency.items()):
            cumulative, acc = [], 0
            for bound, n in zip(self._BOUNDS, counts, strict=False):
                acc += n
                cumulative.append((bound, acc))
            hist.add_metric([model], cumulative, sum_)
        yield total
        yield hist


class _Inflight:
    """Collector of the in-flight and routable gauges, read from the gateway at scrape time."""

    def __init__(self, samples: Callable[[], Iterable[tuple[str, str, int, bool]]]):
        self.samples = samples

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
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
