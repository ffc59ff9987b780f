"""An adapter unloaded under the gateway (docs/gateway.md, "LoRA adapters"): the engine's 404 for a
request the gateway routed by an Adapter status it had not yet seen change is not the caller's. A
cold adapter loaded directly in the place of the victim the segmented LRU picks."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from llmgw.api import AdapterSlots, Placement
from llmgw.dev.process import free_port
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.loads import DirectLoads
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import lora, model, replica, running_gateway
from tests.fixtures.poll import until
from tests.sim.test_sim import HOST, ready, sims  # noqa: F401 - sims is a fixture
from tests.sim.test_sim_lora import post


async def test_a_404_for_an_unloaded_adapter_sends_the_request_where_it_is_loaded_next(sims, tmp_path):
    """sql's status still says r1, whose engine has unloaded it: the gateway takes r1 out of sql's
    routing on its 404, the request waits in sql's queue, and goes to r2 once sql's status says so."""
    ports = {}
    for name in ("r1", "r2"):
        ports[name] = free_port()
        sims("--host", HOST, "--port", str(ports[name]), "--served-model-name", "base", "--enable-lora",
             "--max-loras", "2", "--lora-load-seconds", "0", name=name)
    for port in ports.values():
        ready(port)
    (tmp_path / "sql").mkdir()
    assert (await asyncio.to_thread(post, ports["r2"], "/v1/load_lora_adapter",
                                    {"lora_name": "sql", "lora_path": str(tmp_path / "sql")}))[0] == 200
    table = RoutingTable()
    table.apply("models", "ADDED", model("base"))
    for name, port in ports.items():
        table.apply("replicas", "ADDED", replica(name, "base", f"{HOST}:{port}"))
    table.apply("adapters", "ADDED", lora("sql", "base", ("r1",)))
    async with running_gateway(table) as gw, aiohttp.ClientSession() as http:
        async def complete() -> tuple[int, dict]:
            async with http.post(gw.url + "/v1/completions",
                                 json={"model": "sql", "prompt": "hello", "max_tokens": 2}) as resp:
                return resp.status, await resp.json()
        answer = asyncio.ensure_future(complete())
        await until(lambda: table.backends_for("sql") == [], "r1 out of sql's routing on its 404", timeout=30)
        assert not answer.done(), "it waits in sql's queue"
        table.apply("adapters", "MODIFIED", lora("sql", "base", ("r2",)))
        code, body = await asyncio.wait_for(answer, 30)
    assert (code, body["model"]) == (200, "sql")


def full_replica(slots: int = 2, gate: asyncio.Event | None = None, keeps: bool = False
                 ) -> tuple[RoutingTable, Balancer, DirectLoads, list[tuple[str, str, dict]]]:
    """r1 of `slots` slots, holding hot (requested twice) and once (requested once since), on
    demand alone (minReplicas 0); cold known, resident nowhere. The loads' agent answers 200 (once
    `gate` is set), having unloaded the victim named (or kept it); what was asked of it is kept."""
    table = RoutingTable()
    table.apply("models", "ADDED", model("base"))
    r1 = replica("r1", "base", "127.0.0.1:1")
    r1.spec.adapters = AdapterSlots(maxLoaded=slots)
    r1.spec.placement = [Placement(rank=0, node="n1")]
    table.apply("replicas", "ADDED", r1)
    for name, resident in (("hot", ("r1",)), ("once", ("r1",)), ("cold", ()), ("next", ())):
        a = lora(name, "base", resident)
        a.spec.minReplicas = 0      # loaded on demand alone: each may go
        table.apply("adapters", "ADDED", a)
    balancer = Balancer()
    for name in ("hot", "hot", "once"):
        requested(table, balancer, name)
    asked: list[tuple[str, str, dict]] = []

    async def post(node: str, path: str, body: dict) -> tuple[int, str]:
        asked.append((node, path, body))
        if gate is not None:
            await gate.wait()
        return 200, json.dumps({"evicted": None if keeps else body["victim"]})
    return table, balancer, DirectLoads(table, balancer, post, lambda model: 0), asked


def requested(table: RoutingTable, balancer: Balancer, name: str) -> None:
    """One request for the adapter sent and answered."""
    [b] = table.backends_for(name)
    balancer.acquire(b)
    balancer.release(b)


async def test_a_cold_adapter_is_loaded_directly_in_the_place_of_the_least_recently_requested_unprotected_one():
    """r1 is full (2 slots): hot, requested twice, is protected though requested longest ago; once,
    requested once since, goes (one LRU would take hot). The agent of r1's node is asked, cold is
    routed there on its 200, and once, which it says it unloaded, no longer is."""
    table, balancer, loads, asked = full_replica()
    loads.want("cold")
    assert loads.reported() == {"cold": 1}
    await until(lambda: table.backends_for("cold"), "cold routed to r1")
    assert asked == [("n1", "/adapters/cold/load", {"replica": "r1", "digest": None, "victim": "once"})]
    assert table.backends_for("once") == [] and [b.replica for b in table.backends_for("hot")] == ["r1"]
    assert loads.reported() == {"cold": 1}     # until its status records it
    table.apply("adapters", "MODIFIED", lora("cold", "base", ("r1",)))
    assert loads.reported() == {} and [b.replica for b in table.backends_for("cold")] == ["r1"]


async def test_an_adapter_loaded_directly_may_go_once_served_before_its_status_records_it():
    """cold, loaded on r1 directly and requested once, may be the next load's victim while its
    status does not name r1 yet (under the bench's churn a status records a load 0.3-0.6 s late:
    kept till then, the adapters loaded last held the slots, and older, busier ones went); hot,
    protected, stays. The adapter controller may still adopt cold from its shard's report from
    before the unload: its status then names r1 for a moment (after one that did not), and this
    gateway, which had the agent unload it, does not route it there (requests met the engine's
    404: 2 to 5 a bench run); once its status no longer names r1 and then does again (loaded there
    again), it is routed there."""
    table, balancer, loads, asked = full_replica()
    loads.want("cold")
    await until(lambda: table.backends_for("cold"), "cold routed to r1")
    requested(table, balancer, "cold")
    loads.want("next")
    await until(lambda: table.backends_for("next"), "next routed to r1")
    assert asked[-1] == ("n1", "/adapters/next/load", {"replica": "r1", "digest": None, "victim": "cold"})
    assert table.backends_for("cold") == [] and [b.replica for b in table.backends_for("hot")] == ["r1"]

    def status(*resident: str) -> None:
        a = lora("cold", "base", resident)
        a.spec.minReplicas = 0
        table.apply("adapters", "MODIFIED", a)
    status()              # its condition, say: nowhere
    status("r1")          # the stale adoption
    assert table.backends_for("cold") == []
    status()              # the Evicted report read: dropped
    status("r1")          # loaded there again
    assert [b.replica for b in table.backends_for("cold")] == ["r1"]


async def test_a_victim_that_left_routing_and_that_the_agent_kept_is_routed_there_again():
    """r1 is full by the table (2 slots, 2 routed): once, the victim named, leaves r1's routing
    while the agent loads cold. Its engine had room after all (the table was ahead of it), so the
    agent kept once and says so: once is routed to r1 again (it was not: an adapter the engine
    held and the table no longer counted, for a minute, and the next load there found the engine
    fuller than the table said)."""
    gate = asyncio.Event()
    table, balancer, loads, asked = full_replica(gate=gate, keeps=True)
    loads.want("cold")
    await until(lambda: asked, "the agent asked")
    assert asked[0][2]["victim"] == "once" and table.backends_for("once") == []
    gate.set()
    await until(lambda: table.backends_for("cold"), "cold routed to r1")
    assert [b.replica for b in table.backends_for("once")] == ["r1"]
