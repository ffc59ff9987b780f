"""The whole stack as separate processes: etcd, server, controller-manager, gateway, agents, sim engines.

One cluster for the module (starting it is the slow part), used as a person would:
apply, send requests, drain under load, lose a node, restart the controller-manager
in the middle of a drain, change a template under load. Each test stands alone: it
gets the example models from the `models` fixture (applied, Ready and served; deleted
and gone after it) and takes nodes out of service through `out_of_service`, which puts
them back after it, so each passes alone or in any order.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from llmgw.api import Model, Node, Replica, load_path
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR
from llmgw.client import Client, ClientConfig, NotFound
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import free_port
from tests.fixtures.poll import until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)

NODES = [NodePlan("node01", "ib-a"), NodePlan("node02", "ib-a"), NodePlan("node03", "ib-a"),
         NodePlan("node04", "ib-b"), NodePlan("node05", None), NodePlan("node06", "ib-a")]
# sim-large (aliased large): one replica over two nodes of one fabric; sim-small (small): two replicas
EXAMPLES = ("sim-2node.yaml", "sim-single.yaml")
SERVED_NAMES = ("sim-large", "large", "sim-small", "small")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("e2e"), NODES, gateway_port=free_port(),
                     node_grace=3.0, drain_delay=1.5, lease_seconds=4.0)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def llmgw_cli(cluster, *args) -> str:
    out = subprocess.run([sys.executable, "-m", "llmgw.cli.main", *args], capture_output=True, text=True,
                         env={**os.environ, "LLMGW_CONFIG": str(cluster.admin_config)}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def node_status(cluster, node: str) -> str:
    for line in llmgw_cli(cluster, "get", "nodes").splitlines():
        cols = line.split()
        if cols and cols[0] == node:
            return cols[1]
    raise AssertionError(f"{node} not in `llmgw get nodes`")


async def wait(what: str, check, timeout: float):
    """`until` at the pace of a whole cluster (each check is a few API calls or a CLI run)."""
    return await until(check, what, timeout=timeout, interval=0.3)


class Load:
    """Constant request load through the gateway; counts every failure."""

    def __init__(self, url: str, models: list[str], concurrency: int = 4):
        self.url, self.models, self.concurrency = url, models, concurrency
        self.ok = 0
        self.failures: list[str] = []
        self._stop = asyncio.Event()

    async def _worker(self, i: int, session: aiohttp.ClientSession):
        n = 0
        while not self._stop.is_set():
            model = self.models[(i + n) % len(self.models)]
            n += 1
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            try:
                async with session.post(f"{self.url}/v1/chat/completions", json=body) as r:
                    text = await r.text()
                    if r.status == 200:
                        self.ok += 1
                    else:
                        self.failures.append(f"{model}: {r.status} {text[:200]}")
            except aiohttp.ClientError as err:
                self.failures.append(f"{model}: {err!r}")

    async def __aenter__(self):
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._tasks = [asyncio.create_task(self._worker(i, self._session)) for i in range(self.concurrency)]
        return self

    async def __aexit__(self, *exc):
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()


async def replicas_of(c: Client, model: str):
    items, _ = await c.list(Replica)
    return [r for r in items if r.spec.model == model]


async def ready_count(c: Client, model: str) -> int:
    return sum(1 for r in await replicas_of(c, model) if r.status.phase == "Ready" and not r.metadata.deletionTimestamp)


def nodes_of(r) -> set[str]:
    return {p.node for p in r.spec.placement}


@pytest.fixture
async def client(cluster):
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
        yield c


async def served(http: aiohttp.ClientSession, gateway_url: str, model: str) -> bool:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with http.post(f"{gateway_url}/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status == 200


@pytest.fixture
async def models(cluster, client):
    """The example models, applied, Ready and served through the gateway under every name;
    after the test, deleted and gone (their replicas too), so the next test starts afresh."""
    names = []
    for path in EXAMPLES:
        for _, obj in load_path(ROOT / "examples" / "models" / path):
            result, _ = await client.apply(obj)
            assert result == "created", f"{obj.metadata.name} left behind by another test"
            names.append(obj.metadata.name)

    async def all_ready():
        m1, m2 = await client.get(Model, "sim-large"), await client.get(Model, "sim-small")
        return m1.status.readyReplicas >= 1 and m2.status.readyReplicas >= 2
    await wait("both models Ready", all_ready, timeout=120)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for name in SERVED_NAMES:  # the gateway has seen the Ready replicas
            await wait(f"{name} served through the gateway",
                       lambda name=name: served(http, cluster.gateway_url, name), timeout=60)
    yield names
    for name in names:
        await client.delete(Model, name)

    async def gone():
        for name in names:
            try:
                await client.get(Model, name)
                return False
            except NotFound:
                pass
        return not [r for r in (await client.list(Replica))[0] if r.spec.model in names]
    await wait("the models and their replicas gone", gone, timeout=150)


class OutOfService:
    """The nodes a test drains or loses, put back in service after it."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.drained: list[str] = []
        self.lost: list[str] = []

    def drain(self, node: str) -> None:
        self.drained.append(node)
        llmgw_cli(self.cluster, "drain", node)

    def lose(self, node: str) -> None:
        """The node goes away: its agent and engines are killed."""
        self.lost.append(node)
        self.cluster.procs[f"stopped:agent-{node}"] = self.cluster.procs.pop(f"agent-{node}")
        for pid in self.cluster.node_pids(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def restore(self) -> None:
        for node in self.drained:
            llmgw_cli(self.cluster, "uncordon", node)
        for node in self.lost:  # its agent starts again
            self.cluster.procs.pop(f"stopped:agent-{node}", None)
            self.cluster.start_agent(next(n for n in NODES if n.name == node))
        for node in self.drained + self.lost:
            await wait(f"{node} Ready again", lambda node=node: node_status(self.cluster, node) == "Ready",
                       timeout=60)


@pytest.fixture
async def out_of_service(cluster, models):
    """Nodes taken out by the test come back after it. It needs `models` so that it is torn
    down first: a lost node's shards go only once its agent is back to confirm their engines stopped."""
    nodes = OutOfService(cluster)
    yield nodes
    await nodes.restore()


async def test_1_models_become_ready_and_serve(cluster, client, models):
    large = (await replicas_of(client, "sim-large"))[0]
    assert {p.fabric for p in large.spec.placement} == {"ib-a"}
    assert len(nodes_of(large)) == 2

    import openai
    oc = openai.AsyncOpenAI(base_url=f"{cluster.gateway_url}/v1", api_key="none")
    for model in SERVED_NAMES:
        resp = await oc.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}])
        assert resp.choices[0].message.content
    await oc.close()
    assert node_status(cluster, "node01") == "Ready"


async def test_2_drain_under_load_loses_no_request(cluster, client, out_of_service):
    large = (await replicas_of(client, "sim-large"))[0]
    drained = sorted(nodes_of(large))[0]

    async def drained_node_empty():  # its replicas go once their engines have stopped
        return not [r for r in (await client.list(Replica))[0] if drained in nodes_of(r)]
    async with Load(cluster.gateway_url, ["sim-large", "sim-small"]) as load:
        out_of_service.drain(drained)
        assert (node_status(cluster, drained).startswith("Ready,SchedulingDisabled")
                or "Draining" in node_status(cluster, drained))

        async def drained_done():
            node = await client.get(Node, drained)
            return node.status.drain and node.status.drain.phase == "Drained"
        await wait(f"{drained} Drained", drained_done, timeout=150)
        await wait("the drained node's replicas gone", drained_node_empty, timeout=60)  # under load still
    assert not load.failures, load.failures[:5]
    assert load.ok > 20

    new_large = [r for r in await replicas_of(client, "sim-large") if not r.metadata.deletionTimestamp]
    assert len(new_large) == 1
    assert {p.fabric for p in new_large[0].spec.placement} == {"ib-a"}
    assert "Drained" in node_status(cluster, drained)


async def test_3_lost_node_goes_notready_and_its_replica_is_rebuilt(cluster, client, out_of_service):
    small = [r for r in await replicas_of(client, "sim-small") if r.status.phase == "Ready"]
    large_nodes = set().union(*(nodes_of(r) for r in await replicas_of(client, "sim-large")))
    hosts = sorted(set().union(*(nodes_of(r) for r in small)), key=lambda n: (n in large_nodes, n))
    victim = hosts[0]  # a node hosting sim-small, preferably not sim-large
    out_of_service.lose(victim)
    await wait(f"{victim} NotReady", lambda: node_status(cluster, victim).startswith("NotReady"), timeout=60)

    async def rebuilt():
        live = [r for r in await replicas_of(client, "sim-small")
                if r.status.phase == "Ready" and victim not in nodes_of(r) and not r.metadata.deletionTimestamp]
        return len(live) >= 2
    await wait("sim-small rebuilt away from the lost node", rebuilt, timeout=120)


async def test_4_controller_manager_restart_mid_drain_makes_no_second_replacement(cluster, client, out_of_service):
    large = [r for r in await replicas_of(client, "sim-large") if not r.metadata.deletionTimestamp][0]
    target = sorted(nodes_of(large))[0]
    out_of_service.drain(target)

    async def replacement_exists():
        return [r for r in (await client.list(Replica))[0]
                if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) == large.name]
    await wait("a replacement", replacement_exists, timeout=60)
    cluster.stop_process("controller-manager", signal.SIGKILL)
    cluster.procs["stopped:controller-manager"] = cluster.procs.pop("controller-manager")
    cluster.start_controller_manager("controller-manager-2")

    async def drained_done():
        node = await client.get(Node, target)
        return node.status.drain and node.status.drain.phase == "Drained"
    await wait(f"{target} Drained after the restart", drained_done, timeout=150)
    replacements = [r for r in (await client.list(Replica))[0]
                    if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) == large.name]
    # the annotation may be cleared once the original is gone; a second replacement never appears
    assert len(replacements) <= 1
    live_large = [r for r in await replicas_of(client, "sim-large") if not r.metadata.deletionTimestamp]
    assert len(live_large) == 1
    assert await ready_count(client, "sim-large") == 1


async def test_5_template_change_under_load_loses_no_request(cluster, client, models):
    model = await client.get(Model, "sim-small")
    old = {r.name for r in await replicas_of(client, "sim-small")}
    model.spec.profiles[0].args = ["--tokens-per-second", "400"]
    async with Load(cluster.gateway_url, ["sim-small", "small"]) as load:
        await client.update(model)

        async def rolled():
            live = [r for r in await replicas_of(client, "sim-small") if not r.metadata.deletionTimestamp]
            return (len(live) == 2 and not {r.name for r in live} & old
                    and all(r.status.phase == "Ready" for r in live)
                    and all(r.spec.profile.args == ["--tokens-per-second", "400"] for r in live))
        await wait("sim-small rolled to the new template", rolled, timeout=150)

        async def old_gone():
            return not {r.name for r in await replicas_of(client, "sim-small")} & old
        await wait("old sim-small replicas gone", old_gone, timeout=60)
    assert not load.failures, load.failures[:5]
    assert load.ok > 20
    m = await client.get(Model, "sim-small")
    assert m.status.updatedReplicas == 2 and m.status.readyReplicas == 2
