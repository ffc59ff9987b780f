"""The fleet on the leading controller-manager's /metrics, read from its cache at each scrape."""
from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from controllers.fleet import FleetCollector
from controllers.scheduler import SchedulerController
from llmgw.dev.process import free_port
from llmgw.runtime.metrics import serve
from tests.fixtures.ctrlkit import node, replica, running
from tests.fixtures.poll import until


async def samples(port: int, names: tuple[str, ...] = (),
                  prefix: str = "llmgw_fleet_") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics",
                                                   params=[("name[]", n) for n in names]) as resp:
        text = await resp.text()
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(text) for x in f.samples if x.name.startswith(prefix)}


async def test_gpus_replicas_and_nodes_as_the_leader_sees_them(store):
    await store.create(node("n1", fabric="ib-a"))
    await store.create(node("n2", gpus=4, ready=False))
    async with running(store, [SchedulerController()]) as m:
        passes = []
        m.metrics.registry.register(FleetCollector(lambda: passes.append(1) or (m.cache if m.is_leader else None)))
        port = free_port()
        site = await serve(m.metrics, m.healthy, "127.0.0.1", port)
        try:
            await store.create(replica("r1", "m", gpus=2))
            got = await until(lambda: _when(samples(port), "llmgw_fleet_replicas"),
                              "the fleet's series")
            # a scrape that names its series (name[], as Prometheus' exporters take it) gets
            # those alone, and the fleet's pass over the cache is not made for it
            passes.clear()
            named = await samples(port, ("llmgw_controller_manager_leader", "llmgw_informer_lists_total"), "llmgw_")
            assert set(named) == {("llmgw_controller_manager_leader", ()),
                                  ("llmgw_informer_lists_total", (("kind", "nodes"),)),
                                  ("llmgw_informer_lists_total", (("kind", "replicas"),)),
                                  ("llmgw_informer_lists_total", (("kind", "shards"),))}
            assert passes == []
        finally:
            await site.cleanup()
    assert got[("llmgw_fleet_gpus", (("fabric", "ib-a"), ("node", "n1")))] == 8
    assert got[("llmgw_fleet_gpus", (("fabric", ""), ("node", "n2")))] == 4
    assert got[("llmgw_fleet_gpus_allocated", (("fabric", "ib-a"), ("node", "n1")))] == 0   # no shard yet
    assert got[("llmgw_fleet_nodes", (("condition", "Ready"), ("status", "True")))] == 1
    assert got[("llmgw_fleet_nodes", (("condition", "Ready"), ("status", "False")))] == 1
    assert sum(v for (name, labels), v in got.items()
               if name == "llmgw_fleet_replicas" and ("model", "m") in labels) == 1


async def _when(scrape, name: str):
    got = await scrape
    return got if any(n == name for n, _ in got) else None
