"""The REST API through the client: CRUD, conflicts, apply, status, watch, relist after compaction."""
from __future__ import annotations

import asyncio
import json

import pytest

from llmgw.api import Model, Node, parse_object
from llmgw.api.limits import MAX_TTL
from llmgw.client import AlreadyExists, BadRequest, Conflict, Expired, NotFound
from llmgw.store import Compactor, Store
from tests.fixtures.cluster import api_server, ca_dir, shared_api_server  # noqa: F401

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
        with pytest.raises(BadRequest):   # refused with a Status; the stream goes on
            await n.heartbeat("hb-node", ttl=MAX_TTL + 1)
        assert await n.heartbeat("hb-node") == {"node": "hb-node", "ttl": 15}
        assert await n.heartbeat("hb-node", ttl=30) == {"node": "hb-node", "ttl": 30}
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
        with pytest.raises(BadRequest, match="gateway: 'GW_A' is not a DNS-1123 label"):   # read with the URL
            await c.report_demand("GW_A", {})
        await c.report_demand("gw-a", {"m1": {"inFlight": 4, "waiting": 1}}, ttl=5)
        # gw-b stops: its report and its keys' usage go at once, not with its lease; gw-a's stay. A
        # withdrawal of nothing is answered alike.
        usage = {"k": {"models": {"m1": {"total": {"requests": 1}}}}}
        assert (await c.report_demand("gw-b", {}, ttl=MAX_TTL, keys=usage))["gateways"] == 2
        for _ in range(2):
            assert await c.request("DELETE", "/apis/llmgw.io/v1/demand/gw-b") == {"gateway": "gw-b", "gateways": 1}
        assert await store.demand.usage() == []
        with pytest.raises(BadRequest, match="gateway: 'GW_B' is not a DNS-1123 label"):
            await c.withdraw_demand("GW_B")
    [report] = await store.demand.list()
    assert report.gateway == "gw-a" and report.models["m1"].total == 5
    async with api_server.client(gw) as c:   # the same report of the same name again: kept anew
        assert (await c.report_demand("gw-b", {}, ttl=MAX_TTL, keys=usage))["gateways"] == 2
    assert [u.gateway for u in await store.demand.usage()] == ["gw-b"]


async def test_keys_usage_is_validated_kept_beside_the_demand_and_summed(api_server, store):
    from llmgw.api.errors import Invalid, NotFound
    from llmgw.api.secrets import new_secret
    from llmgw.cli.create import build_key
    gw = api_server.issue_component("gateway")
    used = {"lastUsed": "2026-12-05T10:00:00+00:00", "models": {"m1": {"total": {"requests": 2}}}}
    async with api_server.client(gw) as c:
        with pytest.raises(Invalid) as err:
            await c.report_demand("gw-a", {}, ttl=5, keys={"k": {"models": {"m1": {"total": {"requests": -1}}}}})
        assert "keys.k.models.m1.total.requests: Input should be greater than or equal to 0" in str(err.value)
        assert await store.demand.usage() == []   # nothing of a refused report is kept
        await c.report_demand("gw-a", {}, ttl=5, keys={"k": used})
        await c.report_demand("gw-b", {}, ttl=5, keys={"k": {**used, "lastUsed": "2026-12-05T11:00:00+00:00"}})
    async with api_server.client() as admin:
        with pytest.raises(NotFound):   # no ApiKey k yet: its usage is not answered
            await admin.apikey_usage("k")
        await admin.create(build_key("k", new_secret("k"), owner="o", models=(), selector=(), expires=None,
                                     rpm=None, tpm=None, concurrency=None, priority="standard"))
        one = await admin.apikey_usage("k")
        assert one["gateways"] == 2 and one["usage"]["models"]["m1"]["total"]["requests"] == 4
        assert one["usage"]["lastUsed"].startswith("2026-12-05T11:00:00")
        assert (await admin.apikey_usage())["keys"]["k"] == one["usage"]
        with pytest.raises(NotFound, match="usage is kept for apikeys only"):
            await admin.request("GET", "/apis/llmgw.io/v1/usage/models")


NOT_A_LABEL = "is not a DNS-1123 label"


@pytest.mark.parametrize("method, path, problem", [
    ("GET", "/models/a%2Fb", f"name: 'a/b' {NOT_A_LABEL}"),
    ("GET", "/shards/n1%2Fs1", f"name: 'n1/s1' {NOT_A_LABEL}"),
    ("DELETE", "/models/Big_Model", f"name: 'Big_Model' {NOT_A_LABEL}"),
    ("PATCH", "/nodes/..%2Fspec/status", f"name: '../spec' {NOT_A_LABEL}"),
    ("POST", "/heartbeat/Node_1", f"node: 'Node_1' {NOT_A_LABEL}"),
    ("GET", "/events?kind=models&name=../spec", f"name: '../spec' {NOT_A_LABEL}"),
    ("GET", "/events?kind=pods&name=x",
     "kind: unknown kind 'pods' (known: nodes, models, replicas, shards, apikeys, gitsources, roles, "
     "rolebindings, adapters)"),
], ids=["slash", "shard-slash", "upper", "dotdot-status", "heartbeat", "events-name", "events-kind"])
def test_a_name_in_the_url_that_is_not_a_name_is_a_400(shared_api_server, method, path, problem):
    """Every object's name is a DNS-1123 label; the URL's names are read before anything else
    (and never reach a store key or a log line as they came)."""
    status, body = shared_api_server.send(shared_api_server.admin, method, path, b"{}")
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"].startswith(problem)


@pytest.mark.parametrize("method, path, status, reason", [
    ("GET", "/no/such/path", 404, "NotFound"),
    ("PATCH", "/models", 405, "MethodNotAllowed"),
])
def test_a_path_or_method_the_api_lacks_is_a_json_status(shared_api_server, method, path, status, reason):
    got, body = shared_api_server.send(shared_api_server.admin, method, path, b"{}")
    assert (got, body["kind"], body["code"], body["reason"]) == (status, "Status", status, reason)


async def test_only_a_status_patch_takes_a_merge_patch(shared_api_server):
    srv = shared_api_server
    async with srv.client() as c:
        await c.create(model("merge"))
    for n, content_type in enumerate(("application/merge-patch+json", "application/json"), start=1):
        status, body = await asyncio.to_thread(srv.send, srv.admin, "PATCH", "/models/merge/status",
                                               json.dumps({"replicas": n}).encode(), content_type)
        assert (status, body["status"]["replicas"]) == (200, n)
    async with srv.client() as c:
        whole = json.dumps((await c.get(Model, "merge")).model_dump(mode="json")).encode()
    status, body = await asyncio.to_thread(srv.send, srv.admin, "PUT", "/models/merge/status", whole,
                                           "application/merge-patch+json")
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


@pytest.mark.parametrize("field, value, problem", [
    ("name", "ev-about/x", f"name: 'ev-about/x' {NOT_A_LABEL}"),
    ("node", "../spec", f"node: '../spec' {NOT_A_LABEL}"),
    ("kind", "pods", "kind: unknown kind 'pods' (known: nodes, models, replicas, shards, apikeys, gitsources, roles, "
     "rolebindings, adapters)"),
    ("reason", {"a": 1}, "reason: must be a string"),
])
def test_an_event_is_about_an_object_by_its_kind_and_name(shared_api_server, field, value, problem):
    srv = shared_api_server
    event = {"kind": "models", "name": "ev-about", "type": "Normal", "reason": "Tested", "message": "m"}
    status, body = srv.send(srv.admin, "POST", "/events", json.dumps(event | {field: value}).encode())
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith(problem)
    status, listed = srv.send(srv.admin, "GET", "/events?kind=models&name=ev-about")
    assert (status, listed["items"]) == (200, [])


async def test_a_heartbeat_ttl_is_seconds_in_range(shared_api_server):
    srv = shared_api_server
    async with srv.client() as c:
        await c.create(Node.model_validate({"metadata": {"name": "ttl-node"}}))
    for ttl in (0, 601, "15", 1.5):
        status, body = await asyncio.to_thread(srv.send, srv.admin, "POST", "/heartbeat/ttl-node",
                                               json.dumps({"ttl": ttl}).encode())
        assert (status, body["message"]) == (
            400, f"ttl must be an integer number of seconds in 1..600, got {ttl!r}"), ttl
    async with Store(srv.etcd) as store:
        assert "ttl-node" not in await store.heartbeats.list()
