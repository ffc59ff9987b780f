"""A drain moves a replica whose weights are pulled: the replacement's node pulls them (from the
drained node, its peer, not from the hub again) while the original replica still serves, because
make-before-break waits for the replacement to be Ready and a pull is part of becoming Ready.
The whole stack as processes (etcd, server, controller-manager, gateway, two agents, sim engines)."""
from __future__ import annotations

import asyncio

import pytest

from llmgw.api import Model, Node, Replica, Shard, parse_object
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR
from llmgw.client import Client, ClientConfig, NotFound
from llmgw.dev.cluster import NodePlan
from llmgw.dev.process import free_port
from tests.fixtures.poll import until
from tests.fixtures.weights_origin import WeightsOrigin, cluster_with_hub, content_digest, generated

pytestmark = pytest.mark.timeout(300)
HUB_PORT = free_port()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = [NodePlan("dnode1"), NodePlan("dnode2")]
    with cluster_with_hub(tmp_path_factory.mktemp("weights-drain"), nodes, HUB_PORT) as c:
        yield c


async def record(c: Client, kind, into: list[tuple[int, str, str, str, bool, str | None]]) -> None:
    """Every change to `kind`'s objects as (revision, kind, name, phase, deleting, replacement-for)."""
    async for event, obj in c.list_and_watch(kind):
        if obj is None:
            continue
        deleting = event == "DELETED" or obj.metadata.deletionTimestamp is not None
        owner = obj.spec.replica if isinstance(obj, Shard) else obj.metadata.annotations.get(DRAINING_REPLACEMENT_FOR)
        into.append((int(obj.metadata.resourceVersion), kind.__name__, obj.name, obj.status.phase, deleting, owner))


async def test_a_drain_pulls_onto_the_replacements_node_while_the_original_serves(cluster):
    origin = await WeightsOrigin().start(HUB_PORT)
    files = generated(41, {"config.json": 500, "model.safetensors": 3_000_000})
    origin.add_repo("org/moved", files)
    digest = content_digest(files)
    changes: list[tuple[int, str, str, str, bool, str | None]] = []
    try:
        async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
            async def registered():
                return all([(await c.get(Node, n)).status.agentEndpoint for n in ("dnode1", "dnode2")])
            await until(registered, "both nodes registered", timeout=60, interval=0.3, retry=(NotFound,))
            dnode2 = await c.get(Node, "dnode2")
            dnode2.spec.unschedulable = True            # the model starts on dnode1
            await c.update(dnode2)
            await c.apply(parse_object({
                "apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "moved"},
                "spec": {"source": "hf://org/moved", "profiles": [{"engine": "sim", "gpusPerNode": 1}]}}))

            async def ready_on(node: str):
                shards, _ = await c.list(Shard)
                return [s for s in shards if s.spec.model == "moved" and s.spec.node == node
                        and s.status.phase == "Ready"]
            [first] = await until(lambda: ready_on("dnode1"), "the model Ready on dnode1", timeout=120, interval=0.3)
            # the weights once, and config.json once more: the controller-manager's estimate reads it
            # before the pull (docs/contracts.md, "Will it fit"; these random bytes are no config)
            assert origin.bytes_sent == sum(map(len, files.values())) + len(files["config.json"])

            async def replica_ready():   # its shard's Ready reaches the Replica a moment later
                return (await c.get(Replica, first.spec.replica)).status.phase == "Ready"
            # the drain starts from a serving replica: what the replay below holds it to
            await until(replica_ready, "the original replica Ready", timeout=60, interval=0.3)
            watches = [asyncio.ensure_future(record(c, k, changes)) for k in (Replica, Shard)]
            try:
                dnode2 = await c.get(Node, "dnode2")
                dnode2.spec.unschedulable = False
                await c.update(dnode2)
                dnode1 = await c.get(Node, "dnode1")
                dnode1.spec.drain = True
                await c.update(dnode1)
                await until(lambda: ready_on("dnode2"), "the replacement Ready on dnode2", timeout=120, interval=0.3)

                async def original_gone():
                    replicas, _ = await c.list(Replica)
                    return first.spec.replica not in {r.name for r in replicas}
                await until(original_gone, "the original replica deleted", timeout=120, interval=0.3)
            finally:
                for w in watches:
                    w.cancel()
            node2 = await c.get(Node, "dnode2")
            assert node2.status.weights is not None and [m.digest for m in node2.status.weights.models] == [digest]
            await c.delete(Model, "moved")
    finally:
        await origin.stop()
    # The replacement's node took the weights from dnode1, not from the hub (nor was config.json
    # read again for an estimate: one read per Model spec).
    assert origin.bytes_sent == sum(map(len, files.values())) + len(files["config.json"])
    # Replayed in revision order: whenever the replacement's shard reported Pulling, the original
    # replica was Ready and not being deleted.
    original = first.spec.replica
    state: dict[str, tuple[str, bool]] = {}
    pulling_seen = 0
    for _, kind, name, phase, deleting, owner in sorted(changes):
        if kind == "Replica":
            state[name] = (phase, deleting)
        elif phase == "Pulling" and owner != original and owner in state:
            pulling_seen += 1
            assert state[original] == ("Ready", False), (name, state)
    assert pulling_seen, changes
