"""The agent process: discover, register, heartbeat, watch this node's shards, supervise them.

    agent = Agent(config)        # AgentConfig from llmgw.agent.config.load_config
    facts = agent.discover()     # raises FabricError: refuse to start
    await agent.run()            # until cancelled; engines outlive it

Ending the agent never stops engines: a restarted agent adopts them.
The Node's status.foreignPorts lists the ports of its range that processes other than
its engines hold: found at registration, at each rediscovery and at each engine start.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from typing import Any

from aiohttp import web

from llmgw.agent import ports
from llmgw.agent.config import AgentConfig
from llmgw.agent.direct import DirectLoads
from llmgw.agent.discovery.gpu import discover_gpus
from llmgw.agent.facts import Facts, gather, node_status, settle_free
from llmgw.agent.listener import Revoked
from llmgw.agent.listener import serve as listen
from llmgw.agent.logs import LogServer
from llmgw.agent.metrics import AgentMetrics, EngineTarget, NodeFacts, Pull, metrics_url
from llmgw.agent.metrics import serve as serve_metrics
from llmgw.agent.peers import CacheServer
from llmgw.agent.registration import Registration, retry_forever
from llmgw.agent.reporter import Gone, StatusReporter, Writer
from llmgw.agent.runner import Context
from llmgw.agent.state import StateDir
from llmgw.agent.supervisor import Supervisor
from llmgw.api import AnyObject, LoraAdapter, NodeStatus, Shard, ShardStatus
from llmgw.api.errors import NotFound
from llmgw.api.members import advertised
from llmgw.backoff import Backoff
from llmgw.client import ApiError, Client
from llmgw.pki.renewal import ExpiryCollector, Renewer, complete_renewal
from llmgw.pki.tls import mtls_server_context, peer_client_context
from llmgw.reflector import Reflector, object_name
from llmgw.weights.cache import Cache
from llmgw.weights.peers import Peers
from llmgw.weights.puller import Puller
from llmgw.weights.resolve import HubConfig

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.node = config.node_name
        self.facts: Facts | None = None
        self.supervisor: Supervisor | None = None
        self.registration: Registration | None = None
        self.foreign_ports: list[int] = []
        self._free_reported: dict[int, int] = {}   # GPU index -> the free MiB its Node status last said
        self.logs_endpoint: str | None = None    # where its log server listens (Node status.agentEndpoint)
        self.metrics_address: str | None = None  # where its GET /metrics listens (Node status.agentMetrics)
        self.revoked = Revoked()                 # the server's revoked serials, refused by its listener
        self.puller: Puller | None = None
        self.renewer: Renewer | None = None
        # the TLS contexts that present the node's certificate: a renewal loads the new one into each
        self._contexts: list[ssl.SSLContext] = []

    def discover(self) -> Facts:
        self.facts = gather(self.config)
        for w in self.facts.warnings:
            log.warning("%s", w)
        if not self.facts.gpu.ok:
            log.error("GPU discovery failed: %s", self.facts.gpu.error)
        return self.facts

    async def run(self) -> None:
        cfg = self.config
        facts = self.facts if self.facts is not None else self.discover()
        state = StateDir(cfg.state_dir)
        state.prepare()
        if cfg.cert and cfg.key:
            complete_renewal(cfg.cert, cfg.key)
        client = Client(cfg.server_urls, ca=cfg.ca, cert=cfg.cert, key=cfg.key)
        reporter = StatusReporter(self._shard_writer(client), self.node)
        cache = Cache(cfg.weights_path, cfg.weights_cache_size)
        cache.open()
        peers = None
        if cfg.logs_listen and cfg.weights_peers:
            assert cfg.cert and cfg.key and cfg.ca  # require_connection checked them
            self._contexts.append(peer_client_context(cfg.cert, cfg.key, cfg.ca))
            peers = Peers(self.node, self._fabrics, client.nodes_with_weights, self._contexts[-1])
        self.puller = Puller(cache, HubConfig(cfg.hub_endpoint, cfg.hub_token_file), on_change=self._weights_changed,
                             peers=peers)
        ctx = Context(node=self.node, config=cfg, facts=facts, state=state, reporter=reporter,
                      foreign_ports=self._set_foreign_ports, puller=self.puller)
        sup = self.supervisor = Supervisor(ctx)
        ctx.adapters.on_change = sup.adapters_changed
        if sup.records:
            log.info("state dir %s records engines of shards %s: adopting those that still exist",
                     cfg.state_dir, sorted(sup.records))
        if cfg.cert and cfg.key and cfg.renew_fraction:
            self.renewer = Renewer(cfg.cert, cfg.key, client, fraction=cfg.renew_fraction, jitter=cfg.renew_jitter,
                                   reload=[client.use_certificate, self._reload_contexts])
        reg = self.registration = Registration(client, self.node, cfg.labels, cfg.heartbeat_interval)
        reg.on_reconnect.append(reporter.kick)
        tasks: list[asyncio.Task[Any]] = []
        metrics_site: web.AppRunner | None = None
        logs_site: web.AppRunner | None = None
        try:
            if cfg.logs_listen:
                logs_site = await self._listen(cfg.logs_listen, facts.address, {
                    "/shards": LogServer(state, sup.running).app(), "/weights": CacheServer(self.puller).app(),
                    "/adapters": DirectLoads(sup.load_direct).app()})
            self.foreign_ports = await self._scan_foreign_ports()
            if cfg.metrics_listen:   # before registering: its address is in the Node's status
                metrics_site = await self._serve_metrics(cfg.metrics_listen, facts.address)
            await reg.register(self._node_status())
            tasks = [asyncio.ensure_future(c) for c in (
                reg.heartbeat_loop(), reporter.run(), self._watch_shards(client), self._watch_adapters(client),
                self._rediscover(), self._refresh_gpu_memory(),
                *([self._watch_revocations(client)] if logs_site is not None else []),
                *([self.renewer.run()] if self.renewer is not None else []))]
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for site in (metrics_site, logs_site):
                if site is not None:
                    await site.cleanup()
            await sup.close()
            await self.puller.close()
            await client.close()

    async def _watch_revocations(self, client: Client) -> None:
        """The server's revoked serials, for the listener: a revoked certificate is refused there
        within a watch's delay of its revocation. While the server refuses the watch (this node's
        certificate revoked or expired, a server without the list) the listener fails closed: 503
        to everyone, naming why; the watch is asked again, backing off, and the listener serves
        once the server lists the revocations again (docs/contracts.md, "Peers")."""
        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                async for type_, serial in client.list_and_watch_revocations(synced=True):
                    if type_ == "SYNCED":
                        if self.revoked.refused is not None:
                            log.info("the server lists the revoked certificates again: the listener serves again")
                        self.revoked.refused = None
                        backoff.reset()
                    elif serial is not None:
                        (self.revoked.serials.discard if type_ == "DELETED" else self.revoked.serials.add)(serial)
            except ApiError as err:
                if self.revoked.refused is None:
                    log.error("the server refuses this agent's watch of revoked certificates (%s): the listener "
                              "answers every request 503 until the server lists them again", err)
                self.revoked.refused = str(err)
                await backoff.sleep()

    def _reload_contexts(self, cert: str, key: str) -> None:
        """The listener and the peers' client present the renewed certificate from their next handshake."""
        for ctx in self._contexts:
            ctx.load_cert_chain(cert, key)

    async def _serve_metrics(self, listen: str, address: str) -> web.AppRunner:
        host, _, port = listen.rpartition(":")
        assert self.supervisor is not None  # made by run
        metrics = AgentMetrics(self._phases, self._engine_targets, self._node_facts,
                               [self.supervisor.ctx.adapter_counts])
        renewer = self.renewer
        if renewer is not None:
            metrics.registry.register(ExpiryCollector({"node": lambda: renewer.not_after}))
        runner = await serve_metrics(metrics, host.strip("[]") or "0.0.0.0", int(port))
        log.info("metrics on http://%s/metrics", listen)
        self.metrics_address = advertised(f"{host}:{runner.addresses[0][1]}", address)
        return runner

    async def _listen(self, where: str, address: str, apps: dict[str, web.Application]) -> web.AppRunner:
        """The agent's TLS listener (--logs-listen): engine logs for the API server, the weights
        cache for peers, each under its prefix with its own rule of who may ask."""
        cfg = self.config
        assert cfg.cert and cfg.key and cfg.ca  # require_connection checked them
        host, _, port = where.rpartition(":")
        self._contexts.append(mtls_server_context(cfg.cert, cfg.key, cfg.ca))
        runner, bound = await listen(apps, host.strip("[]") or "0.0.0.0", int(port), self._contexts[-1],
                                     self.revoked)
        self.logs_endpoint = f"https://{f'[{address}]' if ':' in address else address}:{bound}"
        log.info("engine logs for the API server, the weights cache for peers, on %s", self.logs_endpoint)
        return runner

    def _fabrics(self) -> set[str]:
        assert self.facts is not None  # discovered by run
        return {f.name for f in self.facts.fabrics.fabrics}

    def _phases(self) -> list[str]:
        sup = self.supervisor
        return [r.status.phase for r in sup.runners.values()] if sup is not None else []

    def _node_facts(self) -> NodeFacts:
        sup, puller = self.supervisor, self.puller
        pulls = []
        for r in sup.runners.values() if sup is not None else ():
            pull = r.status.pull
            if r.status.phase == "Pulling" and pull is not None:
                pulls.append(Pull(r.shard.spec.model, r.shard.spec.replica, pull.bytesDone, pull.bytesTotal))
        cache = puller.cache.status() if puller is not None else None
        return NodeFacts(pulls, cache.capacityBytes if cache else None, cache.freeBytes if cache else None,
                         dict(sup.ctx.failures) if sup is not None else {},
                         dict(puller.fetched) if puller is not None else {})

    def _engine_targets(self) -> list[EngineTarget]:
        """The serving engines of this node's Ready shards (their probe is HTTP: rank 0's)."""
        sup = self.supervisor
        out = []
        for r in sup.runners.values() if sup is not None else ():
            record = r.record
            if r.status.phase != "Ready" or record is None or record.probe_kind != "http" or not record.probe_url:
                continue
            spec = r.shard.spec
            out.append(EngineTarget(metrics_url(record.probe_url), {
                "model": spec.model, "replica": spec.replica, "node": self.node, "rank": str(spec.rank),
                "engine": spec.engine}))
        return out

    @staticmethod
    def _shard_writer(client: Client) -> Writer:
        async def write(name: str, node: str, status: dict[str, Any]) -> ShardStatus:
            try:
                shard = await client.patch_status(Shard, name, status, node=node)
            except NotFound:
                raise Gone(name) from None
            return shard.status
        return write

    async def _watch_shards(self, client: Client) -> None:
        sup = self.supervisor
        assert sup is not None  # made by run

        async def follow() -> None:
            async for kind, obj in client.list_and_watch(Shard, node=self.node, synced=True):
                if kind == "SYNCED":
                    sup.synced()
                elif isinstance(obj, Shard):  # the only kind asked for
                    if kind == "DELETED":
                        sup.remove(obj)
                    else:
                        sup.upsert(obj)
        # list_and_watch rides out outages itself; it raises on refusals (403, 401): retry those too.
        while True:
            await retry_forever(f"watching shards of node {self.node}", follow, max_wait=30.0)

    async def _watch_adapters(self, client: Client) -> None:
        """The Adapters, for the runners whose engines load them (llmgw/agent/adapters.py)."""
        assert self.supervisor is not None  # made by run
        book = self.supervisor.ctx.adapters

        async def follow() -> None:   # a reflector of its own: the book keeps each change's revision
            def apply(type_: str, obj: AnyObject, revision: int) -> None:
                if isinstance(obj, LoraAdapter):  # the only kind asked for
                    book.apply(type_, obj, revision)
            await Reflector(client.lister_watcher(LoraAdapter), apply, key=object_name,
                            backoff=Backoff(0.1, 5.0), name="watch of adapters").run()
        while True:
            await retry_forever("watching adapters", follow, max_wait=30.0)

    async def _rediscover(self) -> None:
        interval = self.config.rediscover_interval
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                facts = await asyncio.to_thread(gather, self.config)
            except Exception as err:  # noqa: BLE001 e.g. an adapter vanished: keep the facts we started with
                log.error("rediscovery failed, keeping earlier facts: %s", err)
                continue
            assert self.supervisor is not None and self.registration is not None  # made by run
            self.facts = facts
            self.supervisor.ctx.facts = facts
            self.foreign_ports = await self._scan_foreign_ports()
            await self.registration.update_status(self._node_status())

    async def _refresh_gpu_memory(self) -> None:
        """Each GPU's free memory read again every gpu_memory_interval, between rediscoveries: the
        scheduler compares it with a model's estimate. A failed read keeps the figures it had (the
        next rediscovery reports the failure)."""
        interval = self.config.gpu_memory_interval
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            gpu = await asyncio.to_thread(discover_gpus, self.config.nvidia_smi, self.config.nvidia_smi_timeout)
            assert self.supervisor is not None and self.registration is not None and self.facts is not None
            if not gpu.ok:
                continue
            self.facts = self.supervisor.ctx.facts = dataclasses.replace(self.facts, gpu=gpu)
            await self.registration.update_status(self._node_status())

    def _node_status(self) -> NodeStatus:
        assert self.facts is not None  # discovered by run
        status = node_status(self.facts, self.config)
        status.gpus = settle_free(status.gpus, self._free_reported, self.config.gpu_memory_step)
        self._free_reported = {g.index: g.memoryFreeMiB for g in status.gpus if g.memoryFreeMiB is not None}
        status.foreignPorts = list(self.foreign_ports)
        status.agentEndpoint = self.logs_endpoint
        status.agentMetrics = self.metrics_address
        if self.puller is not None:
            status.weights = self.puller.status()
        return status

    async def _weights_changed(self) -> None:
        if self.registration is not None:
            await self.registration.update_status(self._node_status())

    async def _scan_foreign_ports(self) -> list[int]:
        rng = self.config.port_range
        assert self.supervisor is not None and self.facts is not None  # made by run
        held = await asyncio.to_thread(ports.holders, range(rng.first, rng.last + 1),
                                       self.supervisor.engine_groups(), self.facts.address)
        found = ports.foreign(held)
        for h in found:
            if h.port not in self.foreign_ports:
                log.warning("%s, not an engine of this node: no shard will be given it", h.describe())
        return sorted({h.port for h in found})

    async def _set_foreign_ports(self, found: list[int]) -> None:
        if found != self.foreign_ports:
            log.warning("ports of this node's range held by other processes: %s", found or "none")
            self.foreign_ports = found
            if self.registration is not None:
                await self.registration.update_status(self._node_status())
