"""The agent and the ports and GPUs its engines use: a returning agent stops what it must before
starting anything on the same GPUs or ports; a probe answered by another process is no Ready;
a port held by a foreign process fails the shard with PortInUse and shows in foreignPorts.

Real `llmgw agent` processes against a real server (tests/agent/test_agent_e2e.py's fixtures).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket

from aiohttp import web

from llmgw.agent import ports
from llmgw.agent.process import is_alive, start_time
from llmgw.api import Node, Shard, get_condition
from llmgw.dev.process import free_port, freeze
from tests.agent.test_agent_e2e import agents, shard_in, sim_shard, wait_for  # noqa: F401
from tests.fixtures.cluster import shared_api_server  # noqa: F401


@contextlib.contextmanager
def _listening(host: str, port: int):
    with socket.socket() as s:
        s.bind((host, port))
        s.listen()
        yield s


def serving_pids(port: int) -> set[int | None]:
    return {h.pid for h in ports.holders({port}, []).get(port, [])}


async def test_returning_agent_stops_the_old_engine_before_starting_a_new_one_on_its_port(
        shared_api_server, agents):
    """The agent is stopped (SIGSTOP) while its shard is released without it and a new shard is
    given the same GPU and port; when it resumes, the old engine (which keeps answering on the
    port for the drain delay) must be gone before the new one starts, and the new shard must
    go Ready on its own engine."""
    agent = agents("back-1", "--drain-delay", "3")
    async with shared_api_server.client() as c:
        old = await c.create(sim_shard("back-1-a", "back-1"))
        old = await shard_in(c, "back-1-a", agent, "Ready", "Failed")
        assert old.status.phase == "Ready", old.status
        old_pid, old_started = old.status.pid, start_time(old.status.pid)
        port = old.spec.ports.serve

        freeze(agent.proc)    # stopped before the deletion is sent: it must not see it
        try:
            await c.delete(Shard, "back-1-a")     # no finalizer: gone at once, as if released
            new = sim_shard("back-1-b", "back-1")
            new.spec.ports.serve = port
            await c.create(new)
        finally:
            agent.proc.send_signal(signal.SIGCONT)

        new = await shard_in(c, "back-1-b", agent, "Ready", "Failed")
        assert new.status.phase == "Ready", new.status
        assert not is_alive(old_pid, old_started), "the old engine still runs"
        assert serving_pids(port) == {new.status.pid}, "Ready on a port the new engine does not hold"
        log = (agent.state_dir / "logs" / "back-1-b" / "sim.log").read_text()
        assert "cannot bind" not in log, log


async def test_restarted_agent_stops_an_engine_being_deleted_before_starting_one_on_its_port(
        shared_api_server, agents):
    """The agent restarts while its shard is being deleted and a new shard has its GPU and port:
    it adopts the old engine, stops it (which takes the drain delay) and only then starts the
    new one."""
    agent = agents("restart-1", "--drain-delay", "3")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("restart-1-a", "restart-1", finalizers=["test/keep"]))
        old = await shard_in(c, "restart-1-a", agent, "Ready", "Failed")
        assert old.status.phase == "Ready", old.status
        old_pid, old_started = old.status.pid, start_time(old.status.pid)
        port = old.spec.ports.serve

        agent.stop()
        await c.delete(Shard, "restart-1-a")       # kept by its finalizer, deletionTimestamp set
        new = sim_shard("restart-1-b", "restart-1")
        new.spec.ports.serve = port
        await c.create(new)
        agent.start()

        stopped = await shard_in(c, "restart-1-a", agent, "Stopped")
        assert stopped.status.message == "engine stopped"
        new = await shard_in(c, "restart-1-b", agent, "Ready", "Failed")
        assert new.status.phase == "Ready", new.status
        assert not is_alive(old_pid, old_started)
        assert serving_pids(port) == {new.status.pid}
        assert new.status.startedAt >= stopped.status.phaseTime, "the new engine started before the old one stopped"


async def test_a_probe_answered_by_another_process_is_not_ready(shared_api_server, agents, tmp_path):
    """An engine that never listens, and a stranger answering 200 on its port: no Ready."""
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexec sleep 600\n")
    exe.chmod(0o755)
    weights = tmp_path / "models" / "m"
    weights.mkdir(parents=True)
    agent = agents("probe-1", "--engine", f"vllm={exe}")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("probe-1-a", "probe-1", engine="vllm", source=str(weights)))
        shard = await shard_in(c, "probe-1-a", agent, "Running", "Failed")
        assert shard.status.phase == "Running", shard.status

        async def health(_request):
            return web.Response(text="ok")
        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", shard.spec.ports.serve).start()
        try:
            async def told():
                s = await c.get(Shard, "probe-1-a")
                return s if "answered by another process" in s.status.message or s.status.phase != "Running" \
                    else None
            shard = await wait_for("the agent names the stranger behind the probe", told, agent)
            assert shard.status.phase == "Running", shard.status
            assert f"port {shard.spec.ports.serve} held by pid {os.getpid()}" in shard.status.message
        finally:
            await runner.cleanup()


async def test_a_port_held_by_a_foreign_process_fails_the_shard_with_port_in_use(shared_api_server, agents):
    with _listening("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        agent = agents("busy-1", "--port-range", f"{port}-{port}")
        async with shared_api_server.client() as c:
            async def registered():
                n = await c.get(Node, "busy-1")
                return n if n.status.agentVersion else None
            node = await wait_for("node registered", registered, agent)
            assert node.status.foreignPorts == [port]

            shard = sim_shard("busy-1-a", "busy-1")
            shard.spec.ports.serve = port
            await c.create(shard)
            shard = await shard_in(c, "busy-1-a", agent, "Failed", "Ready", "Running")
            assert shard.status.phase == "Failed", shard.status
            words = f"port {port} held by pid {os.getpid()} ("
            assert shard.status.message.startswith(f"PortInUse: {words}"), shard.status.message
            cond = get_condition(shard.status.conditions, "Started")
            assert (cond.status, cond.reason) == ("False", "PortInUse") and cond.message.startswith(words)
            assert shard.status.pid is None, "an engine was started"

    # The port is free again on the node's address (held on another address only, as by another
    # node's engine on a machine of several loopback nodes): the next start's check finds it
    # free and foreignPorts empties.
    with _listening("127.0.0.2", port):
        async with shared_api_server.client() as c:
            shard = sim_shard("busy-1-b", "busy-1")
            shard.spec.ports.serve, shard.spec.ports.distInit = port, free_port()
            await c.create(shard)
            shard = await shard_in(c, "busy-1-b", agent, "Ready", "Failed")
            assert shard.status.phase == "Ready", shard.status

            async def cleared():
                n = await c.get(Node, "busy-1")
                return n if n.status.foreignPorts == [] else None
            await wait_for("foreignPorts emptied", cleared, agent)
