"""The API server's metrics: requests by verb, kind and code, the watches open, and the audit
lines dropped.

Served on a plain-HTTP address of its own (`llmgw server --metrics-listen HOST:PORT`),
apart from the mutual-TLS API, so a Prometheus needs no client certificate. The
names are in docs/metrics.md.
"""
from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from llmgw.server.audit import AuditLog, WebhookBackend


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("llmgw_server_requests", "API requests answered, by verb, kind and HTTP code",
                                ["verb", "kind", "code"], registry=self.registry)
        self.watches = Gauge("llmgw_server_watches", "Watches open, by kind", ["kind"], registry=self.registry)
        # (verb, kind, code) -> its child of `requests`: looked up once (a fleet's heartbeats are the
        # most frequent answers; the labels are few: verbs, kinds and codes)
        self._answered: dict[tuple[str, str, int], Counter] = {}

    def observe(self, verb: str, kind: str, code: int) -> None:
        key = (verb, kind, code)
        child = self._answered.get(key)
        if child is None:
            child = self._answered[key] = self.requests.labels(verb, kind, str(code))
        child.inc()

    def audit(self, audit: AuditLog) -> None:
        """Count the lines the audit log's backends drop, as they count them."""
        self.registry.register(_AuditDrops(audit))


class _AuditDrops(Collector):
    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    def collect(self) -> Iterator[CounterMetricFamily]:
        drops = CounterMetricFamily("llmgw_server_audit_dropped_lines", "Audit lines dropped, by backend (log, "
                                    "webhook) and why: overflow (the buffer was full), failed (the webhook refused "
                                    "or did not answer)", labels=["backend", "reason"])
        for backend in self.audit.backends:
            drops.add_metric([backend.name, "overflow"], backend.dropped)
            if isinstance(backend, WebhookBackend):
                drops.add_metric([backend.name, "failed"], backend.failed)
        yield drops


async def serve(metrics: ServerMetrics, host: str, port: int) -> web.AppRunner:
    """GET /metrics on host:port (plain HTTP); the caller cleans the runner up."""
    async def get_metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
