"""etcd without a quorum (issue 33): two of a three-member etcd stopped (SIGSTOP) for 12 s under
load, in a cluster of real processes, then resumed: longer than a heartbeat key lives (5 s, the
servers' --heartbeat-ttl here) and the node grace after it (3 s) together.

While there is no quorum nothing can be written or read through etcd: the API server answers
503, agents cannot renew their heartbeats, controllers cannot act. What must hold: the gateway
keeps routing from the table it has (every request answered), nothing is judged lost when the
quorum returns (etcd's new leader renews every lease's time to live at its election, so no
heartbeat expires for the outage), and writes work again.
"""
from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from llmgw.api import Model, Node
from llmgw.client import Client, ClientConfig, Unavailable
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import free_port
from tests.fixtures.poll import until

pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]   # a 12 s outage under load, timed: alone
HEARTBEAT_TTL = 5   # s (the agents beat every 2 s): the outage outlives it, and the node grace after it
OUTAGE = 12.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("quorum"), [NodePlan("node01", "ib-a"), NodePlan("node02", "ib-a")],
                     gateway_port=free_port(), node_grace=3.0, drain_delay=1.0, lease_seconds=4.0, etcd_members=3,
                     heartbeat_ttl=HEARTBEAT_TTL)
    try:
        c.start()
        yield c
    finally:
        for m in c.etcd.members if c.etcd else ():
            if m.proc is not None and m.proc.poll() is None:
                os.kill(m.proc.pid, signal.SIGCONT)
        c.stop()


async def test_a_lost_quorum_stops_writes_not_serving_and_nothing_is_judged_lost(cluster):
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
        await c.create(Model.model_validate({"metadata": {"name": "q"}, "spec": {
            "replicas": 2, "profiles": [{"engine": "sim", "gpusPerNode": 4}]}}))

        async def ready() -> bool:
            return (await c.get(Model, "q")).status.readyReplicas == 2
        await until(ready, "both replicas Ready", timeout=120)

        outcomes: list[str] = []
        stop = asyncio.Event()

        async def load(http: aiohttp.ClientSession) -> None:
            body = {"model": "q", "prompt": "hi", "max_tokens": 2}
            while not stop.is_set():
                try:
                    async with http.post(cluster.gateway_url + "/v1/completions", json=body) as r:
                        outcomes.append("ok" if r.status == 200 else f"{r.status}: {(await r.text())[:200]}")
                except aiohttp.ClientError as err:
                    outcomes.append(repr(err))
                await asyncio.sleep(0.05)

        stopped = cluster.etcd.members[1:]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            task = asyncio.create_task(load(http))
            try:
                for m in stopped:
                    os.kill(m.proc.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(3)
                    with pytest.raises(Unavailable):      # no quorum: the API says so (503)
                        await c.get(Model, "q")
                    await asyncio.sleep(OUTAGE - 3)
                finally:
                    for m in stopped:
                        os.kill(m.proc.pid, signal.SIGCONT)
                await until(ready, "the model Ready again after the quorum returns", timeout=60)
                await asyncio.sleep(5)                    # a node grace and more, under load
            finally:
                stop.set()
                await task
        failures = [o for o in outcomes if o != "ok"]
        assert outcomes and failures == [], f"{len(failures)} of {len(outcomes)} failed, e.g. {failures[:3]}"

        for name in ("node01", "node02"):
            n = await c.get(Node, name)
            assert not any(x.type == "Evicting" and x.status == "True" for x in n.status.conditions), n.status
        events, _ = await c.list_events()
        lost = [e for e in events if e["reason"] in ("NodeLost", "ReplicaFailed")]
        assert lost == [], lost
        await c.create(Model.model_validate({"metadata": {"name": "after"}, "spec": {
            "replicas": 0, "profiles": [{"engine": "sim"}]}}))      # writes work again
