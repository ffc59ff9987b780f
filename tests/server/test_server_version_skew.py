"""The version skew policy at a real server: an agent, a gateway or a controller-manager whose
X-Llmgw-Version is outside it is refused (403 VersionSkew) naming both versions; within it, it works."""
from __future__ import annotations

import asyncio

import pytest

from llmgw.agent.registration import Registration
from llmgw.api import Node, NodeStatus, parse_object
from llmgw.api.members import Member
from llmgw.client import VersionSkew
from llmgw.dev.apiserver import start_api_server
from llmgw.store import Store
from llmgw.store.keys import member_key
from llmgw.version import release, version
from tests.fixtures.cluster import admin_cli_config, llmgw, shared_api_server  # noqa: F401

SERVERS = version()
MAJOR, MINOR = release(SERVERS) or (0, 0)
NEWER = f"{MAJOR}.{MINOR + 1}.0"


@pytest.fixture(scope="module")
def srv(shared_api_server):
    async def setup():
        async with shared_api_server.client() as c:
            await c.create(parse_object({"apiVersion": "llmgw.io/v1", "kind": "Node",
                                         "metadata": {"name": "skew-n1"}, "spec": {}}))
    asyncio.run(setup())
    return shared_api_server


async def _register(srv, claimed):
    async with srv.client(srv.issue_node("skew-n1"), version=claimed) as c:
        await Registration(c, "skew-n1").register(NodeStatus(agentVersion=claimed))
        return await c.get(Node, "skew-n1")


@pytest.mark.parametrize("claimed,why", [(NEWER, "is newer than the server's"), ("fake", "is no release's version")])
def test_an_agent_outside_the_policy_is_refused_at_registration(srv, claimed, why):
    with pytest.raises(VersionSkew) as refused:
        asyncio.run(_register(srv, claimed))
    assert refused.value.code == 403 and refused.value.reason == "VersionSkew"
    assert f"agent version {claimed} {why}" in str(refused.value) and f"server version {SERVERS}" in str(refused.value)


@pytest.mark.parametrize("claimed", [SERVERS, f"{MAJOR}.{max(MINOR - 2, 0)}.0"])
def test_an_agent_within_the_policy_registers(srv, claimed):
    node = asyncio.run(_register(srv, claimed))
    assert node.status.agentVersion == claimed


def test_a_gateway_and_a_controller_manager_newer_than_the_server_are_refused(srv):
    async def main():
        for component in ("gateway", "controller-manager"):
            async with srv.client(srv.issue_component(component), version=NEWER) as c:
                with pytest.raises(VersionSkew, match=f"{component} version {NEWER} is newer"):
                    await c.list(Node)
            async with srv.client(srv.issue_component(component)) as c:   # this llmgw's own version
                assert [n for n in (await c.list(Node))[0] if n.name == "skew-n1"]
    asyncio.run(main())


def test_a_user_is_not_held_to_the_policy(srv):
    async def main():
        async with srv.client(version=NEWER) as c:
            return await c.get(Node, "skew-n1")
    assert asyncio.run(main()).name == "skew-n1"


def test_llmgw_version_cluster_shows_each_servers_and_gateways_version(srv, config):
    async def report(name, claimed):
        async with srv.client(srv.issue_component("gateway"), version=claimed) as c:
            await c.report_demand(name, {}, ttl=60)
    older = f"{MAJOR}.{max(MINOR - 1, 0)}.3"
    async def lead():
        async with Store(srv.etcd) as store:
            return await store.election.campaign("controller-manager", "skew-cm", ttl=60)
    asyncio.run(report("skew-gw-b", SERVERS))
    asyncio.run(report("skew-gw-a", older))
    out = llmgw(config, "version", "--cluster")
    assert out.exit_code == 0, out.output
    assert out.output == (f"llmgw {SERVERS}\nserver {srv.url}: {SERVERS}\n"
                          f"gateway skew-gw-a: {older}\ngateway skew-gw-b: {SERVERS}\n")
    assert asyncio.run(lead()) is not None   # the controller-manager leading: its version under its leader key
    out = llmgw(config, "version", "--cluster")
    assert out.output.endswith(f"gateway skew-gw-b: {SERVERS}\ncontroller-manager skew-cm (leader): {SERVERS}\n")


def test_a_server_more_than_one_minor_from_a_live_server_refuses_to_start(srv, config, tmp_path):
    far, near = f"{MAJOR}.{MINOR + 2}.0", f"{MAJOR}.{MINOR + 1}.0"

    async def announce(name, claimed):   # a live server, as its announcement under its lease says
        async with Store(srv.etcd) as store:
            lease = await store.leases.grant(60)
            member = Member(name=name, version=claimed)
            await store.kv.put(member_key("server", name), member.model_dump_json().encode(), lease=lease)
            return lease

    async def revoke(lease):
        async with Store(srv.etcd) as store:
            await store.leases.revoke(lease)
    lease = asyncio.run(announce("far-server:7443", far))
    try:
        with pytest.raises(RuntimeError, match=f"version skew: server version {SERVERS} is more than one minor "
                                               f"version from server far-server:7443's {far}"):
            start_api_server(srv.pki.dir, srv.etcd, tmp_path)
    finally:
        asyncio.run(revoke(lease))
    lease = asyncio.run(announce("near-server:7443", near))   # one minor apart: both run, both are shown
    try:
        out = llmgw(config, "version", "--cluster")
        assert f"server {srv.url}: {SERVERS}\nserver near-server:7443: {near}\n" in out.output
    finally:
        asyncio.run(revoke(lease))
