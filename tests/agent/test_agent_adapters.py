"""One engine's adapters (llmgw/agent/adapters.py) against a sim serving vLLM's runtime LoRA API:
an engine started again is given what it held before first."""
from __future__ import annotations

import asyncio

import aiohttp

from llmgw.agent.adapters import AdapterBook, AdapterCounts, EngineAdapters
from llmgw.api import LoraAdapter, Shard, ShardAdapter
from llmgw.dev.process import free_port
from llmgw.engines.engine import LoraApi
from tests.sim.test_sim import HOST, ready, sims  # noqa: F401 - sims is a fixture
from tests.sim.test_sim_lora import post

SHARD = Shard.model_validate({"metadata": {"name": "r1-0"}, "spec": {
    "replica": "r1", "model": "base", "node": "node01", "rank": 0, "worldSize": 1,
    "ports": {"serve": 1, "distInit": 2}, "headAddress": HOST, "engine": "sim", "servedModelNames": ["base"],
    "adapters": {"maxLoaded": 2}}})


def states(report: list[ShardAdapter]) -> dict[str, str]:
    return {a.name: a.state for a in report}


async def test_an_engine_started_again_is_given_what_it_held_before_where_more_are_placed_than_its_slots(
        sims, tmp_path):
    """The controller placed a third adapter on a replica of two slots (its engine full of direct
    loads it had not adopted yet): after the engine's restart the agent loads the two it held, not
    the first two by name, so that what was resident is resident again."""
    port = free_port()
    sims("--host", HOST, "--port", str(port), "--served-model-name", "base", "--enable-lora", "--max-loras", "2",
         name="r1")
    ready(port)
    book = AdapterBook()

    def placed(name: str, revision: int) -> None:
        book.apply("ADDED", LoraAdapter.model_validate({"metadata": {"name": name}, "spec": {
            "baseModel": "base", "source": str(tmp_path / name)}, "status": {"placement": ["r1"]}}), revision)
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    async with aiohttp.ClientSession() as http:
        async def session() -> aiohttp.ClientSession:
            return http

        def engine() -> EngineAdapters:
            return EngineAdapters(f"http://{HOST}:{port}", LoraApi(), book, session, None, "base", AdapterCounts())
        first = engine()
        placed("b", 1)
        placed("c", 2)
        assert states(await first.sync(SHARD, lambda staying: None)) == {"b": "Loaded", "c": "Loaded"}
        placed("a", 3)     # no free slot for it
        assert states(await first.sync(SHARD, lambda staying: None)) == {"b": "Loaded", "c": "Loaded"}

        for name in ("b", "c"):    # the engine killed and started again: it holds nothing
            assert (await asyncio.to_thread(post, port, "/v1/unload_lora_adapter", {"lora_name": name}))[0] == 200
        first.release()
        assert states(await engine().sync(SHARD, lambda staying: None)) == {"b": "Loaded", "c": "Loaded"}
