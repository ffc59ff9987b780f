"""The version skew policy at a real server: an agent, a gateway or a controller-manager whose
X-Llmgw-Version is outside it is refused (403 VersionSkew) naming both versions; within it, it works."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from llmgw.agent.registration import Registration
from llmgw.api import Node, NodeStatus, parse_object
from llmgw.client import VersionSkew
from llmgw.store import Store
from llmgw.version import HEADERLESS, release, version
from tests.fixtures.cluster import admin_cli_config, ca_dir, llmgw, shared_api_server, start_api_server  # noqa: F401

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
    assert out.output.endswith(f"gateway skew-gw-b: {SERVERS}\ncontroller-manager skew-cm: {SERVERS}\n")


def claiming(tmp_path, claimed: str) -> list[str]:
    """`llmgw` whose installed version reads `claimed`: a package's metadata of that version first on
    its path (llmgw.version reads the installed package's; -P: not the checkout's, first otherwise)."""
    dist = tmp_path / f"llmgw-{claimed}" / f"llmgw-{claimed}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: llmgw\nVersion: {claimed}\n")
    return ["env", f"PYTHONPATH={dist.parent}", sys.executable, "-P", "-m", "llmgw.cli.main"]


def test_an_agent_outside_the_policy_exits_with_one_line_naming_both_versions(srv, tmp_path):
    cert, key = srv.issue_node("skew-n2")
    done = subprocess.run([*claiming(tmp_path, NEWER), "agent", "--node", "skew-n2", "--server", srv.url,
                           "--ca", srv.ca, "--cert", cert, "--key", key, "--nvidia-smi", str(tmp_path / "no-smi"),
                           "--ib-root", str(tmp_path), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (f"Error: version skew: agent version {NEWER} is newer than the server's: "
                                            f"upgrade the servers first (server version {SERVERS}; see "
                                            "docs/contracts.md, Version skew)"), done.stderr


def test_an_agent_sending_no_version_is_taken_for_0_1_0(ca_dir, etcd, tmp_path):
    """0.1.0's agents send no X-Llmgw-Version: registered by 0.2.0's servers (two minors), refused by 0.4.0's."""
    later = "0.4.0"
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path, command=claiming(tmp_path, later))
    try:
        code, answer = server.send(server.issue_node("n1"), "GET", "/nodes/n1")   # no header
        assert code == 403 and answer["reason"] == "VersionSkew", answer
        assert f"agent version {HEADERLESS} is more than 2 minor versions older than the server's" in answer["message"]
        assert f"server version {later}" in answer["message"]
    finally:
        server.stop()
