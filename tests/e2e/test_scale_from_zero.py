"""Scale from zero, end to end: etcd, server, controller-manager (the autoscaler), a gateway and an
agent as separate processes, running sim engines that take LOAD_SECONDS to load.

A model at minReplicas 0 answers the official `openai` client's first request once its replica is
up, with no error and no retry; a burst of 1,000 concurrent requests against a model at zero makes
one scale-up and every request succeeds; a gateway restarted while its model is at zero holds the
request for it, it does not refuse it.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from llmgw.api import Model, Replica
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import free_port
from tests.fixtures.poll import until

pytestmark = pytest.mark.timeout(300)
LOAD_SECONDS = 3.0
BURST = 1000


def autoscaled(name: str, max_replicas: int = 2, target: int = 8) -> Model:
    # a new model at minReplicas 0 starts no replica before its first request; the long scale-down
    # window and delay keep the replica once it is up, for the rest of the module
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "profiles": [{"engine": "sim", "gpusPerNode": 1,
                      "args": ["--tokens-per-second", "1000", "--load-seconds", str(LOAD_SECONDS)]}],
        "autoscaling": {"minReplicas": 0, "maxReplicas": max_replicas, "targetInFlight": target,
                        "scaleDownStabilizationSeconds": 600, "scaleToZeroDelaySeconds": 600}}})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # 1,000 connections from one address: no per-address cap; a queue that holds them all.
    c = LocalCluster(tmp_path_factory.mktemp("zero"), [NodePlan("node01", "ib-a")], gateway_port=free_port(),
                     gateway_args=["--max-conns-per-addr", "0", "--queue-size", str(BURST),
                                   "--queue-timeout", "120"])
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
async def client(cluster):
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
        yield c


async def at_zero(cluster, client: Client, name: str, **kw) -> Model:
    """The model created, at zero replicas, and known to the gateway (else its name would 404)."""
    return await known(cluster, client, autoscaled(name, **kw))


async def known(cluster, client: Client, model: Model) -> Model:
    """`model` created and known to the gateway."""
    async with aiohttp.ClientSession() as http:
        async def models() -> int:
            async with http.get(cluster.gateway_url + "/healthz") as r:
                return int((await r.json())["models"])
        before = await models()
        m = await client.create(model)
        await until(lambda: _eq(models, before + 1), f"the gateway to know {model.name}", timeout=30,
                    interval=0.1)
    return m


async def _eq(read, want) -> bool:
    return await read() == want


async def scaled_up(client: Client, name: str) -> list[dict]:
    return [e for e in await client.events(Model, name) if e["reason"] == "ScaledUp"]


async def test_the_openai_clients_first_request_is_answered_once_the_replica_is_up(cluster, client):
    await at_zero(cluster, client, "first")
    ai = openai.AsyncOpenAI(base_url=cluster.gateway_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    start = time.monotonic()
    answer = await ai.completions.create(model="first", prompt="hello", max_tokens=4)
    took = time.monotonic() - start
    assert answer.choices[0].text
    assert took >= LOAD_SECONDS   # it waited for a replica to start and load, and got no error
    ups = await scaled_up(client, "first")
    assert len(ups) == 1 and ups[0]["message"].endswith("-> 1"), ups


async def test_a_burst_at_zero_makes_one_scale_up_and_no_error(cluster, client):
    # targetInFlight above the burst: the whole burst asks for one replica
    await at_zero(cluster, client, "burst", target=2 * BURST)
    body = {"model": "burst", "prompt": "hello", "max_tokens": 2}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=180)) as http:
        async def ask() -> str:
            try:
                async with http.post(cluster.gateway_url + "/v1/completions", json=body) as r:
                    return str(r.status) if r.status != 200 else (await r.json())["object"]
            except aiohttp.ClientError as err:
                return repr(err)
        results = await asyncio.gather(*(ask() for _ in range(BURST)))
    failures = [r for r in results if r != "text_completion"]
    assert failures == [], f"{len(failures)} failed, e.g. {failures[:5]}"
    ups = await scaled_up(client, "burst")
    assert len(ups) == 1, ups
    m = await client.get(Model, "burst")
    assert m.status.desiredReplicas == 1


async def test_a_gateway_restarted_while_its_model_is_at_zero_holds_the_request(cluster, client):
    await at_zero(cluster, client, "restart")
    cluster.stop_process("gateway")
    cluster.start_gateway()
    body = {"model": "restart", "prompt": "hello", "max_tokens": 2}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        async def answer() -> tuple[int, str] | None:
            try:   # the first request that reaches the new gateway, as soon as it listens
                async with http.post(cluster.gateway_url + "/v1/completions", json=body) as r:
                    return r.status, await r.text()
            except aiohttp.ClientConnectorError:
                return None
        status, text = await until(answer, "the restarted gateway to answer", timeout=120, interval=0.05)
    assert status == 200, text


async def test_scale_down_under_load_fails_no_request(cluster, client):
    """Three replicas under six streaming clients, then one client: the autoscaler scales down
    to one while that client streams on, and every stream of both phases ends whole (the replicas
    that go leave the gateway's table before their engines stop)."""
    m = Model.model_validate({"metadata": {"name": "down"}, "spec": {
        "profiles": [{"engine": "sim", "gpusPerNode": 1, "args": ["--tokens-per-second", "40"]}],
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetInFlight": 2,
                        "scaleDownStabilizationSeconds": 2, "scaleToZeroDelaySeconds": 600}}})
    await known(cluster, client, m)
    body = {"model": "down", "max_tokens": 12, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    outcomes: list[str] = []
    clients_wanted = [6]

    async def streamer(i: int, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set() and i < clients_wanted[0]:
            try:
                async with http.post(cluster.gateway_url + "/v1/chat/completions", json=body) as r:
                    text = await r.text()
                    outcomes.append("ok" if r.status == 200 and text.rstrip().endswith("data: [DONE]")
                                    else f"{r.status}: {text[-200:]}")
            except aiohttp.ClientError as err:
                outcomes.append(repr(err))

    async def replicas() -> int:
        return len([r for r in (await client.list(Replica))[0] if r.spec.model == "down"])

    async def ready() -> int:
        return (await client.get(Model, "down")).status.readyReplicas

    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        tasks = [asyncio.create_task(streamer(i, http, stop)) for i in range(6)]
        try:
            await until(lambda: _eq(ready, 3), "three Ready replicas under six clients", timeout=120)
            clients_wanted[0] = 1                      # five clients stop after their stream
            await until(lambda: _eq(replicas, 1), "scaled down to one replica under one client", timeout=120)
            await asyncio.sleep(2)                     # and it goes on answering
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    failures = [o for o in outcomes if o != "ok"]
    assert failures == [], f"{len(failures)} of {len(outcomes)} failed, e.g. {failures[:3]}"
    decided = [e["message"] for e in await client.events(Model, "down")
               if e["reason"] == "ScaledDown" and "->" in e["message"]]     # the autoscaler's, not the deletes
    assert decided and decided[-1].endswith("-> 1"), decided
