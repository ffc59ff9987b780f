"""The whole stack (etcd, server, controller-manager, gateway, an agent, sim engines as processes)
with a Model whose weights are on a hub: applied, pulled by a node that had nothing, Ready, served."""
from __future__ import annotations

import asyncio
import os
import subprocess

import aiohttp
import pytest

from llmgw.api import Model, Node, Replica, Shard, parse_object
from llmgw.client import Client, ClientConfig, NotFound
from llmgw.dev.cluster import NodePlan
from llmgw.dev.process import LLMGW, free_port
from llmgw.printers.weights import short
from tests.fixtures.poll import until
from tests.fixtures.weights_origin import WeightsOrigin, cluster_with_hub, content_digest, generated

pytestmark = pytest.mark.timeout(300)
HUB_PORT = free_port()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cluster_with_hub(tmp_path_factory.mktemp("weights"), [NodePlan("wnode1")], HUB_PORT) as c:
        yield c


async def test_hf_model_becomes_ready_on_a_node_that_had_nothing(cluster):
    origin = await WeightsOrigin().start(HUB_PORT)
    files = generated(21, {"config.json": 500, "model.safetensors": 2_000_000})
    origin.add_repo("org/hub-model", files)
    digest = content_digest(files)
    try:
        async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
            async def registered():
                node = await c.get(Node, "wnode1")
                return node.status.weights
            empty = await until(registered, "wnode1 registered with its cache", timeout=60, interval=0.3,
                                retry=(NotFound,))
            assert empty.models == [] and empty.freeBytes > 0
            await c.apply(parse_object({
                "apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "hub-model"},
                "spec": {"source": "hf://org/hub-model", "digest": digest,
                         "profiles": [{"engine": "sim", "gpusPerNode": 1}]}}))

            async def ready():
                items, _ = await c.list(Replica)
                return [r for r in items if r.spec.model == "hub-model" and r.status.phase == "Ready"]
            await until(ready, "the hub model's replica Ready", timeout=120, interval=0.3)
            shards, _ = await c.list(Shard)
            [shard] = [s for s in shards if s.spec.model == "hub-model"]
            assert shard.status.pull is not None and shard.status.pull.digest == digest

            async def cached():
                n = await c.get(Node, "wnode1")
                return n.status.weights is not None and [m.digest for m in n.status.weights.models] == [digest]
            await until(cached, "wnode1 lists the digest", timeout=30, interval=0.3)
            shown = await asyncio.to_thread(
                subprocess.run, [*LLMGW, "ctl", "weights"], capture_output=True, text=True,
                env={**os.environ, "LLMGW_CONFIG": str(cluster.admin_config)})
            assert shown.returncode == 0, shown.stderr
            header, row = shown.stdout.splitlines()
            assert header.split() == ["NODE", "DIGEST", "SIZE", "MODELS", "SHARDS", "FREE", "CAPACITY"]
            assert row.split()[:5] == ["wnode1", short(digest), "1Mi", "hub-model", "1"], shown.stdout

            async def served():
                body = {"model": "hub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
                async with aiohttp.ClientSession() as http, \
                        http.post(f"{cluster.gateway_url}/v1/chat/completions", json=body) as r:
                    return r.status == 200
            await until(served, "the gateway serves hub-model", timeout=60, interval=0.3)
            await c.delete(Model, "hub-model")
    finally:
        await origin.stop()
    assert origin.requests("GET", "/api/models/org/hub-model/revision/main")
