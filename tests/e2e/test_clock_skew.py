"""Clocks that disagree (issue 33): an agent ten minutes ahead and the controller-manager ten
minutes behind, under Debian's faketime (libfaketime), in a cluster of real processes.

What could be judged by a clock is judged by etcd's (heartbeats and demand reports are keys
under leases, whose time etcd keeps) or by one process's own monotonic clock (the node grace,
backoffs, windows); the timestamps a controller compares were written by itself. So nothing is
judged lost or expired: both nodes stay Ready, no eviction is started, the replicas become Ready
and answer, and a drain of the skewed node moves its replicas make-before-break. The one clock
that matters across machines is a certificate's validity: llmgw issues certificates valid from
an hour before their issue (llmgw/pki/ca.py, SKEW_ALLOWED), the skew a fresh certificate
tolerates; with five minutes, as before, this test failed at 8 minutes (nothing got Ready).
"""
from __future__ import annotations

import shutil

import aiohttp
import pytest

from llmgw.api import Model, Node, Replica, condition_true
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import free_port
from tests.fixtures.poll import until

pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]   # leases and graces timed across skewed clocks: alone
SKEW = "10m"     # within the hour a fresh certificate allows


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    faketime = shutil.which("faketime")
    assert faketime, "faketime is missing: apt-get install faketime (hack/test.sh does)"
    c = LocalCluster(tmp_path_factory.mktemp("skew"), [NodePlan("node01", "ib-a"), NodePlan("node02", "ib-a")],
                     gateway_port=free_port(), node_grace=3.0, drain_delay=1.0, lease_seconds=4.0,
                     wrap={"agent-node01": [faketime, "-f", f"+{SKEW}"],
                           "controller-manager": [faketime, "-f", f"-{SKEW}"]})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def sim(name: str, replicas: int) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": replicas, "profiles": [{"engine": "sim", "gpusPerNode": 4}]}})


async def set_spec(c: Client, name: str, **fields: bool) -> None:
    node = await c.get(Node, name)
    for field, value in fields.items():
        setattr(node.spec, field, value)
    await c.update(node)


async def test_skewed_clocks_judge_nothing_lost_and_a_drain_moves_make_before_break(cluster):
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
        # Both agents registered first (a Node is Ready once its agent's first beat is written,
        # up to a heartbeat window after it is created): else the replicas land on the other
        # node and the drain below moves nothing.
        async def registered() -> bool:
            nodes = (await c.list(Node))[0]
            return len(nodes) == 2 and all(condition_true(n.status.conditions, "Ready") for n in nodes)
        await until(registered, "both agents registered (their Nodes Ready)", timeout=60)
        await set_spec(c, "node02", unschedulable=True)     # both replicas on the skewed node
        await c.create(sim("skew", 2))                      # 4 GPUs each on 8-GPU nodes

        async def ready() -> bool:
            return (await c.get(Model, "skew")).status.readyReplicas == 2
        await until(ready, "both replicas Ready", timeout=120)
        replicas = [r for r in (await c.list(Replica))[0] if r.spec.model == "skew"]
        assert {p.node for r in replicas for p in r.spec.placement} == {"node01"}, replicas
        async with aiohttp.ClientSession() as http:
            body = {"model": "skew", "prompt": "hi", "max_tokens": 2}
            for _ in range(4):
                async with http.post(cluster.gateway_url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()

        # a drain of the node whose agent runs ahead: its replicas move, replacements first
        await set_spec(c, "node02", unschedulable=False)
        await set_spec(c, "node01", unschedulable=True, drain=True)

        async def off_node01() -> bool:
            replicas = [r for r in (await c.list(Replica))[0] if r.spec.model == "skew"]
            on = [r for r in replicas if any(p.node == "node01" for p in r.spec.placement)]
            return not on and sum(r.status.phase == "Ready" for r in replicas) == 2
        await until(off_node01, "the model's replicas off node01 and Ready", timeout=120)

        for name in ("node01", "node02"):
            n = await c.get(Node, name)
            assert condition_true(n.status.conditions, "Ready"), (name, n.status.conditions)
            assert not any(x.type == "Evicting" and x.status == "True" for x in n.status.conditions), n.status
        events = await c.list_events()
        lost = [e for e in events[0] if e["reason"] in ("NodeLost", "HeartbeatExpired", "ReplicaFailed")]
        assert lost == [], lost
