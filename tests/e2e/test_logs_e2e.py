"""`llmgw logs`: a real agent serves its sim engines' logs over mTLS, a real `llmgw server` relays
them with the caller's authorization (docs/contracts.md, "Engine logs")."""
from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from llmgw.api import Node, ObjectMeta, Shard
from llmgw.api.errors import Forbidden, NotFound, Unavailable
from llmgw.api.logs import LogQuery
from llmgw.api.wellknown import REPLICA_LABEL, shard_name
from tests.agent.test_agent_e2e import LLMGW, WAIT, agents, shard_in, sim_shard  # noqa: F401
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.ctrlkit import replica
from tests.fixtures.poll import until


async def read(client, kind, name: str, query: LogQuery | None = None, **kw) -> str:
    chunks = [c async for c in client.log(kind, name, query or LogQuery(), **kw)]
    return b"".join(chunks).decode()


async def endpoint_of(client, node: str) -> str:
    async def advertised():
        n = await client.get(Node, node)
        return n.status.agentEndpoint
    return await until(advertised, f"node {node} to advertise its log endpoint", retry=(NotFound,), timeout=WAIT)


def logs_agent(agents, node: str):
    return agents(node, "--logs-listen", "127.0.0.1:0")


async def test_a_shards_log_live_followed_to_its_crash_and_kept_as_the_previous_run(shared_api_server, agents):
    agent = logs_agent(agents, "logs-1")
    crashing = sim_shard("crashy", "logs-1")
    crashing.spec.args = ["--fail-after", "3"]
    async with shared_api_server.client() as c:
        assert (await endpoint_of(c, "logs-1")).startswith("https://127.0.0.1:")
        await c.create(crashing)
        await until(lambda: _has(c, "crashy", "sim rank 0/1"), "the live engine's first lines", timeout=WAIT,
                    retry=(NotFound,))

        # -f streams until the engine exits, and what it wrote last is in the stream
        followed = await asyncio.wait_for(read(c, Shard, "crashy", LogQuery(follow=True)), WAIT)
        assert "injected failure" in followed
        failed = await shard_in(c, "crashy", agent, "Failed")
        assert failed.status.exitCode == 3

        # after the crash the log is still there, bounded by --tail
        last = await read(c, Shard, "crashy", LogQuery(tail=1))
        assert last.count("\n") == 1 and "injected failure" in last

        # rebuilt under the same name on the node: the crashed run is the previous one
        await c.delete(Shard, "crashy")
        await until(lambda: _gone(c, "crashy"), "the failed shard to be gone", timeout=WAIT)
        await c.create(sim_shard("crashy", "logs-1"))
        await shard_in(c, "crashy", agent, "Ready")
        assert "injected failure" in await read(c, Shard, "crashy", LogQuery(previous=True))
        assert "injected failure" not in await read(c, Shard, "crashy")


async def _has(c, name: str, text: str) -> bool:
    return text in await read(c, Shard, name)


async def _gone(c, name: str) -> bool:
    try:
        await c.get(Shard, name)
    except NotFound:
        return True
    return False


async def test_a_replicas_log_by_rank_through_the_cli(shared_api_server, agents, tmp_path):
    agent = logs_agent(agents, "logs-2")
    rep = replica("logs-rep", "m", placement=[{"rank": 0, "node": "logs-2", "gpus": [0]}])
    shard = sim_shard(shard_name("logs-rep", 0), "logs-2")
    shard.metadata = ObjectMeta(name=shard.name, labels={REPLICA_LABEL: "logs-rep"})
    shard.spec.replica = "logs-rep"
    async with shared_api_server.client() as c:
        await c.create(rep)
        await c.create(shard)
        await shard_in(c, shard.name, agent, "Ready")
    cert, key = shared_api_server.admin
    flags = ["--server", shared_api_server.url, "--ca", shared_api_server.ca, "--cert", cert, "--key", key]
    out = await asyncio.to_thread(subprocess.run, [str(LLMGW), "logs", "logs-rep", "--tail", "5", *flags],
                                  capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    assert "sim rank 0/1" in out.stdout
    bad = await asyncio.to_thread(subprocess.run, [str(LLMGW), "logs", "replica/logs-rep", "--rank", "3", *flags],
                                  capture_output=True, text=True, timeout=WAIT)
    assert bad.returncode == 1 and "no shard of rank 3" in bad.stderr


async def test_only_admins_and_the_shards_own_node_read_it(shared_api_server, agents):
    agent = logs_agent(agents, "logs-3")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("mine", "logs-3"))
        await shard_in(c, "mine", agent, "Ready")
        endpoint = await endpoint_of(c, "logs-3")
    async with shared_api_server.client(shared_api_server.issue_node("logs-3")) as own:
        assert "sim rank 0/1" in await read(own, Shard, "mine")
    async with shared_api_server.client(shared_api_server.issue_node("logs-other")) as other:
        with pytest.raises(Forbidden, match="node-logs"):
            await read(other, Shard, "mine")
    async with shared_api_server.client(shared_api_server.issue_component("gateway")) as gateway:
        with pytest.raises(Forbidden, match="rule logs"):
            await read(gateway, Shard, "mine")
    shared_api_server.wait_for_log("refused: certificate CN=logs-other asked for the log of shards/mine")

    # the agent itself answers the API server alone: another node's certificate, or an admin's, is refused
    for identity in (shared_api_server.issue_node("logs-other"), shared_api_server.admin):
        code, text = await asyncio.to_thread(_direct, endpoint + "/shards/mine/log", shared_api_server.ca, identity)
        assert code == 403 and "only the API server" in text


def _direct(url: str, ca: str, identity: tuple[str, str]) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    ctx.load_cert_chain(*identity)
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=WAIT) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def test_the_server_trusts_an_agent_by_its_nodes_name_not_its_address(shared_api_server, agents):
    agent = logs_agent(agents, "logs-4")
    async with shared_api_server.client() as c:
        endpoint = await endpoint_of(c, "logs-4")
        await c.create(Node(metadata=ObjectMeta(name="logs-impostor")))
        await c.patch_status(Node, "logs-impostor", {"agentEndpoint": endpoint})   # logs-4's agent, not its
        await c.create(sim_shard("elsewhere", "logs-impostor"))
        with pytest.raises(Unavailable, match="is not the agent of node logs-impostor: .*CN=logs-4"):
            await read(c, Shard, "elsewhere")
        await c.create(Node(metadata=ObjectMeta(name="logs-silent")))
        await c.create(sim_shard("unserved", "logs-silent"))
        with pytest.raises(Unavailable, match="serves no engine logs"):
            await read(c, Shard, "unserved")
    assert agent.proc.poll() is None, json.dumps(agent.tail())
