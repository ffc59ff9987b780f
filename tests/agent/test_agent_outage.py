"""The server goes away and comes back: engines keep running, and the agent sends each
shard's latest status once, with no duplicate writes (counted in etcd's history)."""
from __future__ import annotations

import os
import signal

from llmgw.agent.process import is_alive, start_time
from llmgw.api import Shard
from llmgw.store import keys
from tests.agent.test_agent_e2e import AgentProcess, kill_recorded_engines, shard_in, sim_shard, wait_for
from tests.fixtures.cluster import api_server, ca_dir  # noqa: F401


async def status_writes(store, node: str, name: str, after: int, until: int) -> int:
    """How many times etcd saw shard `name`'s status key written in revisions (after, until]."""
    prefix = keys.kind_prefix(keys.STATUS, "shards", node)
    key = keys.object_key(keys.STATUS, "shards", name, node)
    count = 0
    async for ev in store.kv.watch(prefix, after + 1):
        if ev.revision > until:
            break
        if ev.key == key:
            count += 1
        if ev.revision == until:
            break
    return count


async def test_server_outage_keeps_engines_and_sends_the_latest_status_once(api_server, store, tmp_path):
    agent = AgentProcess(api_server, "out-1", tmp_path / "out-1")
    agent.dir.mkdir(parents=True)
    agent.start()
    pids = []
    try:
        async with api_server.client() as c:
            for gpu, name in enumerate(("out-1-a", "out-1-b")):  # a GPU each: the agent never shares one
                await c.create(sim_shard(name, "out-1", gpus=(gpu,)))
            a = await shard_in(c, "out-1-a", agent, "Ready", "Failed")
            b = await shard_in(c, "out-1-b", agent, "Ready", "Failed")
            assert (a.status.phase, b.status.phase) == ("Ready", "Ready")
            pids = [(s.status.pid, start_time(s.status.pid)) for s in (a, b)]
        before = max([(await store.kv.get(keys.object_key(keys.STATUS, "shards", n, "out-1")))[1]
                      for n in ("out-1-a", "out-1-b")])

        api_server.stop()
        os.kill(a.status.pid, signal.SIGKILL)
        await wait_for("the agent saw the engine die while the server was away",
                       lambda: "shard out-1-a: Ready -> Failed" in agent.log.read_text(), agent)
        assert agent.proc.poll() is None, "the agent exited while the server was away"
        assert is_alive(*pids[1]), "the other engine was stopped during the outage"

        api_server.restart()
        async with api_server.client() as c:
            a = await shard_in(c, "out-1-a", agent, "Failed")
            assert a.status.exitCode == 137
            b = await c.get(Shard, "out-1-b")
            assert (b.status.phase, b.status.pid) == ("Ready", pids[1][0])
            assert is_alive(*pids[1])
            # A sync point: once a new shard is Ready, everything before it has been sent.
            await c.create(sim_shard("out-1-c", "out-1"))
            await shard_in(c, "out-1-c", agent, "Ready")
        _, sync = await store.kv.get(keys.object_key(keys.STATUS, "shards", "out-1-c", "out-1"))
        assert await status_writes(store, "out-1", "out-1-a", before, sync) == 1
        assert await status_writes(store, "out-1", "out-1-b", before, sync) == 0
    finally:
        agent.stop()
        kill_recorded_engines(agent.state_dir)
