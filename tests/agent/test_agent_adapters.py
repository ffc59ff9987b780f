"""An engine's adapter loads (llmgw/agent/adapters.py) against a sim serving vLLM's runtime LoRA
API: a sync starts its loads and does not wait for them, so the next placement's load starts while
the first is in flight; each load wakes a sync as it lands (`landed`), which reports what the
engine then lists; a failed load is reported, and not retried by that sync, nor forgotten while
it waits for a slot; loads never go past the slots, one in flight holding one."""
from __future__ import annotations

import aiohttp

from llmgw.agent.adapters import AdapterBook, AdapterCounts, EngineAdapters
from llmgw.api import AdapterSlots, LoraAdapter, ShardAdapter
from llmgw.dev.process import free_port
from llmgw.engines.engine import LoraApi
from tests.fixtures.poll import until
from tests.sim.test_sim import HOST, ready, sims  # noqa: F401 - sims is a fixture
from tests.sim.test_sim_lora import _shard


def place(book: AdapterBook, name: str, source: str, revision: int) -> None:
    book.apply("ADDED", LoraAdapter.model_validate({"metadata": {"name": name}, "spec": {
        "baseModel": "m", "source": source, "minReplicas": 0}, "status": {"placement": ["m-1"]}}), revision)


def loaded(*names: str) -> list[ShardAdapter]:
    return [ShardAdapter(name=n, state="Loaded") for n in names]


async def test_loads_go_beside_the_syncs_and_each_is_reported_as_it_lands(sims, tmp_path):
    port = free_port()
    sims("--host", HOST, "--port", str(port), "--served-model-name", "m", "--enable-lora", "--max-loras", "3",
         "--lora-load-seconds", "2")
    ready(port)
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    shard = _shard("sim", AdapterSlots(maxLoaded=3))
    book, landed = AdapterBook(), []
    async with aiohttp.ClientSession() as http:
        async def session() -> aiohttp.ClientSession:
            return http
        engine = EngineAdapters(f"http://{HOST}:{port}", LoraApi(), book, session, None, "m", AdapterCounts(),
                                lambda entry, seen: landed.append((entry, seen)))

        async def sync() -> list[ShardAdapter]:
            return await engine.sync(shard, lambda staying: None)

        place(book, "a", str(tmp_path / "a"), 1)
        assert await sync() == [] and landed == [], "a sync does not wait for its load"
        place(book, "b", str(tmp_path / "b"), 2)
        assert await sync() == [] and landed == [], "b's load starts while a's is in flight, a's not again"
        await until(lambda: len(landed) == 2, "both loads to land", timeout=30)
        assert sorted((e.name, seen) for e, seen in landed if e) == [("a", 1), ("b", 2)], \
            "each landed load is told loaded, with the placements seen when it was started"
        assert await sync() == loaded("a", "b")

        place(book, "bad", str(tmp_path / "missing"), 3)
        place(book, "c", str(tmp_path / "c"), 4)
        assert await sync() == loaded("a", "b"), "c waits: bad's load holds the last slot"
        await until(lambda: len(landed) == 3, "bad's load to fail", timeout=30)
        assert landed[2] == (None, 4), "a failed load is told as such"
        [failed] = (await sync())[2:]       # reported, not retried at once: c takes the slot
        assert (failed.name, failed.state) == ("bad", "Failed") and "No adapter found" in failed.message
        await until(lambda: len(landed) == 4, "c's load to land", timeout=30)
        assert await sync() == [*loaded("a", "b", "c"), failed], "still reported while it waits for a slot"
