"""The REST API through the client: CRUD, conflicts, apply, status, watch, relist after compaction."""
from __future__ import annotations

import asyncio

import pytest

from llmgw.api import parse_object
from llmgw.api.types import Model, Node
from llmgw.client import AlreadyExists, BadRequest, Conflict, Expired, NotFound
from llmgw.store import Compactor, Store
from tests.helpers.cluster import api_server, ca_dir, shared_api_server  # noqa: F401

V1 = "llmgw.io/v1"


def model(name, replicas=1, labels=None):
    return parse_object({"apiVersion": V1, "kind": "Model", "metadata": {"name": name, "labels": labels or {}},
                         "spec": {"replicas": replicas, "profiles": [{"engine": "sim"}]}})


async def test_create_get_update_delete(shared_api_server):
    async with shared_api_server.client() as c:
        created = await c.create(model("crud"))
        assert created.metadata.generation == 1 and created.metadata.uid
        with pytest.raises(AlreadyExists):
            await c.create(model("crud"))
        got = await c.get(Model, "crud")
        got.spec.replicas = 3
        updated = await c.update(got)
        assert updated.metadata.generation == 2
        with pytest.raises(Conflict) as err:
            await c.update(got)  # got's resourceVersion is stale now
        assert err.value.code == 409 and "re-read" in str(err.value)
        await c.delete(Model, "crud")
        with pytest.raises(NotFound):
            await c.get(Model, "crud")


async def test_status_writes_leave_spec_and_generation(shared_api_server):
    async with shared_api_server.client() as c:
        m = await c.create(model("stat"))
        m.status.readyReplicas = 1
        after = await c.update_status(m)
        assert after.status.readyReplicas == 1
        patched = await c.patch_status(Model, "stat", {"replicas": 2})
        assert (patched.status.replicas, patched.status.readyReplicas) == (2, 1)
        now = await c.get(Model, "stat")
        assert now.metadata.generation == 1 and now.metadata.resourceVersion == m.metadata.resourceVersion


async def test_apply_is_idempotent_and_leaves_status(shared_api_server):
    async with shared_api_server.client() as c:
        result, first = await c.apply(model("app", labels={"team": "a"}))
        assert result == "created"
        await c.patch_status(Model, "app", {"readyReplicas": 1})
        result, same = await c.apply(model("app", labels={"team": "a"}))
        assert result == "unchanged"
        assert (same.metadata.generation, same.metadata.resourceVersion) == (1, first.metadata.resourceVersion)
        manifest = model("app", replicas=4, labels={"team": "a"})
        manifest.status.readyReplicas = 99  # status in a manifest is ignored
        result, changed = await c.apply(manifest)
        assert result == "configured" and changed.metadata.generation == 2
        stored = await c.get(Model, "app")
        assert stored.spec.replicas == 4 and stored.status.readyReplicas == 1


async def test_invalid_object_names_the_field(shared_api_server):
    async with shared_api_server.client() as c:
        bad = {"apiVersion": V1, "kind": "Model", "metadata": {"name": "bad"},
               "spec": {"profiles": [{"engine": "sim", "gpus_per_node": 2}]}}
        with pytest.raises(BadRequest) as err:
            await c.request("POST", "/apis/llmgw.io/v1/models", body=bad)
    assert err.value.code == 422 and "spec.profiles[0]: unknown field 'gpus_per_node'" in str(err.value)


async def test_list_by_label_selector(shared_api_server):
    async with shared_api_server.client() as c:
        await c.create(model("sel-a", labels={"tier": "gold"}))
        await c.create(model("sel-b", labels={"tier": "silver"}))
        items, rv = await c.list(Model, selector="tier=gold")
        assert [m.name for m in items] == ["sel-a"] and rv > 0
        with pytest.raises(BadRequest):
            await c.list(Model, selector="=x")


async def test_watch_resumes_from_a_resource_version(shared_api_server):
    async with shared_api_server.client() as c:
        await c.create(model("w-before"))
        _, rv = await c.list(Model)
        await c.create(model("w-after"))
        await c.patch_status(Model, "w-after", {"replicas": 1})
        events = []
        async for ev in c.watch(Model, resource_version=rv):
            events.append((ev.type, ev.object.name, ev.object.status.replicas))
            if len(events) == 2:
                break
        assert events == [("ADDED", "w-after", 0), ("MODIFIED", "w-after", 1)]
        # resuming from the first event's revision yields only what came after it
        async for ev in c.watch(Model, resource_version=rv + 1):
            assert (ev.type, ev.object.name) == ("MODIFIED", "w-after")
            break


async def test_watch_of_a_compacted_revision_says_expired(shared_api_server):
    async with shared_api_server.client() as c, Store(shared_api_server.etcd) as store:
        _, rv = await c.list(Model)
        for i in range(3):
            await c.create(model(f"comp-{i}"))
        await Compactor(store.etcd, keep=1).compact()
        with pytest.raises(Expired) as err:
            async for _ in c.watch(Model, resource_version=rv):
                pass
        assert err.value.code == 410


async def test_heartbeat_and_events(shared_api_server):
    srv = shared_api_server
    node_ident = srv.issue_node("hb-node")
    async with srv.client(node_ident) as n, Store(srv.etcd) as store:
        with pytest.raises(NotFound):   # a heartbeat is of a registered Node: nothing is stored before
            await n.heartbeat("hb-node", ttl=30)
        assert "hb-node" not in await store.heartbeats.list()
        await n.create(Node.model_validate({"metadata": {"name": "hb-node"}}))
        assert await n.heartbeat("hb-node", ttl=30) == {"node": "hb-node", "ttl": 30}
        assert "hb-node" in await store.heartbeats.list()
        await n.record_event(Node, "hb-node", "Normal", "Registered", "agent started")
    async with srv.client() as admin:
        events = await admin.events(Node, "hb-node")
        assert [(e["reason"], e["message"]) for e in events] == [("Registered", "agent started")]


async def test_informer_relists_after_compaction_with_synthetic_deletes(api_server, store):
    """The server goes away; meanwhile an object is deleted and history compacted; the informer
    re-watches, is told 410, relists, and reports the deletion it never saw as an event."""
    async with api_server.client() as c:
        await c.create(model("keep"))
        await c.create(model("gone"))
        seen: asyncio.Queue = asyncio.Queue()

        async def informer():
            async for type_, obj in c.list_and_watch(Model, synced=True):
                await seen.put((type_, obj.name if obj else None))

        task = asyncio.create_task(informer())
        try:
            first = {await seen.get(), await seen.get(), await seen.get()}
            assert first == {("ADDED", "keep"), ("ADDED", "gone"), ("SYNCED", None)}
            await c.create(model("live"))
            assert await seen.get() == ("ADDED", "live")
            await asyncio.to_thread(api_server.stop)
            await store.delete(Model, "gone")
            await store.create(model("new"))
            await store.create(model("new2"))
            await Compactor(store.etcd, keep=1).compact()  # past the deletion: a watch from before it gets 410
            await asyncio.to_thread(api_server.restart)
            after = []
            while ("SYNCED", None) not in after:
                after.append(await asyncio.wait_for(seen.get(), 20))
            assert set(after) == {("DELETED", "gone"), ("ADDED", "new"), ("ADDED", "new2"), ("SYNCED", None)}
        finally:
            task.cancel()


async def test_a_demand_report_is_validated_with_paths_and_kept_under_a_lease(api_server, store):
    from llmgw.api.errors import Invalid
    gw = api_server.issue_component("gateway")
    async with api_server.client(gw) as c:
        with pytest.raises(Invalid) as err:
            await c.report_demand("gw-a", {"m1": {"inFlight": -1, "queued": 2}}, ttl=5)
        assert str(err.value).endswith("models.m1.inFlight: Input should be greater than or equal to 0; "
                                       "models.m1: unknown field 'queued'"), str(err.value)
        with pytest.raises(Invalid, match="gateway: 'GW_A' is not a DNS-1123 label"):
            await c.report_demand("GW_A", {})
        await c.report_demand("gw-a", {"m1": {"inFlight": 4, "waiting": 1}}, ttl=5)
    [report] = await store.demand.list()
    assert report.gateway == "gw-a" and report.models["m1"].total == 5
