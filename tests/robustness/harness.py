"""A fault-injection cluster: llmgw.dev's LocalCluster (every component a real process) plus a
store, an admin client, the recorder, the load and the conditions the scenarios wait on.

    async with fault_cluster(tmp_path, nodes=3, etcd_members=1) as c:
        await c.apply_model("m", replicas=2)
        await c.wait_model_ready("m", 2)
        async with c.load(["m"]):
            nemesis.kill_agent(c, "n1") ...
        await c.settle({"m": 2})
        c.holds(no_failed_requests=invariants.no_failed_requests(c.history), ...)

Each node runs in a network namespace of its own (llmgw/dev/netns.py): its agent and engines inside,
reached over a veth pair into a bridge, at an address of a private /24 picked per cluster, so
engines of two clusters on one machine never share an address, the recorder can tell a foreign
listener on a node's address from everything else, and a network nemesis is an nftables rule in
one node's namespace. The control plane and the gateway stay in the host's namespace and reach a
node only over its veth (the API server listens on the bridge's address). Where namespaces
cannot be made (not root, no iproute2), every scenario says so and is skipped.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.api import KINDS, Model, Node, Replica, Shard
from llmgw.cli.nodes import set_node_spec
from llmgw.client import Client, ClientConfig
from llmgw.client.errors import ApiError, Expired, Unreachable
from llmgw.dev.cluster import LocalCluster, NodePlan, marked_pids
from llmgw.dev.netns import Network, Unavailable
from llmgw.dev.process import free_port
from llmgw.store import Compacted, Store, StoreUnavailable
from tests.fixtures.poll import until
from tests.robustness import invariants
from tests.robustness.history import History, WatchResume
from tests.robustness.load import Load
from tests.robustness.recorder import Recorder

WAIT = 120.0          # bound of every condition wait (s): generous, the machine is shared


class InvariantViolated(AssertionError):
    """An invariant did not hold over the history (a wait that timed out is a plain AssertionError)."""


@dataclass
class FaultCluster(LocalCluster):
    managers: int = 2
    managers_started: int = 0
    history: History = field(default_factory=History)
    store: Store | None = None
    api: Client | None = None
    net: Network | None = None

    def start(self) -> "FaultCluster":
        super().start()
        self.history.addresses = {n.name: self.address(n) for n in self.nodes}
        return self

    def start_controller_managers(self) -> None:
        for _ in range(self.managers):
            self.managers_started += 1
            self.start_controller_manager(f"controller-manager-{self.managers_started}")

    def engine_ports(self) -> range:
        """The ports the agents give engines: the slot's `--port-range` (start_agent passes it)."""
        first, last = (int(p) for p in self.slot.port_range.split("-"))
        return range(first, last + 1)

    def connect_store(self) -> Store:
        """A store on the cluster's etcd (TLS), as its admin."""
        cert, key = self.etcd_certs["dev-admin"]
        return Store(self.etcd.endpoints, ca=self.etcd_ca, cert=cert, key=key)

    def stop(self) -> None:
        for pid in marked_pids(self.dir):      # a SIGSTOPped process would sit out its SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        super().stop()

    async def restart_etcd_member(self, m) -> None:
        await asyncio.to_thread(self.etcd.restart, m, WAIT)   # off the loop: the load goes on

    # ------------------------------------------------------------ reading
    async def replicas(self, model: str) -> list:
        items, _ = await self.store.list(Replica)
        return [r for r in items if r.spec.model == model and r.metadata.deletionTimestamp is None]

    async def shards(self, node: str | None = None) -> list:
        items, _ = await self.store.list(Shard, node=node)
        return items

    async def ready(self, model: str) -> list:
        return [r for r in await self.replicas(model) if r.status.phase == "Ready"]

    def engine_processes(self, node: str | None = None) -> list:
        """The engines the sampler sees now."""
        return [e for e in self.recorder.sample().engines if node is None or e.node == node]

    async def node_condition(self, node: str, type_: str) -> str | None:
        """The condition's status ("True", "False", ...), or None when the node has none."""
        reason = await self.node_condition_reason(node, type_)
        return reason[0] if reason else None

    async def node_condition_reason(self, node: str, type_: str) -> tuple[str, str] | None:
        n = await self.store.get(Node, node)
        return next(((c.status, c.reason) for c in n.status.conditions if c.type == type_), None)

    async def evicted_or_held(self, nodes: list[str]) -> bool:
        """True once every node in `nodes` is held back for mass silence (condition Evicting False,
        reason MassSilence), or a replica on one is evicted."""
        if invariants.no_eviction(self.history, set(nodes)):
            return True
        return all([await self.node_condition_reason(n, "Evicting") == ("False", "MassSilence") for n in nodes])

    # ------------------------------------------------------------ acting
    async def apply_model(self, name: str, replicas: int, args: list[str] | None = None,
                          max_surge: int = 1, max_unavailable: int = 0) -> Model:
        model = Model.model_validate({
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "profiles": [{"engine": "sim", "gpusPerNode": 1, "args": args or []}],
                     "update": {"maxSurge": max_surge, "maxUnavailable": max_unavailable}}})
        _, obj = await self.wait(f"model {name} applied", lambda: self.api.apply(model))
        return obj

    async def set_args(self, name: str, args: list[str]) -> None:
        async def update():
            model = await self.api.get(Model, name)
            model.spec.profiles[0].args = args
            return await self.api.update(model)
        await self.wait(f"model {name} updated", update)

    async def drain(self, node: str) -> None:
        await self.wait(f"{node} drained", lambda: set_node_spec(self.api, node, unschedulable=True, drain=True))

    async def cordon(self, node: str, on: bool) -> None:
        """`llmgw cordon` (on) or `uncordon` (off)."""
        changes = {"unschedulable": True} if on else {"unschedulable": False, "drain": False}
        await self.wait(f"{node} cordoned={on}", lambda: set_node_spec(self.api, node, **changes))

    @contextlib.contextmanager
    def squatting(self, ports: dict[str, int]) -> Iterator[set[tuple[str, int]]]:
        """A foreign process listening on each node's address at its port in `ports`, inside the
        node's namespace, while the block runs; yields the (address, port) pairs it holds (a port
        taken meanwhile is left out). It carries the cluster's marker, so the recorder reads its
        namespace even while the node's agent is gone."""
        procs = []
        try:
            for node, port in ports.items():
                address = self.address(next(n for n in self.nodes if n.name == node))
                procs.append(((address, port), subprocess.Popen(
                    [*self.net.exec_prefix(node), sys.executable, "-c", _SQUAT, address, str(port)],
                    stdout=subprocess.PIPE, text=True, env=self.env())))
            yield {where for where, p in procs if p.stdout.readline().strip() == "listening"}
        finally:
            for _, p in procs:
                p.kill()
                p.wait()
                p.stdout.close()

    def load(self, models: list[str], concurrency: int = 3, streams: int = 0, key: str | None = None) -> Load:
        return Load(self.gateway_url, models, self.history, concurrency, streams=streams, key=key)

    # ------------------------------------------------------------ waiting
    async def wait(self, what: str, check, timeout: float = WAIT, interval: float = 0.3):
        """`until` with the failures a nemesis causes as "not yet", and the history in its message."""
        return await until(check, what, timeout=timeout, interval=interval,
                           retry=(StoreUnavailable, Unreachable, ApiError),
                           detail=lambda: f"history: {self.history.summary()}")

    async def wait_model_ready(self, model: str, replicas: int, timeout: float = WAIT) -> None:
        async def done():
            live = await self.replicas(model)
            return len(live) == replicas and all(r.status.phase == "Ready" for r in live)
        await self.wait(f"{replicas} Ready replicas of {model}", done, timeout)

    async def wait_serving(self, model: str, which, what: str) -> None:
        """Until a Ready replica of `model` satisfies `which(replica)`."""
        async def found():
            return any(which(r) for r in await self.ready(model))
        await self.wait(what, found)

    async def wait_drained(self, node: str) -> None:
        async def drained():
            n = await self.store.get(Node, node)
            return n.status.drain is not None and n.status.drain.phase == "Drained"
        await self.wait(f"{node} Drained", drained)

    async def wait_rolled(self, model: str, old: set[str], replicas: int) -> None:
        """Until `replicas` replicas, none of them in `old`, are all Ready."""
        async def rolled():
            live = await self.replicas(model)
            return (len(live) == replicas and not {r.name for r in live} & old
                    and all(r.status.phase == "Ready" for r in live))
        await self.wait(f"{model} rolled to its new template", rolled)

    async def settle(self, models: dict[str, int], timeout: float = WAIT) -> None:
        """Wait until every model has exactly its replicas, all Ready, and every engine has its shard;
        what is not reached within `timeout` is written into history.unconverged."""
        async def ready():
            for model, n in models.items():
                live = await self.replicas(model)
                if len(live) != n or any(r.status.phase != "Ready" for r in live):
                    return False
            return True

        async def no_orphan():
            shards = await self.shards()
            serving = {(s.spec.node, s.spec.ports.serve) for s in shards}
            return all(any((e.node, p) in serving for p in e.ports) for e in self.engine_processes())

        for what, check in (("every model Ready", ready), ("every engine owned by a shard", no_orphan)):
            try:
                await self.wait(what, check, timeout)
            except AssertionError:
                self.history.unconverged.append(what)

    async def resume_watch(self, kind: str, revision: int, trigger) -> None:
        """Watch `kind` after `revision` on etcd and through the server while `trigger()` makes a
        change; records both outcomes (history.resumes)."""
        async def first(stream) -> str:
            try:
                async for _ in stream:
                    return "events"
                return "ended"
            except (Expired, Compacted):
                return "Expired"
            except Exception as err:  # noqa: BLE001 - any other answer is an outcome to report
                return repr(err)[:120]
        etcd = asyncio.create_task(first(self.store.watch(KINDS[kind], from_revision=revision + 1)))
        server = asyncio.create_task(first(self.api.watch(KINDS[kind], resource_version=revision)))
        await trigger()
        outcomes = await asyncio.wait_for(asyncio.gather(etcd, server), WAIT)
        self.history.resumes.append(WatchResume(time.monotonic(), revision, *outcomes))

    def holds(self, **checks: list[str]) -> None:
        """Assert that every named invariant held (each value: that checker's violations)."""
        broken = {name: v for name, v in checks.items() if v}
        if broken:
            lines = [f"{name}: {v}" for name, found in broken.items() for v in found[:5]]
            raise InvariantViolated(f"invariants violated ({self.history.summary()}):\n" + "\n".join(lines))


_SQUAT = """import socket, sys, time
s = socket.socket()
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen()
    print("listening", flush=True)
except OSError as err:
    print(f"taken: {err}", flush=True)
time.sleep(3600)
"""


def node_plans(count: int) -> list[NodePlan]:
    """Names and fabric; fault_cluster gives each the address of its namespace."""
    return [NodePlan(f"n{i + 1}", "ib-a") for i in range(count)]


@contextlib.asynccontextmanager
async def fault_cluster(base: Path, nodes: int | list[NodePlan] = 3, *, etcd_members: int = 1, gpus: int = 2,
                        node_grace: float = 3.0, gateway_args: list[str] | None = None, servers: int = 1,
                        heartbeat_ttl: int | None = None):
    plans = node_plans(nodes) if isinstance(nodes, int) else nodes
    try:
        net = await asyncio.to_thread(Network.create, [p.name for p in plans])
    except Unavailable as why:
        pytest.skip(f"the fault cluster's nodes need network namespaces, which cannot be made here: {why}")
    try:
        c = FaultCluster(base / "cluster", plans, gateway_port=free_port(), node_grace=node_grace,
                         drain_delay=1.5, gpus_per_node=gpus, lease_seconds=4.0, etcd_members=etcd_members,
                         net=net, gateway_args=gateway_args or [], servers=servers, heartbeat_ttl=heartbeat_ttl)
        c.use_network(net)
        async with _running(c):
            yield c
    finally:
        await asyncio.to_thread(net.remove)


@contextlib.asynccontextmanager
async def _running(c: FaultCluster):
    try:
        await asyncio.to_thread(c.start)
        c.store = await c.connect_store().connect()
        c.api = Client.from_config(ClientConfig.load(c.admin_config))
        await c.wait("every node Ready", lambda: _all_ready(c), WAIT)
        c.recorder = await Recorder(c.store, c.dir, c.history, c.engine_ports()).start()
        yield c
    finally:
        if getattr(c, "recorder", None):
            await c.recorder.stop()
        if c.api:
            await c.api.close()
        if c.store:
            await c.store.close()
        await asyncio.to_thread(c.stop)


async def _all_ready(c: FaultCluster) -> bool:
    items, _ = await c.store.list(Node)
    return len(items) == len(c.nodes) and all(
        any(cd.type == "Ready" and cd.status == "True" for cd in n.status.conditions) for n in items)
