"""`llmgw controller-manager`: run every controller in CONTROLLERS, and the compactor, with leader election."""
from __future__ import annotations

import asyncio
import logging
import signal

import click

from controllers.drain import DrainController
from controllers.gc import GarbageCollector
from controllers.model import ModelController
from controllers.nodelifecycle import NodeLifecycleController
from controllers.replica import ReplicaController
from controllers.scheduler import SchedulerController
from llmgw import aio
from llmgw.cli.etcdflags import etcd_tls, warn_unless_tls

# Every controller the manager runs, in the order it starts them; a new
# controller is registered here (docs/architecture.md, "Adding a controller").
CONTROLLERS: list[type] = [ModelController, ReplicaController, SchedulerController, NodeLifecycleController,
                           DrainController, GarbageCollector]


@click.command("controller-manager")
@click.option("--etcd", "etcd", required=True, envvar="LLMGW_ETCD",
              help="etcd endpoints, comma-separated (http(s)://HOST:PORT); https with the --etcd-ca/"
                   "--etcd-cert/--etcd-key below in production (README, \"Production security\").")
@etcd_tls
@click.option("--metrics-listen", default="127.0.0.1:9464", show_default=True,
              help="ADDR:PORT for /metrics and /healthz; empty to disable.")
@click.option("--node-grace", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a node may be silent before it is judged lost and its replicas are moved "
                   "elsewhere (make-before-break); also the fresh grace every silent node gets after a "
                   "leadership change.")
@click.option("--max-silent-fraction", default=0.5, show_default=True, type=click.FloatRange(0, 1),
              help="If at least this share of nodes (and at least two) is silent, assume the control plane "
                   "is cut off: judge no node lost.")
@click.option("--eviction-settle", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds after mass silence ends before nodes still silent are judged lost.")
@click.option("--eviction-rate", default=0.1, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Most nodes judged lost per second (the first at once).")
@click.option("--lease-seconds", default=15.0, show_default=True, type=float, help="Leader lease.")
@click.option("--identity", default=None, help="Leader-election identity (default HOST-PID).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def controller_manager(etcd, etcd_ca, etcd_cert, etcd_key, metrics_listen, node_grace,
                       max_silent_fraction, eviction_settle, eviction_rate, lease_seconds, identity, log_level):
    """Run the controllers (model, replica, scheduler, ...); one instance acts at a time."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = {"node_grace": node_grace, "max_silent_fraction": max_silent_fraction,
               "eviction_settle": eviction_settle, "eviction_rate": eviction_rate,
               "lease_seconds": lease_seconds}
    aio.run(_main(etcd, etcd_ca, etcd_cert, etcd_key, metrics_listen, options, identity))


async def _main(etcd, ca, cert, key, metrics_listen, options, identity) -> None:
    from llmgw.runtime.manager import Manager
    from llmgw.runtime.metrics import parse_listen, serve
    from llmgw.store import Compactor, Store

    aio.keep_heap_out_of_gc()  # the imports are in; the cache is to come
    warn_unless_tls(etcd, cert, logging.getLogger("llmgw.controller-manager"))
    store = Store(etcd, ca=ca, cert=cert, key=key)
    await store.connect()
    # Leader-only work besides the controllers: etcd's history compacted, keeping the last 10000 revisions.
    runnables = [Compactor(store.etcd, keep=10000, interval=300.0)]
    manager = Manager(store, [cls() for cls in CONTROLLERS], identity=identity, options=options,
                      runnables=runnables)
    runner = None
    if metrics_listen:
        host, port = parse_listen(metrics_listen)
        runner = await serve(manager.metrics, manager.healthy, host, port)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(manager.run())
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(manager.stop(resign=True)))
    try:
        await task
    finally:
        if runner is not None:
            await runner.cleanup()
        await store.close()
