"""Prometheus metrics of one gateway (own registry, so several can live in a process).

The series every request touches (requests_total, the latency histograms, the
token counters) are plain dicts of numbers read at scrape time: prometheus_client's
Counter and Histogram take a lock and walk the buckets in Python on every
observation, a few per cent of the gateway's CPU. The event loop is one
thread, so nothing here needs a lock.

Tokens come from the `usage` the engine reports: a response's, or a stream's last
chunk (OpenAI's `stream_options.include_usage`; the Responses API's response.completed event,
its input_tokens and output_tokens). Time to first token and time per
output token are a stream's (a whole response has no first token to time); they are
labelled by model only, as the engines' own per-replica histograms are at the agents.
"""
from __future__ import annotations

import re
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

# End to end: from a refused request (milliseconds) to a long generation (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# vLLM's own buckets for these two, so the gateway's and the engines' histograms line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
                20, 40, 80, 160, 640)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)

# predicted - reported cached tokens of a precise-prefix request: blocks of 16 up to 8k-token prompts
KV_ERROR_BUCKETS = (-8192, -2048, -512, -128, -32, -16, -1, 0, 15, 16, 32, 128, 512, 2048, 8192)

_USAGE = b'"usage"'
_COUNT = re.compile(rb"\s*:\s*(\d+)")  # a key's value, matched where the key ends
_USAGE_SPAN = 512  # bytes after "usage" that hold its counts (vLLM's, the sim's: under 200)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, inflight: Callable[[], Iterable[tuple[str, str, int, bool]]]) -> None:
        """`inflight` yields (model, replica, outstanding, routable) at scrape time: nothing on the hot path."""
        self.registry = r = CollectorRegistry()
        self._requests: dict[tuple[str, int], int] = {}  # (model, code) -> count
        self._latency = _Histogram(
            "llmgw_gateway_request_duration_seconds",
            "Time from request to the last byte of the response, by model", LATENCY_BUCKETS)
        self._ttft = _Histogram(
            "llmgw_gateway_time_to_first_token_seconds",
            "Time from a streamed request to the first chunk of its response, by model", TTFT_BUCKETS)
        self._tpot = _Histogram(
            "llmgw_gateway_time_per_output_token_seconds",
            "Time per output token after the first, of streams that report their usage, by model",
            TPOT_BUCKETS)
        self._input_tokens: dict[str, int] = {}  # model -> prompt tokens the engines reported
        self._output_tokens: dict[str, int] = {}  # model -> completion tokens the engines reported
        self._kv_error = _Histogram(
            "llmgw_gateway_kv_predicted_cached_tokens_error",
            "Of precise-prefix requests: the cached tokens the index predicted at the replica they were sent "
            "to less those its engine reported (usage.prompt_tokens_details.cached_tokens), by model",
            KV_ERROR_BUCKETS)
        self._kv_predictions: dict[str, list[int]] = {}  # model -> [predictions checked, within a block]
        r.register(_Requests(self._requests, [self._latency, self._ttft, self._tpot, self._kv_error],
                             self._input_tokens, self._output_tokens))
        r.register(_Predictions(self._kv_predictions))
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
        self._latency.observe(model, seconds)

    def usage(self, model: str, body: bytes, predicted: tuple[int, int] | None = None) -> tuple[int, int] | None:
        """Count the tokens of a response's (or a stream's tail's) `usage`: (input, output), or
        None if it reports none. The last "usage" key is the response's: a completion's text
        holds quotes only escaped. `predicted`: (tokens, block size) the KV index expected the
        engine to find cached, checked against the cached_tokens it reports."""
        at = body.rfind(_USAGE)
        if at < 0:
            return None
        span = body[at:at + _USAGE_SPAN]
        n_in = _count(span, b'"prompt_tokens"')
        out_key = b'"completion_tokens"'
        if n_in is None:   # the Responses API's names
            n_in, out_key = _count(span, b'"input_tokens"'), b'"output_tokens"'
        if n_in is None:  # "usage": null, on a stream's every chunk but the last
            return None
        n_out = _count(span, out_key) or 0
        if predicted is not None:
            cached = _count(span, b'"cached_tokens"')
            if cached is not None:
                self._predicted(model, predicted[0] - cached, predicted[1])
        self._input_tokens[model] = self._input_tokens.get(model, 0) + n_in
        self._output_tokens[model] = self._output_tokens.get(model, 0) + n_out
        return n_in, n_out

    def _predicted(self, model: str, error: int, block_size: int) -> None:
        self._kv_error.observe(model, error)
        counts = self._kv_predictions.get(model)
        if counts is None:
            counts = self._kv_predictions[model] = [0, 0]
        counts[0] += 1
        counts[1] += abs(error) <= block_size

    def stream(self, model: str, received: float, predicted: tuple[int, int] | None = None) -> "StreamTimer":
        """The timer of a stream's chunks, for a request received at `received` (perf_counter);
        `predicted` as usage() takes it."""
        return StreamTimer(self, model, received, predicted)

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


def _count(span: bytes, key: bytes) -> int | None:
    """The number after `key` in `span` (found by bytes.find and an anchored match: a
    regex search over the span costs several times more, on every response)."""
    at = span.find(key)
    if at < 0:
        return None
    m = _COUNT.match(span, at + len(key))
    return int(m.group(1)) if m else None


class StreamTimer:
    """One relayed stream: its time to first token at its first chunk; at its end, the tokens
    and time per output token of the usage in its last two chunks (its usage chunk, then
    `data: [DONE]`, may come in one read or two)."""

    __slots__ = ("metrics", "model", "received", "predicted", "first", "prev", "last")

    def __init__(self, metrics: Metrics, model: str, received: float, predicted: tuple[int, int] | None) -> None:
        self.metrics, self.model, self.received, self.predicted = metrics, model, received, predicted
        self.first = 0.0
        self.prev = self.last = b""

    def chunk(self, data: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()
            self.metrics._ttft.observe(self.model, self.first - self.received)
        self.prev, self.last = self.last, data

    def end(self) -> tuple[int, int] | None:
        """The stream ended whole: its usage (input, output tokens), if it reported one."""
        if not self.first:
            return None
        counted = self.metrics.usage(self.model, self.prev + self.last, self.predicted)
        if counted is not None and counted[1] > 1:
            per_token = (time.perf_counter() - self.first) / (counted[1] - 1)
            self.metrics._tpot.observe(self.model, per_token)
        return counted


class _Histogram:
    """A histogram by model, as counts per bucket (+Inf last) and a sum."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.buckets = name, documentation, buckets
        self.bounds = [str(floatToGoString(b)) for b in buckets] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.by_model: dict[str, list[Any]] = {}  # model -> [count per bucket, sum]

    def observe(self, model: str, value: float) -> None:
        h = self.by_model.get(model)
        if h is None:
            h = self.by_model[model] = [[0] * (len(self.buckets) + 1), 0.0]
        h[0][bisect_left(self.buckets, value)] += 1  # the first bucket with value <= le
        h[1] += value

    def family(self) -> HistogramMetricFamily:
        hist = HistogramMetricFamily(self.name, self.documentation, labels=["model"])
        for model, (counts, sum_) in sorted(self.by_model.items()):
            cumulative, acc = [], 0
            for bound, n in zip(self.bounds, counts, strict=True):
                acc += n
                cumulative.append((bound, acc))
            hist.add_metric([model], cumulative, sum_)
        return hist


class _Predictions:
    """Collector of precise-prefix's predictions checked against the engines' usage."""

    def __init__(self, counts: dict[str, list[int]]) -> None:
        self.counts = counts

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        checked = CounterMetricFamily(
            "llmgw_gateway_kv_predictions", "Precise-prefix requests whose predicted cached tokens were "
            "checked against the engine's usage, by model", labels=["model"])
        agreed = CounterMetricFamily(
            "llmgw_gateway_kv_predictions_agreed", "Of those, the ones the engine's cached tokens matched "
            "within one block (the rate of agreement: this over llmgw_gateway_kv_predictions_total)",
            labels=["model"])
        for model, (n, ok) in sorted(self.counts.items()):
            checked.add_metric([model], n)
            agreed.add_metric([model], ok)
        yield checked
        yield agreed


class _Requests:
    """Collector of the series every request touches: requests, latencies, tokens."""

    def __init__(self, requests: dict[tuple[str, int], int], histograms: list[_Histogram],
                 input_tokens: dict[str, int], output_tokens: dict[str, int]) -> None:
        self.requests, self.histograms = requests, histograms
        self.input_tokens, self.output_tokens = input_tokens, output_tokens

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "llmgw_gateway_requests", "Requests answered, by model and HTTP status code",
            labels=["model", "code"])
        for (model, code), n in sorted(self.requests.items()):
            total.add_metric([model, str(code)], n)
        yield total
        for h in self.histograms:
            yield h.family()
        for name, doc, counts in (
                ("llmgw_gateway_input_tokens", "Prompt tokens of the requests answered, as the engines "
                 "reported them, by model", self.input_tokens),
                ("llmgw_gateway_output_tokens", "Completion tokens of the requests answered, as the "
                 "engines reported them, by model", self.output_tokens)):
            tokens = CounterMetricFamily(name, doc, labels=["model"])
            for model, n in sorted(counts.items()):
                tokens.add_metric([model], n)
            yield tokens


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
