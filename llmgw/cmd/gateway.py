"""`llmgw gateway`: the OpenAI-compatible gateway."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

import click

from llmgw import aio
from llmgw.api import AnyObject
from llmgw.api.meta import check_dns1123_label
from llmgw.cmd.logs import log_options, setup_logging
from llmgw.gateway.admission import Admission
from llmgw.gateway.apikeys import ApiKeys
from llmgw.gateway.auth import Authenticator
from llmgw.gateway.gateway import DEFAULT_MAX_BODY, Gateway, QueueSettings
from llmgw.gateway.http1 import Limits
from llmgw.gateway.keyring import KeyRing
from llmgw.gateway.spans import Spans
from llmgw.gateway.table import RoutingTable
from llmgw.gateway.upstream import Keepalive

log = logging.getLogger("llmgw.gateway")


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{value!r}: expected HOST:PORT, e.g. 0.0.0.0:8000")
    return host.strip("[]") or "0.0.0.0", int(port)


def _describe(kind: str, type_: str, obj: AnyObject) -> None:
    if kind == "replicas":
        log.info("routing: replica %s %s (phase %s, endpoint %s%s)", obj.metadata.name, type_.lower(),
                 obj.status.phase, obj.status.endpoint,
                 ", terminating" if obj.metadata.deletionTimestamp else "")
    elif kind == "apikeys":
        log.info("api key %s %s", obj.metadata.name, type_.lower())
    else:
        log.info("routing: model %s %s", obj.metadata.name, type_.lower())


@click.command()
@click.option("--listen", default="0.0.0.0:8000", show_default=True, help="HOST:PORT to serve on.")
@click.option("--server", "server", multiple=True,
              help="URL of llmgw server, e.g. https://10.0.0.1:7443 (Models and Replicas are watched); repeatable "
                   "or comma-separated: every API server, the gateway moves to the next when one goes away.")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False), help="CA certificate of the server.")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False), help="This gateway's component certificate.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="Its private key.")
@click.option("--static", "static", type=click.Path(exists=True),
              help="Instead of --server: Model, Replica and Adapter manifests (with status) to route by.")
@click.option("--api-keys", type=click.Path(exists=True, dir_okay=False),
              help="File of bearer API keys, one per line; re-read when it changes (for --static; with --server, "
              "see --watch-api-keys).")
@click.option("--watch-api-keys", is_flag=True,
              help="With --server: authenticate bearer keys against the ApiKey objects (`llmgw create apikey`) "
              "and enforce their scope, limits and priority class; without a valid key a request is refused 401.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_BODY, show_default=True)
@click.option("--retry-after", type=click.IntRange(min=1), default=2, show_default=True,
              help="Seconds in Retry-After when a model has no Ready replica.")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True), default=Limits.header_timeout,
              show_default=True, help="Seconds for a request's line and headers, from its first byte (a new "
              "connection's first request: from the accept); then 408, or a plain close if nothing came.")
@click.option("--keepalive-timeout", type=click.FloatRange(min=0, min_open=True), default=Limits.keepalive,
              show_default=True, help="Seconds an idle keep-alive connection is kept between requests.")
@click.option("--body-timeout", type=click.FloatRange(min=0, min_open=True), default=Limits.body_timeout,
              show_default=True, help="Seconds for a request body (plus a second per --body-min-rate bytes "
              "received); then 408.")
@click.option("--body-min-rate", type=click.IntRange(min=0), default=Limits.body_min_rate, show_default=True,
              help="Bytes per second a slow body must keep up to get more than --body-timeout (0: no extra time).")
@click.option("--max-conns-per-addr", type=click.IntRange(min=0), default=Limits.max_conns_per_addr,
              show_default=True, help="Open connections one client address may hold; one more is answered "
              "429 and closed (0: no cap). Raise it behind a proxy or load balancer.")
@click.option("--connect-timeout", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Seconds for a connection to an engine to open; then the try goes to another replica and "
              "the replica is ejected from routing until a connection to it opens again (an engine on the "
              "fleet's network answers in milliseconds: one that does not is cut off).")
@click.option("--response-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="Seconds from sending a request to an engine until its response "
              "headers; then the try fails and, if nothing was sent to the client, goes to another replica. "
              "A streamed response's headers come after the prompt's prefill, a whole response's after the "
              "last token: keep it above your longest non-streamed generation. A try whose replica leaves "
              "routing (not Ready, Failed, deleted, ejected) before its headers goes elsewhere at once.")
@click.option("--stream-idle-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds a response from an engine may bring no byte once it has "
              "started (between two tokens of a stream); then it ends: a stream with an error event, "
              "other bodies cut off. Time spent waiting for a slow client does not count. Keep it above "
              "your longest prefill when a stream's headers come before it. A response whose replica Failed "
              "or was deleted ends at once.")
@click.option("--upstream-keepalive-idle", type=click.IntRange(min=0), default=Keepalive.idle, show_default=True,
              help="Seconds without a packet on a connection to an engine before TCP keepalive probes it "
              "(0: no keepalive). With the interval and the probes, a peer silent at the TCP level (a "
              "partition between this gateway and the engine alone) is known dead in idle + interval x "
              "probes seconds, 11 by default, and unacknowledged data is given up on as soon "
              "(TCP_USER_TIMEOUT): a try without headers then goes to another replica, a stream ends with "
              "an error event.")
@click.option("--upstream-keepalive-interval", type=click.IntRange(min=1), default=Keepalive.interval,
              show_default=True, help="Seconds between two TCP keepalive probes of a connection to an engine.")
@click.option("--upstream-keepalive-probes", type=click.IntRange(min=1), default=Keepalive.probes,
              show_default=True, help="TCP keepalive probes unanswered before a connection to an engine is dead.")
@click.option("--queue-size", type=click.IntRange(min=0), default=QueueSettings.size, show_default=True,
              help="Requests that may wait per model for a Ready replica (scale from zero) or under "
              "--model-concurrency; one more is refused with 503 (429 at the concurrency limit) and Retry-After, "
              "unless it is of a better priority class than one waiting, which is refused instead.")
@click.option("--queue-timeout", type=click.FloatRange(min=0, min_open=True), default=QueueSettings.timeout,
              show_default=True, help="Seconds a request waits in its model's queue (or, right after a start, "
              "for the first view of the models) before it is refused with 503 (429) and Retry-After.")
@click.option("--model-concurrency", type=click.IntRange(min=0), default=QueueSettings.model_concurrency,
              show_default=True, help="Requests in flight per model at this gateway past which more wait in "
              "the model's queue (0: no limit).")
@click.option("--gateway-id", default=None,
              help="This gateway's name in its demand reports (a DNS-1123 label, unique among the gateways); "
              "default: the host name and process id.")
@click.option("--demand-interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Most often, in seconds, this gateway reports its demand (requests in flight per model) "
              "to the server for the autoscaler, and with --watch-api-keys its keys' usage (for `llmgw "
              "describe apikey`); only with --server.")
@click.option("--demand-ttl", type=click.IntRange(min=1, max=600), default=15, show_default=True,
              help="Seconds a demand report outlives this gateway's silence (its etcd lease); a graceful "
                   "stop withdraws it at once.")
@click.option("--renew-fraction", type=click.FloatRange(min=0, max=1, max_open=True), default=round(2 / 3, 3),
              show_default=True, help="Renew this gateway's certificate (--cert) at this fraction of its lifetime, "
              "through the API server's signer, without a restart; 0: never.")
@click.option("--otel", is_flag=True,
              help="Export a span per request with OpenTelemetry, over OTLP/HTTP where OTEL_EXPORTER_OTLP_ENDPOINT "
              "says (default http://localhost:4318); needs the otel extra: pip install 'llmgw[otel]'.")
@log_options
def gateway(listen: str, server: tuple[str, ...], ca: str | None, cert: str | None, key: str | None, static: str | None,
            api_keys: str | None, watch_api_keys: bool, max_body_bytes: int, retry_after: int, header_timeout: float,
            keepalive_timeout: float, body_timeout: float, body_min_rate: int, max_conns_per_addr: int,
            connect_timeout: float, response_timeout: float, stream_idle_timeout: float,
            upstream_keepalive_idle: int, upstream_keepalive_interval: int, upstream_keepalive_probes: int,
            queue_size: int,
            queue_timeout: float, model_concurrency: int,
            gateway_id: str | None, demand_interval: float, demand_ttl: int, renew_fraction: float,
            otel: bool, log_level: str, log_format: str) -> None:
    """OpenAI-compatible gateway: route requests by model name or alias to Ready replicas."""
    setup_logging(log_level, log_format)
    if bool(server) == bool(static):
        raise click.UsageError("give exactly one of --server URL (with --ca/--cert/--key) or --static FILE")
    if watch_api_keys and (static or api_keys):
        raise click.UsageError("--watch-api-keys reads the ApiKeys of --server; it takes neither --static nor "
                               "--api-keys")
    host, port = _host_port(listen)
    table = RoutingTable()
    authenticator: Authenticator | None = None
    admission: Admission | None = None
    ring: KeyRing | None = None   # the watched keys, which the source feeds
    if api_keys:
        authenticator = file_keys = ApiKeys(api_keys)
        if not len(file_keys):
            log.warning("%s holds no key: every request will be refused with 401", api_keys)
    elif watch_api_keys:   # authenticated by ApiKey objects, admitted by their limits
        admission = Admission(table.labels, table.resolve)
        authenticator = ring = KeyRing(admission.revoke)
    spans = None
    if otel:
        try:
            spans = Spans.otlp()
        except ImportError as err:
            raise click.UsageError(str(err)) from None
    limits = Limits(header_timeout=header_timeout, keepalive=keepalive_timeout, body_timeout=body_timeout,
                    body_min_rate=body_min_rate, max_conns_per_addr=max_conns_per_addr)
    gw = Gateway(table, authenticator=authenticator, admission=admission, spans=spans,
                 max_body_bytes=max_body_bytes, retry_after=retry_after, synced=False,
                 limits=limits, connect_timeout=connect_timeout, response_timeout=response_timeout,
                 idle_timeout=stream_idle_timeout, queue=QueueSettings(queue_size, queue_timeout, model_concurrency),
                 keepalive=Keepalive(upstream_keepalive_idle, upstream_keepalive_interval, upstream_keepalive_probes)
                 if upstream_keepalive_idle else None)
    gateway_id = gateway_id or _default_id()
    try:
        check_dns1123_label(gateway_id)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--gateway-id") from None
    demand = _DemandSettings(gateway_id, demand_interval, demand_ttl)
    # precise-prefix's KV indexes and block memo are large and long-lived: full collections walking
    # them cost routing its p99 (hack/bench/routing.py --policy precise-prefix, route_ms)
    aio.keep_heap_out_of_gc()
    aio.run(_serve(gw, spans, ring, admission, host, port, server, ca, cert, key, static, demand, renew_fraction))


@dataclass(frozen=True)
class _DemandSettings:
    gateway: str
    interval: float
    ttl: int


def _default_id() -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")[:50] or "gateway"
    return f"{host}-{os.getpid()}"


async def _serve(gw: Gateway, spans: Spans | None, ring: KeyRing | None, admission: Admission | None, host: str,
                 port: int, server: tuple[str, ...], ca: str | None, cert: str | None,
                 key: str | None, static: str | None, demand: _DemandSettings, renew_fraction: float = 0.0) -> None:
    source = None
    client = None
    publisher = None
    renewal = None
    agents = None
    loads = None
    if static:
        from llmgw.gateway.source import load_static
        n = load_static(static, gw.table)
        gw.synced = True
        log.info("routing table: %d objects from %s", n, static)
    # Bound before the server is watched, so a taken port leaves no watch to stop; /healthz
    # answers 503 until the watch has synced (gw.synced), as it did when the watch started first.
    try:
        port = await gw.start(host, port)
    except OSError as err:  # EADDRINUSE, EACCES, an unknown host name (gaierror: errno < 0)
        # uvloop's strerror repeats the address in its own words; the errno's text does not.
        why = os.strerror(err.errno) if err.errno is not None and err.errno > 0 else err.strerror or str(err)
        raise click.ClickException(f"cannot listen on {host}:{port} (--listen): {why}") from None
    log.info("gateway listening on %s:%d", host, port)
    if not static:
        from llmgw.client import Client
        from llmgw.gateway.source import ServerSource
        from llmgw.pki.renewal import ExpiryCollector, Renewer, complete_renewal
        if cert and key:
            complete_renewal(cert, key)
        client = Client(server, ca=ca, cert=cert, key=key)
        await client.__aenter__()
        reload: list[Callable[[str, str], None]] = [client.use_certificate]
        if cert and key and ca:   # LoRA adapters loaded at once by the agents (docs/gateway.md, "LoRA adapters")
            from llmgw.gateway.loads import Agents, DirectLoads
            from llmgw.pki.tls import peer_client_context
            tls = peer_client_context(cert, key, ca)
            reload.append(tls.load_cert_chain)
            agents = Agents(client, tls)
            loads = DirectLoads(gw.table, gw.balancer, agents.post, gw.queue.count)
        if cert and key and renew_fraction:
            renewer = Renewer(cert, key, client, reload=reload, fraction=renew_fraction)
            gw.metrics.registry.register(ExpiryCollector({"gateway": lambda: renewer.not_after}))
            renewal = asyncio.create_task(renewer.run())
        source = ServerSource(client, gw.table, on_change=_describe, on_synced=lambda: setattr(gw, "synced", True),
                              keys=ring)
        source.start()
        from llmgw.api.members import advertised
        from llmgw.gateway.demand import DemandPublisher, figures
        publisher = DemandPublisher(client, demand.gateway, lambda: figures(
                                        gw.balancer, gw.queue.waiting(), loads.reported() if loads else None),
                                    interval=demand.interval, ttl=demand.ttl,
                                    on_gateways=admission.set_gateways if admission else None,
                                    keys=admission.windows().report if admission else None,
                                    metrics=advertised(f"{host}:{port}"))
        # a model at zero: scale up on the first request (an adapter resident nowhere: loaded now, which
        # the report says at once)
        gw.queue.on_first = (lambda model: publisher.poke()) if loads is None else loads.want
        if loads is not None:
            loads.on_change = publisher.poke
        publisher.start()
    try:
        await aio.until_signal()
    finally:
        if renewal is not None:
            renewal.cancel()
        if publisher is not None:
            await publisher.stop()
        if loads is not None:
            await loads.close()
        if agents is not None:
            await agents.close()
        if source is not None:
            await source.stop()
        await gw.stop()
        if spans is not None:
            spans.shutdown()   # what is batched is exported before the process ends
        if client is not None:
            await client.close()
