"""The API server's metrics: requests by verb, kind and code, and the watches open.

Served on a plain-HTTP address of its own (`llmgw server --metrics-listen HOST:PORT`),
apart from the mutual-TLS API, so a Prometheus needs no client certificate. The
names are in docs/metrics.md.
"""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("llmgw_server_requests", "API requests answered, by verb, kind and HTTP code",
                                ["verb", "kind", "code"], registry=self.registry)
        self.watches = Gauge("llmgw_server_watches", "Watches open, by kind", ["kind"], registry=self.registry)

    def observe(self, verb: str, kind: str, code: int) -> None:
        self.requests.labels(verb, kind, str(code)).inc()


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
