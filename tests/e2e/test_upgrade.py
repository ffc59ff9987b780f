"""The upgrade from the release before HEAD (RELEASES), in place, under load, in the README's order
("Upgrading llmgw"): a cluster of that release, built from its commit (tests/fixtures/release.py),
its servers, controller-manager, `llmgw ctl migrate-storage`, gateways (two, one out of rotation at
a time) and agent upgraded one after another while requests go through the gateways. Not one
request fails, no engine restarts, and every object stays readable and writable; with the servers
upgraded, the old agent (no X-Llmgw-Version: taken for 0.1.0, within the window) starts a new
replica of theirs. About 35 s here (and once per machine, the previous release's build: a minute)."""
from __future__ import annotations

import asyncio
import functools
import subprocess
from collections import Counter

import aiohttp
import pytest

from llmgw.api import KINDS, Model, Node, Replica, parse_object
from llmgw.api.wellknown import BUILTIN_ROLE_LABEL
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import LLMGW, free_port
from llmgw.version import version
from tests.fixtures.poll import until
from tests.fixtures.release import previous_release

pytestmark = pytest.mark.timeout(400)
NODE = NodePlan("node01", "ib-a")
COMPONENTS = ("server", "controller-manager", "gateway", "gateway-2", f"agent-{NODE.name}")


class Rotation:
    """Chat completions through the gateways in rotation, one after another per client; a gateway
    is taken out (`out`) once no request is on it, as a load balancer drains it."""

    def __init__(self, urls: list[str], model: str, clients: int = 3):
        self.urls, self.model, self.clients = list(urls), model, clients
        self.ok: Counter[str] = Counter()
        self.failures: list[str] = []
        self.busy: Counter[str] = Counter()
        self._stop = asyncio.Event()

    async def _client(self, i: int, session: aiohttp.ClientSession) -> None:
        n = i
        while not self._stop.is_set():
            url = self.urls[n % len(self.urls)]
            n += 1
            body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            self.busy[url] += 1
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                    text = await r.text()
                    if r.status == 200:
                        self.ok[url] += 1
                    else:
                        self.failures.append(f"{url}: {r.status} {text[:200]}")
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                self.failures.append(f"{url}: {err!r}")
            finally:
                self.busy[url] -= 1
            await asyncio.sleep(0.02)

    async def out(self, url: str) -> None:
        self.urls.remove(url)
        await until(lambda: self.busy[url] == 0, f"the requests on {url} to end", timeout=30)

    async def __aenter__(self) -> "Rotation":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self._tasks = [asyncio.create_task(self._client(i, self._session)) for i in range(self.clients)]
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()


def engines(c: LocalCluster) -> set[int]:
    """The node's engine processes (its marked processes but the agent)."""
    return set(c.node_pids(NODE.name)) - {c.procs[f"agent-{NODE.name}"].pid}


async def test_upgrade_from_the_previous_release_under_load(tmp_path):
    old, site = previous_release()
    assert old != version()
    c = LocalCluster(tmp_path / "cluster", [NODE], gateway_port=free_port(), lease_seconds=3.0, drain_delay=0.5)
    c.wrap.update({name: ["env", f"PYTHONPATH={site}"] for name in COMPONENTS})   # every component the old release
    second = free_port()
    gateways = [c.gateway_url, f"http://127.0.0.1:{second}"]

    async def upgrade(name: str, start, url: str | None = None) -> None:
        """Stop the old release's `name` and start this one's in its place (off the event loop: the load goes on)."""
        del c.wrap[name]
        await asyncio.to_thread(c.stop_process, name)
        await asyncio.to_thread(start)
        if url is not None:
            await asyncio.to_thread(c.wait_http, f"{url}/healthz", name)
    try:
        await asyncio.to_thread(c.start)
        c.start_gateway("gateway-2", second)
        c.wait_http(f"{gateways[1]}/healthz", "gateway-2")
        async with Client.from_config(ClientConfig.load(c.admin_config)) as client:
            await client.create(parse_object({
                "apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "up"},
                "spec": {"replicas": 1, "profiles": [{"engine": "sim", "gpusPerNode": 1}]}}))

            async def ready(n: int) -> bool:
                items, _ = await client.list(Replica)
                return sum(r.status.phase == "Ready" for r in items if r.spec.model == "up") == n

            async def agent_version() -> str | None:
                return (await client.get(Node, NODE.name)).status.agentVersion
            await until(lambda: ready(1), "the old release's replica Ready", timeout=90, interval=0.3)
            assert await agent_version() == old
            async with Rotation(gateways, "up") as load:
                await until(lambda: all(load.ok[g] for g in gateways), "requests through both gateways", timeout=30)
                before = engines(c)
                assert before
                await upgrade("server", c.start_server)
                await asyncio.to_thread(c.wait_server)
                await upgrade("controller-manager", c.start_controller_manager)
                # the old agent with the new servers and controller-manager: a new replica of theirs
                model = await client.get(Model, "up")
                model.spec.replicas = 2
                await client.update(model)
                await until(lambda: ready(2), "a second replica, on the old agent", timeout=90, interval=0.3)
                migrate = await asyncio.to_thread(subprocess.run, [*LLMGW, "ctl", "migrate-storage",
                                                  *c.etcd_flags("dev-admin")], capture_output=True, text=True)
                assert migrate.returncode == 0, migrate.stderr
                counts = dict(line.split(None, 1) for line in migrate.stdout.splitlines())   # 0.1.0 stored v1
                assert counts["models"] == "0 migrated, 1 current" and counts["nodes"] == "0 migrated, 1 current"
                for name, url, port in (("gateway", gateways[0], c.gateway_port), ("gateway-2", gateways[1], second)):
                    await load.out(url)   # out of rotation while it is upgraded
                    await upgrade(name, functools.partial(c.start_gateway, name, port), url)
                    load.urls.append(url)
                await upgrade(f"agent-{NODE.name}", lambda: c.start_agent(NODE))

                async def upgraded() -> bool:
                    return await agent_version() == version()
                await until(upgraded, "the new agent's version on its Node", timeout=60, interval=0.3)
                served = sum(load.ok.values())
                await until(lambda: sum(load.ok.values()) > served + 20, "requests after the upgrade", timeout=30)
            assert load.failures == [], load.failures[:10]
            assert before <= engines(c), "an engine of the old release restarted"
            for kind in KINDS.values():   # every object readable, and writable (but the built-in roles)
                for obj in (await client.list(kind))[0]:
                    if BUILTIN_ROLE_LABEL in obj.metadata.labels:
                        continue
                    obj.metadata.annotations["upgrade"] = "checked"
                    await client.update(obj)
    finally:
        c.stop()
