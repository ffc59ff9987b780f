"""`llmgw controller-manager`: run the controllers and the compactor with leader election, given their settings."""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from controllers.adapter import AdapterController
from controllers.autoscaler import AutoscalerController
from controllers.drain import DrainController
from controllers.fleet import FleetCollector
from controllers.gc import GarbageCollector
from controllers.gitops import GitOpsController
from controllers.model import ModelController
from controllers.nodelifecycle import NodeLifecycleController
from controllers.replica import ReplicaController
from controllers.scheduler import SchedulerCollector, SchedulerController
from controllers.settings import ControllerSettings
from llmgw import aio
from llmgw.cmd.auditflags import AuditFlags, audit_options
from llmgw.cmd.etcdflags import etcd_tls, etcd_wait, warn_unless_tls
from llmgw.cmd.logs import log_options, setup_logging
from llmgw.cmd.settings import settings_options
from llmgw.pki.ca import ORG
from llmgw.runtime.controller import Controller

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from llmgw.server.audit import AuditLog


def controllers(settings: ControllerSettings, git_cache: Path | None = None,
                audit: "AuditLog | None" = None) -> list[Controller]:
    """Every controller the manager runs, in the order it starts them; a new controller is
    registered here (docs/architecture.md, "Adding a controller"). `audit`: where the GitSources'
    writes are recorded, as the controller-manager's."""
    return [ModelController(), ReplicaController(settings), SchedulerController(settings),
            NodeLifecycleController(settings), DrainController(settings), GarbageCollector(),
            AutoscalerController(settings),
            GitOpsController(settings, git_cache, _as_controller_manager(audit) if audit is not None else None),
            AdapterController(settings)]


def _as_controller_manager(audit: "AuditLog") -> Callable[[dict[str, Any]], None]:
    """Audit lines of the controller-manager: its component name and organisation, as the server
    knows its certificate (CN=controller-manager, O=llmgw:components)."""
    return lambda line: audit.offer({"user": "controller-manager", "groups": [ORG["component"]], **line})


@click.command("controller-manager")
@click.option("--etcd", "etcd", required=True, envvar="LLMGW_ETCD",
              help="etcd endpoints, comma-separated (http(s)://HOST:PORT); https with the --etcd-ca/"
                   "--etcd-cert/--etcd-key below in production (README, \"Production security\").")
@etcd_tls
@etcd_wait
@click.option("--metrics-listen", default="127.0.0.1:9464", show_default=True,
              help="ADDR:PORT for /metrics and /healthz; empty to disable.")
@settings_options(ControllerSettings)
@click.option("--git-cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of the GitSources' checkouts, one per source (default: llmgw-git in the "
                   "temporary directory).")
@click.option("--identity", default=None, callback=lambda _ctx, _param, value: _identity(value),
              help="Leader-election identity, also the name it announces (default HOST-PID): letters, digits "
                   "and . _ - :, at most 253.")
@click.option("--otel", is_flag=True,
              help="Export a span per reconcile with OpenTelemetry, over OTLP/HTTP where OTEL_EXPORTER_OTLP_ENDPOINT "
              "says (default http://localhost:4318); needs the otel extra: pip install 'llmgw[otel]'.")
@audit_options
@log_options
def controller_manager(etcd: str, etcd_ca: str | None, etcd_cert: str | None, etcd_key: str | None,
                       etcd_wait: float, metrics_listen: str, settings: ControllerSettings, git_cache: Path | None,
                       identity: str | None, otel: bool, audit: AuditFlags, log_level: str, log_format: str) -> None:
    """Run the controllers (model, replica, scheduler, ...); one instance acts at a time.

    Each setting below comes from its flag if given, else from the --config file, else its default.
    The audit flags record the GitSources' writes (an audit line each, naming the source).
    """
    setup_logging(log_level, log_format)
    tracing = _tracing() if otel else None
    audit_log = audit.open()
    try:
        aio.run(_main(etcd, etcd_ca, etcd_cert, etcd_key, etcd_wait, metrics_listen, settings, git_cache, identity,
                      tracing.get_tracer("llmgw.runtime") if tracing else None, audit_log))
    finally:
        if tracing is not None:
            tracing.shutdown()   # what is batched is exported before the process ends
        if audit_log is not None:
            audit_log.close()    # and what is buffered written


def _identity(value: str | None) -> str | None:
    from llmgw.api.members import MEMBER_NAME

    if value is not None and not re.match(MEMBER_NAME, value):
        raise click.BadParameter(f"{value!r}: letters, digits and . _ - : only, at most 253, starting with a "
                                 "letter or digit", param_hint="--identity")
    return value


def _tracing() -> "TracerProvider":
    try:
        from llmgw import otel
    except ImportError as err:
        raise click.UsageError(str(err)) from None
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=otel.resource("llmgw-controller-manager"))
    provider.add_span_processor(otel.otlp_processor())
    return provider


async def _main(etcd: str, ca: str | None, cert: str | None, key: str | None, etcd_wait: float, metrics_listen: str,
                settings: ControllerSettings, git_cache: Path | None, identity: str | None,
                tracer: "Tracer | None", audit: "AuditLog | None") -> None:
    from llmgw.api.members import Member, advertised
    from llmgw.runtime.manager import Manager
    from llmgw.runtime.metrics import parse_listen, serve
    from llmgw.store import Compactor, Store, StoreError
    from llmgw.version import version

    aio.keep_heap_out_of_gc()  # the imports are in; the cache is to come
    warn_unless_tls(etcd, cert, logging.getLogger("llmgw.controller-manager"))
    store = Store(etcd, ca=ca, cert=cert, key=key)
    try:
        await store.connect(wait=etcd_wait)
    except (StoreError, OSError) as err:
        raise click.ClickException(f"cannot reach etcd at {etcd}: {err}") from None
    # Leader-only work besides the controllers: etcd's history compacted.
    runnables = [Compactor(store.etcd, keep=settings.compact_keep, interval=settings.compact_interval)]
    manager = Manager(store, controllers(settings, git_cache, audit), identity=identity, settings=settings,
                      runnables=runnables)
    manager.tracer = tracer
    manager.metrics.registry.register(FleetCollector(lambda: manager.cache if manager.is_leader else None))
    for c in manager.controllers:
        if isinstance(c, SchedulerController):
            manager.metrics.registry.register(SchedulerCollector(c, lambda: manager.is_leader))
    runner = None
    me = Member(name=manager.identity, version=version())
    if metrics_listen:
        from llmgw.pki.renewal import ExpiryCollector
        manager.metrics.registry.register(ExpiryCollector.of_files({"etcd-client": cert}))
        host, port = parse_listen(metrics_listen)
        runner = await serve(manager.metrics, manager.healthy, host, port)
        me.metrics = advertised(f"{host}:{runner.addresses[0][1]}")
    # its version and metrics address, leader or standby, under a lease of its own
    # (docs/contracts.md, "Members")
    announcing = asyncio.create_task(store.members.announce("controller-manager", me, ttl=int(settings.lease_seconds)))
    try:
        await aio.until_signal(manager.run(), stop=lambda: manager.stop(resign=True))
    finally:
        announcing.cancel()
        await asyncio.gather(announcing, return_exceptions=True)
        if runner is not None:
            await runner.cleanup()
        await store.close()
