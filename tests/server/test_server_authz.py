"""Authorization by client certificate: each identity x each verb x own/other objects."""
from __future__ import annotations

import asyncio

import pytest

from llmgw.api import ApiKey, Model, Node, Replica, Shard, parse_object
from llmgw.api.secrets import hash_secret
from llmgw.client import Forbidden
from tests.fixtures.cluster import shared_api_server  # noqa: F401

V1 = "llmgw.io/v1"


def model(name):
    return parse_object({"apiVersion": V1, "kind": "Model", "metadata": {"name": name},
                         "spec": {"profiles": [{"engine": "sim"}]}})


def replica(name, model_name):
    return parse_object({"apiVersion": V1, "kind": "Replica", "metadata": {"name": name},
                         "spec": {"model": model_name, "templateHash": "abc", "profile": {"engine": "sim"}}})


def shard(name, node, replica_name, model_name):
    return parse_object({"apiVersion": V1, "kind": "Shard", "metadata": {"name": name},
                         "spec": {"replica": replica_name, "model": model_name, "node": node, "rank": 0,
                                  "worldSize": 1, "ports": {"serve": 30000, "distInit": 30001},
                                  "headAddress": "127.0.0.1", "engine": "sim", "servedModelNames": [model_name]}})


_HASH = hash_secret("llmgw_k_" + "0" * 48, n=2)   # the cheapest scrypt: only its shape matters here


def apikey(name):
    return parse_object({"apiVersion": V1, "kind": "ApiKey", "metadata": {"name": name},
                         "spec": {"owner": "team-a", "secretHash": _HASH}})


def node(name, spec=None, **metadata):
    return parse_object({"apiVersion": V1, "kind": "Node", "metadata": {"name": name, **metadata},
                         "spec": spec or {}})


@pytest.fixture(scope="module")
def cluster(shared_api_server):
    """Nodes n1 and n2, each with one shard of its own replica and model; identities for each role."""
    srv = shared_api_server

    async def setup():
        async with srv.client() as c:
            for n in ("n1", "n2"):
                await c.create(node(n))
            for i in ("1", "2"):
                await c.create(model(f"m{i}"))
                await c.create(replica(f"r{i}", f"m{i}"))
                await c.create(shard(f"s{i}", f"n{i}", f"r{i}", f"m{i}"))
            await c.create(apikey("k1"))
    asyncio.run(setup())
    srv.ids = {
        "admin": srv.admin,
        "controller-manager": srv.issue_component("controller-manager"),
        "gateway": srv.issue_component("gateway"),
        "n1": srv.issue_node("n1"),
    }
    return srv


async def _first_event(c, kind, **kw):
    async for ev in c.watch(kind, **kw):
        return ev


async def _update_node(c, name, change=lambda n: n.metadata.labels.update(zone="a")):
    n = await c.get(Node, name)
    change(n)
    return await c.update(n)


async def _put_node_status(c, name, change):
    n = await c.get(Node, name)
    change(n.status)
    return await c.update_status(n)


# (identity, action, rule that refuses it or None when allowed)
CASES = [
    # node n1: its own Node
    ("n1", lambda c: c.get(Node, "n1"), None),
    ("n1", lambda c: c.patch_status(Node, "n1", {"agentVersion": "1"}), None),
    ("n1", lambda c: _put_node_status(c, "n1", lambda s: setattr(s, "driverVersion", "550.1")), None),
    # ... but never its spec, labels, annotations or finalizers, nor the controllers' status fields
    ("n1", lambda c: _update_node(c, "n1"), "node-spec"),
    ("n1", lambda c: _update_node(c, "n1", lambda n: setattr(n.spec, "unschedulable", False)), "node-spec"),
    ("n1", lambda c: _update_node(c, "n1", lambda n: n.metadata.finalizers.append("x.io/keep")), "node-spec"),
    ("n1", lambda c: c.apply(node("n1")), "node-spec"),
    ("n1", lambda c: c.patch_status(Node, "n1", {"drain": None}), "node-status"),
    ("n1", lambda c: c.patch_status(Node, "n1", {"observedGeneration": 7, "agentVersion": "1"}), "node-status"),
    ("n1", lambda c: _put_node_status(c, "n1", lambda s: setattr(s, "observedGeneration", 9)), "node-status"),
    ("n1", lambda c: c.heartbeat("n1"), None),
    ("n1", lambda c: c.get(Node, "n2"), "node-self"),
    ("n1", lambda c: _update_node(c, "n2"), "node-self"),
    ("n1", lambda c: c.patch_status(Node, "n2", {"agentVersion": "1"}), "node-self"),
    ("n1", lambda c: c.create(node("n3")), "node-self"),
    ("n1", lambda c: c.create(node("n1", {"unschedulable": True})), "node-registration"),
    ("n1", lambda c: c.create(node("n1", finalizers=["x.io/keep"])), "node-registration"),
    ("n1", lambda c: c.create(node("n1", annotations={"a": "b"})), "node-registration"),
    ("n1", lambda c: c.list(Node), "node-list"),            # the fleet's addresses and GPUs: not a node's
    ("n1", lambda c: c.nodes_with_weights("hf://org/m"), None),   # the peers holding weights it pulls
    ("n1", lambda c: _first_event(c, Node), "node-self"),
    ("n1", lambda c: c.delete(Node, "n1"), "node-self"),
    ("n1", lambda c: c.heartbeat("n2"), "node-heartbeat"),
    # node n1: shards bound to it
    ("n1", lambda c: c.list(Shard, node="n1"), None),
    ("n1", lambda c: _first_event(c, Shard, node="n1"), None),
    ("n1", lambda c: c.get(Shard, "s1"), None),
    ("n1", lambda c: c.patch_status(Shard, "s1", {"phase": "Starting"}), None),
    ("n1", lambda c: c.list(Shard), "node-shards"),
    ("n1", lambda c: c.list(Shard, node="n2"), "node-shards"),
    ("n1", lambda c: _first_event(c, Shard), "node-shards"),
    ("n1", lambda c: _first_event(c, Shard, node="n2"), "node-shards"),
    ("n1", lambda c: c.get(Shard, "s2"), "node-shards"),
    ("n1", lambda c: c.patch_status(Shard, "s2", {"phase": "Failed"}), "node-shards"),
    ("n1", lambda c: c.create(shard("s9", "n1", "r1", "m1")), "node-shards"),
    ("n1", lambda c: c.delete(Shard, "s1"), "node-shards"),
    # events about itself and the shards bound to it (the Shard's node read from its scope's key)
    ("n1", lambda c: c.record_event(Shard, "s1", "Normal", "Started", "rank 0 up"), None),
    ("n1", lambda c: c.record_event(Shard, "s2", "Warning", "Failed", "not mine"), "node-events"),
    ("n1", lambda c: c.record_event(Node, "n2", "Normal", "Registered", "not me"), "node-events"),
    # node n1: models and replicas of its shards, nothing else
    ("n1", lambda c: c.get(Model, "m1"), None),
    ("n1", lambda c: c.get(Replica, "r1"), None),
    ("n1", lambda c: c.get(Model, "m2"), "node-shard-refs"),
    ("n1", lambda c: c.get(Replica, "r2"), "node-shard-refs"),
    ("n1", lambda c: c.list(Model), "node-shard-refs"),
    ("n1", lambda c: c.create(model("m-by-node")), "node-shard-refs"),
    ("n1", lambda c: c.patch_status(Replica, "r1", {"phase": "Ready"}), "node-shard-refs"),
    ("n1", lambda c: c.events(Model, "m1"), "node"),
    # gateway: reads models, replicas, nodes
    ("gateway", lambda c: c.list(Model), None),
    ("gateway", lambda c: c.get(Replica, "r2"), None),
    ("gateway", lambda c: c.list(Node), None),
    ("gateway", lambda c: _first_event(c, Replica), None),
    ("gateway", lambda c: c.list(Shard), "gateway-read"),
    ("gateway", lambda c: c.create(model("m-by-gw")), "gateway-read"),
    ("gateway", lambda c: c.patch_status(Replica, "r1", {"phase": "Ready"}), "gateway-read"),
    ("gateway", lambda c: c.delete(Model, "m1"), "gateway-read"),
    ("gateway", lambda c: c.heartbeat("n1"), "gateway-read"),
    # API keys: the admins' to manage; gateways read them; no one else sees them
    ("gateway", lambda c: c.list(ApiKey), None),
    ("gateway", lambda c: c.get(ApiKey, "k1"), None),
    ("gateway", lambda c: _first_event(c, ApiKey), None),
    ("gateway", lambda c: c.create(apikey("k-by-gw")), "apikeys-admin"),
    ("gateway", lambda c: c.delete(ApiKey, "k1"), "apikeys-admin"),
    ("controller-manager", lambda c: c.list(ApiKey), "apikeys-admin"),
    ("controller-manager", lambda c: c.create(apikey("k-by-cm")), "apikeys-admin"),
    ("n1", lambda c: c.get(ApiKey, "k1"), "apikeys-admin"),
    ("admin", lambda c: c.create(apikey("k-by-admin")), None),
    ("admin", lambda c: c.delete(ApiKey, "k-by-admin"), None),
    # their usage: read as the keys are
    ("admin", lambda c: c.apikey_usage("k1"), None),
    ("gateway", lambda c: c.apikey_usage(), None),
    ("controller-manager", lambda c: c.apikey_usage(), "apikeys-admin"),
    ("n1", lambda c: c.apikey_usage("k1"), "apikeys-admin"),
    # demand: reported by gateways only (an admin may too)
    ("gateway", lambda c: c.report_demand("gw-1", {"m1": {"inFlight": 3}}), None),
    ("n1", lambda c: c.report_demand("gw-1", {"m1": {"inFlight": 3}}), "gateway-demand"),
    ("controller-manager", lambda c: c.report_demand("gw-1", {}), "gateway-demand"),
    ("admin", lambda c: c.report_demand("gw-2", {}), None),
    ("n1", lambda c: c.withdraw_demand("gw-1"), "gateway-demand"),
    ("gateway", lambda c: c.withdraw_demand("gw-2"), None),   # as a report: any gateway's name
    # controller-manager and admins: everything
    ("controller-manager", lambda c: c.list(Shard), None),
    ("controller-manager", lambda c: c.create(model("m-by-cm")), None),
    ("controller-manager", lambda c: c.patch_status(Replica, "r2", {"phase": "Scheduled"}), None),
    ("controller-manager", lambda c: c.patch_status(Shard, "s2", {"phase": "Starting"}), None),
    ("controller-manager", lambda c: c.delete(Model, "m-by-cm"), None),
    ("controller-manager", lambda c: c.events(Model, "m1"), None),
    ("admin", lambda c: c.list(Shard, node="n2"), None),
    ("admin", lambda c: _update_node(c, "n2"), None),
    ("admin", lambda c: c.heartbeat("n2"), None),
    ("admin", lambda c: c.create(model("m-by-admin")), None),
    ("admin", lambda c: c.delete(Model, "m-by-admin"), None),
]


@pytest.mark.parametrize("who,action,rule", CASES, ids=[f"{w}-{i}" for i, (w, _, _) in enumerate(CASES)])
async def test_authorization_matrix(cluster, who, action, rule):
    async with cluster.client(cluster.ids[who]) as c:
        if rule is None:
            await action(c)
        else:
            with pytest.raises(Forbidden) as err:
                await action(c)
            assert err.value.code == 403
            assert f"rule {rule}:" in str(err.value)


async def test_node_sees_only_its_shards(cluster):
    async with cluster.client(cluster.ids["n1"]) as c:
        items, _ = await c.list(Shard, node="n1")
        assert [s.name for s in items] == ["s1"]
        ev = await _first_event(c, Shard, node="n1")
        assert (ev.type, ev.object.name) == ("ADDED", "s1")


async def test_cn_mismatch_is_refused_and_logged(cluster):
    n5 = cluster.issue_node("llmgw-node05")
    async with cluster.client(n5) as c:
        with pytest.raises(Forbidden):
            await c.heartbeat("llmgw-node04")
        with pytest.raises(Forbidden):
            await c.create(node("llmgw-node04"))
        await c.create(node("llmgw-node05"))  # its own is fine
    line = cluster.wait_for_log("claims node llmgw-node04")
    assert "refused: certificate CN=llmgw-node05 claims node llmgw-node04 (" in line
    assert line.endswith(": rule node-heartbeat)")


async def test_forbidden_status_body_names_the_rule(cluster):
    async with cluster.client(cluster.ids["gateway"]) as c:
        with pytest.raises(Forbidden) as err:
            await c.request("DELETE", "/apis/llmgw.io/v1/models/m1")
    assert err.value.reason == "Forbidden"
    # nothing was deleted
    async with cluster.client() as c:
        assert (await c.get(Model, "m1")).name == "m1"


async def test_node_cannot_undo_an_admins_cordon_and_each_refusal_is_logged(cluster):
    """node01 removed an admin's cordon, cleared drain, added a label and a finalizer (issue 22)."""
    async with cluster.client() as admin:
        await admin.create(node("n-cordoned", {"unschedulable": True, "drain": True}))
    ident = cluster.issue_node("n-cordoned")
    changes = {
        "cordon": lambda n: setattr(n.spec, "unschedulable", False),
        "drain": lambda n: setattr(n.spec, "drain", False),
        "label": lambda n: n.metadata.labels.update(gpu="h100"),
        "finalizer": lambda n: n.metadata.finalizers.append("x.io/keep"),
    }
    async with cluster.client(ident) as c:
        for what, change in changes.items():
            with pytest.raises(Forbidden) as err:
                await _update_node(c, "n-cordoned", change)
            assert err.value.code == 403 and "rule node-spec:" in str(err.value), what
        await c.patch_status(Node, "n-cordoned", {"agentVersion": "9"})  # its status is its own
    async with cluster.client() as admin:
        stored = await admin.get(Node, "n-cordoned")
    assert (stored.spec.unschedulable, stored.spec.drain) == (True, True)
    assert (stored.metadata.labels, stored.metadata.finalizers) == ({}, [])
    assert stored.status.agentVersion == "9"
    line = cluster.wait_for_log("update nodes/n-cordoned")
    assert "refused: certificate CN=n-cordoned O=llmgw:nodes" in line and "rule node-spec:" in line
    assert sum("update nodes/n-cordoned: forbidden by rule node-spec" in ln for ln in cluster.log_lines()) == 4


# URLs an identity may not use, and bodies that would each earn another answer (415, 413, 400,
# 422) if they were read: authorized by the URL before the body is read, each is a 403.
NOT_THEIRS = [("n1", "PATCH", "/nodes/n2/status", "node-self"), ("n1", "POST", "/models", "node-shard-refs"),
              ("gateway", "POST", "/models", "gateway-read"), ("gateway", "PUT", "/replicas/r1/status", "gateway-read"),
              ("n1", "POST", "/revocations", "revoke-admin")]
BODIES = {"text/plain": (b'{"a": 1}', "text/plain"), "merge patch": (b"{}", "application/merge-patch+json"),
          "over 1 MiB": (b"[" * (2 << 20), "application/json"), "not JSON": (b"{'a'", "application/json"),
          "invalid": (b'{"kind": "Pod"}', "application/json")}


@pytest.mark.parametrize("who, method, path, rule", NOT_THEIRS, ids=[f"{w}-{m}{p}" for w, m, p, _ in NOT_THEIRS])
@pytest.mark.parametrize("body", sorted(BODIES))
def test_a_url_the_identity_may_not_use_is_a_403_whatever_the_body(cluster, who, method, path, rule, body):
    raw, content_type = BODIES[body]
    status, answer = cluster.send(cluster.ids[who], method, path, raw, content_type)
    assert (status, answer["reason"], answer["details"]) == (403, "Forbidden", {"rule": rule})
