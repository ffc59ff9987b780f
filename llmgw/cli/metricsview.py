"""`llmgw top`'s view: models, replicas and nodes from two scrapes of the components' /metrics.

A `Scrape` holds every sample of every component it read (the gateways', the
controller-manager's, the agents' with their engines' series). Rates and latency
quantiles are the difference between two scrapes over the seconds between them, as
Prometheus' `rate` and `histogram_quantile` would compute them over that window; the
rest (replicas by phase, GPUs, requests in flight, engines' queues) is the later one.
The names read are in docs/metrics.md.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Scrape:
    at: float   # time.monotonic() when it was read
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, text: str) -> None:
        """One component's exposition; samples of the same series from several add up."""
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[s.name].append((s.labels, s.value))

    def sum_by(self, name: str, *by: str, prefix: Mapping[str, str] | None = None
               ) -> dict[tuple[str, ...], float]:
        """The samples of `name` summed by the labels `by`, of those whose labels start with `prefix`'s values."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for labels, value in self.samples.get(name, ()):
            if prefix and any(not labels.get(k, "").startswith(v) for k, v in prefix.items()):
                continue
            out[tuple(labels.get(k, "") for k in by)] += value
        return out


def rate(before: Scrape, after: Scrape, name: str, *by: str, prefix: Mapping[str, str] | None = None
         ) -> dict[tuple[str, ...], float]:
    """Per second between the scrapes; a counter that went down (a restart) counts from zero."""
    dt = max(after.at - before.at, 1e-9)
    old = before.sum_by(name, *by, prefix=prefix)
    return {k: (v - old.get(k, 0.0) if v >= old.get(k, 0.0) else v) / dt
            for k, v in after.sum_by(name, *by, prefix=prefix).items()}


def quantile(q: float, before: Scrape, after: Scrape, histogram: str, *by: str) -> dict[tuple[str, ...], float]:
    """histogram_quantile(q) of the observations between the scrapes (none: no entry)."""
    delta = rate(before, after, histogram + "_bucket", *by, "le")
    buckets: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
    for key, per_second in delta.items():
        buckets[key[:-1]].append((float(key[-1]), per_second))
    return {key: v for key, bs in buckets.items() if (v := _histogram_quantile(q, sorted(bs))) is not None}


def _histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' interpolation within the bucket the rank falls in; cumulative (le, count) pairs."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound   # in +Inf: the highest finite bound, as Prometheus says
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(count - lower_count, 1e-12)
        lower_bound, lower_count = bound, count
    return lower_bound


@dataclass
class View:
    models: list[list[str]]
    replicas: list[list[str]]
    nodes: list[list[str]]


MODEL_HEADERS = ["MODEL", "READY", "REQ/S", "5XX/S", "TTFT P50", "TTFT P95", "TPOT P50", "OUT TOK/S", "IN FLIGHT"]
REPLICA_HEADERS = ["REPLICA", "MODEL", "NODE", "IN FLIGHT", "RUNNING", "WAITING", "KV CACHE"]
NODE_HEADERS = ["NODE", "FABRIC", "GPUS", "REPLICAS", "RUNNING"]


def view(before: Scrape, after: Scrape) -> View:
    requests = rate(before, after, "llmgw_gateway_requests_total", "model")
    errors = rate(before, after, "llmgw_gateway_requests_total", "model", prefix={"code": "5"})
    out_tokens = rate(before, after, "llmgw_gateway_output_tokens_total", "model")
    ttft50 = quantile(0.5, before, after, "llmgw_gateway_time_to_first_token_seconds", "model")
    ttft95 = quantile(0.95, before, after, "llmgw_gateway_time_to_first_token_seconds", "model")
    tpot50 = quantile(0.5, before, after, "llmgw_gateway_time_per_output_token_seconds", "model")
    inflight = after.sum_by("llmgw_gateway_inflight_requests", "model")
    phases = after.sum_by("llmgw_fleet_replicas", "model", "phase")
    ready: dict[str, tuple[float, float]] = {}
    for (model, phase), n in phases.items():
        r, t = ready.get(model, (0.0, 0.0))
        ready[model] = (r + (n if phase == "Ready" else 0), t + n)
    names = sorted(({k[0] for k in (*requests, *inflight)} | set(ready)) - {"-"})   # "-": no model resolved
    models = []
    for m in names:
        errs = errors.get((m,), 0.0 if (m,) in requests else None)
        models.append([m, f"{ready[m][0]:.0f}/{ready[m][1]:.0f}" if m in ready else "-",
                       _num(requests.get((m,))), _num(errs), _secs(ttft50.get((m,))), _secs(ttft95.get((m,))),
                       _secs(tpot50.get((m,))), _num(out_tokens.get((m,))), _num(inflight.get((m,)), 0)])

    at_gateway = after.sum_by("llmgw_gateway_inflight_requests", "model", "replica")
    running = after.sum_by("vllm:num_requests_running", "model", "replica", "node")
    waiting = after.sum_by("vllm:num_requests_waiting", "replica")
    kv = after.sum_by("vllm:kv_cache_usage_perc", "replica")
    rows: dict[str, list[str]] = {}
    for model, replica in at_gateway:
        rows[replica] = [replica, model, "-", _num(at_gateway[(model, replica)], 0), "-", "-", "-"]
    for (model, replica, node), n in running.items():
        row = rows.setdefault(replica, [replica, model, node, "-", "-", "-", "-"])
        row[2], row[4] = node, _num(n, 0)
        row[5] = _num(waiting.get((replica,)), 0)
        row[6] = f"{100 * kv[(replica,)]:.0f}%" if (replica,) in kv else "-"
    replicas = [rows[r] for r in sorted(rows)]

    gpus = after.sum_by("llmgw_fleet_gpus", "node", "fabric")
    used = after.sum_by("llmgw_fleet_gpus_allocated", "node", "fabric")
    per_node: dict[str, set[str]] = defaultdict(set)
    engines_running: dict[str, float] = defaultdict(float)
    for (_, replica, node), n in running.items():
        per_node[node].add(replica)
        engines_running[node] += n
    nodes = [[node, fabric or "-", f"{used.get((node, fabric), 0):.0f}/{total:.0f}", str(len(per_node[node])),
              _num(engines_running.get(node), 0)] for (node, fabric), total in sorted(gpus.items())]
    return View(models, replicas, nodes)


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _secs(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"
