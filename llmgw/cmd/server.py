"""`llmgw server`: the mutual-TLS REST API over etcd."""
from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llmgw import aio
from llmgw.api.limits import HEARTBEAT_TTL, MAX_TTL
from llmgw.cmd.auditflags import AuditFlags, audit_options
from llmgw.cmd.etcdflags import etcd_tls, etcd_wait, warn_unless_tls
from llmgw.cmd.logs import log_options, setup_logging

if TYPE_CHECKING:
    from llmgw.pki.signer import Signer
    from llmgw.store import Store

# Connections the kernel queues before the server accepts them: when a server dies, every agent and
# watch it held comes to the next one at once (aiohttp's default, 128, drops the rest's SYNs, whose
# retries come 1 s, 3 s and 7 s later: past a heartbeat's timeout). The kernel caps it at somaxconn.
BACKLOG = 4096


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{text!r}: expected HOST:PORT, e.g. 0.0.0.0:7443")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve(listen: str, etcd: str, cert: str, key: str, client_ca: str, etcd_ca: str | None = None,
                etcd_cert: str | None = None, etcd_key: str | None = None, etcd_wait: float = 0.0,
                bookmark_interval: float = 10.0,
                watch_cache_size: int = 10000, watch_queue_limit: int = 1000, metrics_listen: str = "",
                audit: AuditFlags | None = None, signer_cert: str = "", signer_key: str = "",
                renewal_rate: float = 20.0, renewal_burst: int = 50, heartbeat_ttl: int = HEARTBEAT_TTL) -> None:
    from aiohttp import web

    from llmgw.api.members import Member, advertised
    from llmgw.pki import CertificateAuthority
    from llmgw.pki.tls import mtls_server_context, peer_client_context
    from llmgw.server.app import ApiServer
    from llmgw.server.tls import TLSSite
    from llmgw.store import Store, StoreError
    from llmgw.version import version

    aio.keep_heap_out_of_gc()  # the imports are in; the watch cache and the connections are to come
    log = logging.getLogger("llmgw.server")
    host, port = _listen(listen)
    for what, path in (("--cert", cert), ("--key", key), ("--client-ca", client_ca)):
        if not os.path.exists(path):  # noqa: ASYNC240 once, before serving
            raise click.ClickException(f"{what} {path}: no such file")
    try:
        ctx = mtls_server_context(cert, key, client_ca, check_time=False)
        agent_tls = peer_client_context(cert, key, client_ca)
    except ssl.SSLError as err:
        raise click.ClickException(f"cannot load the server certificate {cert} / key {key} / client CA "
                                   f"{client_ca}: {err.reason or err}") from None
    signer = _signer(signer_cert, signer_key)
    warn_unless_tls(etcd, etcd_cert, log)
    store = Store(etcd.split(","), ca=etcd_ca, cert=etcd_cert, key=etcd_key)
    try:
        await store.connect(wait=etcd_wait)
    except (StoreError, OSError) as err:
        raise click.ClickException(f"cannot reach etcd at {etcd}: {err}") from None
    try:   # Models stored before served names were reserved: their names' keys, before any write
        migrated = await store.names.migrate()
    except StoreError as err:
        await store.close()
        raise click.ClickException(f"cannot reserve the stored Models' served names in etcd at {etcd}: {err}") from None
    try:   # before listening: a server outside the policy never serves
        skew = await _skew(store, advertised(listen))
    except StoreError as err:
        skew = f"cannot read the other servers' versions in etcd at {etcd}: {err}"
    if skew is not None:
        await store.close()
        raise click.ClickException(skew)
    if migrated.reserved:
        log.info("reserved %d served name(s) of Models stored before names were reserved", len(migrated.reserved))
    try:
        audit_log = audit.open() if audit is not None else None
    except click.ClickException:
        await store.close()
        raise
    api = ApiServer(store, bookmark_interval=bookmark_interval, watch_cache_size=watch_cache_size,
                    watch_queue_limit=watch_queue_limit, agent_tls=agent_tls,
                    revocation_journal=CertificateAuthority(Path(client_ca).parent), audit=audit_log,
                    signer=signer, renewal_rate=renewal_rate, renewal_burst=renewal_burst,
                    heartbeat_ttl=heartbeat_ttl)
    runner = web.AppRunner(api.app(), access_log=None, handle_signals=False, shutdown_timeout=2)
    await runner.setup()
    site = TLSSite(runner, host, port, ssl_context=ctx, backlog=BACKLOG)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        await store.close()
        raise click.ClickException(f"cannot listen on {listen}: {err.strerror or err}") from None
    log.info("listening on https://%s:%d (etcd %s)", host, site.port, etcd)
    name = advertised(f"{host}:{site.port}")
    me = Member(name=name, version=version(), url=f"https://{name}")
    metrics_site = None
    if metrics_listen:
        from llmgw.server.metrics import serve as serve_metrics
        m_host, m_port = _listen(metrics_listen)
        from llmgw.pki.renewal import ExpiryCollector
        api.metrics.registry.register(ExpiryCollector.of_files({"server": cert, "etcd-client": etcd_cert,
                                                                "signer": signer_cert or None}))
        metrics_site = await serve_metrics(api.metrics, m_host, m_port)
        log.info("metrics on http://%s/metrics", metrics_listen)
        me.metrics = advertised(f"{m_host}:{metrics_site.addresses[0][1]}")
    # its version and addresses, under a lease of its own (docs/contracts.md, "Members")
    await aio.until_signal(store.members.announce("server", me))
    log.info("shutting down")
    if metrics_site is not None:
        await metrics_site.cleanup()
    await runner.cleanup()
    await store.close()
    if audit_log is not None:
        audit_log.close()


async def _skew(store: "Store", name: str) -> str | None:
    """Why this server (announced as `name`) may not start beside the live servers (more than one
    minor apart); None if it may."""
    from llmgw.version import server_refusal, version

    for other in await store.members.list("server"):
        if other.name != name and other.version:
            if (why := server_refusal(version(), other.version, other.name)) is not None:
                return why
    return None


def _signer(cert: str, key: str) -> "Signer | None":
    """The signing CA the server renews certificates with, or None (no --signer-cert)."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise click.UsageError("--signer-cert and --signer-key go together")
    from llmgw.pki.signer import Signer
    try:
        return Signer(cert, key)
    except (OSError, ValueError) as err:
        raise click.ClickException(f"cannot load the signer {cert} / {key}: {err}") from None


@click.command()
@click.option("--listen", default="0.0.0.0:7443", show_default=True, help="HOST:PORT (port 0: any free port).")
@click.option("--etcd", envvar="LLMGW_ETCD", default="http://127.0.0.1:2379", show_default=True,
              help="etcd endpoint(s), comma-separated; https with the --etcd-ca/--etcd-cert/--etcd-key "
                   "below in production (README, \"Production security\").")
@click.option("--cert", required=True, help="Server certificate (`llmgw ca issue server --san ...`).")
@click.option("--key", required=True, help="Server private key.")
@click.option("--client-ca", required=True, help="CA that signs client certificates (the CA's ca.crt; the revocation "
                                                "journal beside it, where there is one, is checked at start).")
@etcd_tls
@etcd_wait
@click.option("--bookmark-interval", type=float, default=10.0, show_default=True,
              help="Seconds between watch keepalives.")
@click.option("--heartbeat-ttl", type=click.IntRange(1, MAX_TTL), default=HEARTBEAT_TTL, show_default=True,
              help="Seconds a node's heartbeat key lives after a beat that names no ttl (the agent's): a node "
                   "whose agent beats no more is NotReady this long after its last beat.")
@click.option("--watch-cache-size", type=click.IntRange(min=1), default=10000, show_default=True,
              help="Recent events kept per kind; a watch from an older resourceVersion is "
                   "replayed from etcd (410 only when etcd compacted it).")
@click.option("--watch-queue-limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Events a watch may fall behind before it is closed (410: the client relists).")
@click.option("--metrics-listen", default="", metavar="HOST:PORT",
              help="Serve GET /metrics (plain HTTP, apart from the API) here; empty: off.")
@audit_options
@click.option("--signer-cert", default="", metavar="PATH",
              help="The signing CA's certificate (signer.crt of `llmgw ca init`): renew nodes' and components' "
                   "certificates through POST /renewals; empty: renew none.")
@click.option("--signer-key", default="", metavar="PATH", help="The signing CA's private key (signer.key).")
@click.option("--renewal-rate", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="Renewals a second this server signs on average (429 past it: a fleet asking at once spreads).")
@click.option("--renewal-burst", type=click.IntRange(min=1), default=50, show_default=True,
              help="Renewals it signs at once.")
@log_options
def server(listen: str, etcd: str, cert: str, key: str, client_ca: str, etcd_ca: str | None, etcd_cert: str | None,
           etcd_key: str | None, etcd_wait: float, bookmark_interval: float, watch_cache_size: int,
           watch_queue_limit: int, metrics_listen: str, audit: AuditFlags, signer_cert: str, signer_key: str,
           renewal_rate: float, renewal_burst: int, heartbeat_ttl: int, log_level: str, log_format: str) -> None:
    """Serve the llmgw API over mutual TLS (identity = client certificate)."""
    setup_logging(log_level, log_format)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    aio.run(serve(listen, etcd, cert, key, client_ca, etcd_ca, etcd_cert, etcd_key, etcd_wait, bookmark_interval,
                  watch_cache_size, watch_queue_limit, metrics_listen, audit, signer_cert, signer_key,
                  renewal_rate, renewal_burst, heartbeat_ttl=heartbeat_ttl))
