"""The agent's /metrics: its shards by phase, and its engines' own series joined to the fleet.

A real agent runs a real sim engine for a shard; one scrape of the agent shows the sim's
`vllm:*` series with the shard's model, replica, node, rank and engine added, and the
engine's own `model_name` label kept. When the engine is gone, its series go with it.
"""
from __future__ import annotations

import os
import signal

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.metrics import EngineTarget, join
from llmgw.dev.process import free_port
from tests.agent.test_agent_e2e import agents, shard_in, sim_shard  # noqa: F401
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.poll import until


async def scrape(port: int) -> dict[str, list]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


async def test_one_scrape_of_the_agent_sees_its_engines_labelled(shared_api_server, agents):
    port = free_port()
    agent = agents("met-1", "--metrics-listen", f"127.0.0.1:{port}")
    async with shared_api_server.client() as c:
        shard = sim_shard("met-1-a", "met-1")
        await c.create(shard)
        ready = await shard_in(c, "met-1-a", agent, "Ready", "Failed")
        assert ready.status.phase == "Ready", ready.status

        families = await until(lambda: _with(scrape(port), "vllm:num_requests_running"),
                               "the sim's series at the agent", retry=(aiohttp.ClientError,))
        [sample] = families["vllm:num_requests_running"]
        assert sample.labels == {"model": "m", "replica": "met-1-a-r", "node": "met-1", "rank": "0",
                                 "engine": "sim", "model_name": "m"}   # the engine's own label kept
        assert [s.value for s in families["llmgw_agent_shards"] if s.labels == {"phase": "Ready"}] == [1.0]

        os.kill(ready.status.pid, signal.SIGKILL)   # the engine goes: so do its series
        await shard_in(c, "met-1-a", agent, "Failed")
        after = await scrape(port)
        assert "vllm:num_requests_running" not in after
        assert [s.value for s in after["llmgw_agent_shards"] if s.labels == {"phase": "Failed"}] == [1.0]


def test_an_engines_label_of_a_joined_name_is_kept_renamed():
    target = EngineTarget("http://127.0.0.1:1/metrics", {"model": "m", "replica": "r", "node": "n", "rank": "0",
                                                          "engine": "vllm"})
    text = ('# HELP tokens_total Tokens.\n# TYPE tokens_total counter\n'
            'tokens_total{model="/models/llama",rank="3"} 7.0\n')
    [family] = join([(target, text)])
    [sample] = family.samples
    assert sample.labels == {"model": "m", "replica": "r", "node": "n", "rank": "0", "engine": "vllm",
                             "engine_model": "/models/llama", "engine_rank": "3"}
    assert sample.value == 7.0


async def _with(families, name: str):
    got = await families
    return got if name in got else None
