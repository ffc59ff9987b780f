"""Nemeses: small faults on a running FaultCluster, each written into its History.

    kill_agent / stop_agent / cont_agent      the node agent (its engines keep running)
    restart_agent                             a new agent process for a node
    kill_engine / stop_engine / cont_engine   one engine process (by pid)
    kill_leader                               SIGKILL the controller-manager holding the leader key;
                                              a fresh one is started so two stay in the race
    kill_server                               SIGKILL an API server and start it on the same port
    kill_servers_in_turn                      kill_server each of several servers, one after the other
    servers_down                              SIGKILL several servers (or all) for a block's time, then
                                              start them again
    kill_etcd_member                          SIGKILL one etcd member; start it again on its data
                                              after it has been down a while
    partition_heal                            SIGSTOP several agents, then SIGCONT them one by one,
                                              each an interval after the last is Ready again
    lose_quorum                               SIGSTOP a majority of etcd's members for a while
    lose_etcd_and_restore                     SIGKILL every etcd member, delete its data, restore
                                              the cluster from a snapshot file and start it
    kill_gateway                              SIGKILL the gateway and start it on the same port

At the network level (nftables rules on the node's eth0, in its namespace: llmgw/dev/netns.py):

    cut_control_plane                         a node from the API server (and everything but the
                                              gateway's connections to its engines)
    cut_gateway                               a node from the gateway (its engines' ports); the
                                              control plane still reaches it
    cut_engine                                the gateway from one engine's serve port
    isolate_engine                            one engine's serve port from everything, its agent's
                                              probes over the namespace's loopback too
    lossy_link                                drop a share of a node's packets, both ways
    heal                                      one node's rules gone, or every node's
A cut drops (never rejects): a peer sees silence, as behind a failed switch.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from tests.fixtures.snapshot import restore
from tests.robustness.history import Fault


def _fault(c, nemesis: str, target: str) -> None:
    c.history.faults.append(Fault(time.monotonic(), nemesis, target))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _agent(c, node: str):
    return c.procs[f"agent-{node}"]


def kill_agent(c, node: str) -> None:
    proc = _agent(c, node)
    _signal(proc.pid, signal.SIGKILL)
    proc.wait()
    c.procs[f"stopped:agent-{node}"] = c.procs.pop(f"agent-{node}")
    _fault(c, "kill-agent", node)


def restart_agent(c, node: str) -> None:
    c.procs.pop(f"stopped:agent-{node}", None)
    c.start_agent(next(n for n in c.nodes if n.name == node))
    _fault(c, "start-agent", node)


def stop_agent(c, node: str) -> None:
    _signal(_agent(c, node).pid, signal.SIGSTOP)
    _fault(c, "stop-agent", node)


def cont_agent(c, node: str) -> None:
    _signal(_agent(c, node).pid, signal.SIGCONT)
    _fault(c, "cont-agent", node)


def kill_engine(c, pid: int) -> None:
    _signal(pid, signal.SIGKILL)
    _fault(c, "kill-engine", str(pid))


def stop_engine(c, pid: int) -> None:
    _signal(pid, signal.SIGSTOP)
    _fault(c, "stop-engine", str(pid))


def cont_engine(c, pid: int) -> None:
    _signal(pid, signal.SIGCONT)
    _fault(c, "cont-engine", str(pid))


async def kill_leader(c) -> str:
    """SIGKILL the leading controller-manager (once a live one holds the key: a killed leader's
    lease outlives it by up to the lease time); returns its process name."""
    async def live_leader():
        holder = (await c.store.election.leader("controller-manager") or {}).get("holder", "")
        pid = int(holder.rsplit("-", 1)[1]) if holder else 0
        return next((n for n, p in c.procs.items()
                     if p.pid == pid and n.startswith("controller-manager") and p.poll() is None), None)
    name = await c.wait("a live controller-manager holding the leader key", live_leader)
    c.stop_process(name, signal.SIGKILL)
    c.procs[f"stopped:{name}"] = c.procs.pop(name)
    _fault(c, "kill-leader", name)
    c.managers_started += 1
    c.start_controller_manager(f"controller-manager-{c.managers_started}")
    return name


async def kill_server(c, index: int = 0, down: float = 0.0) -> None:
    """SIGKILL the server at `index` (of the cluster's several), start it again on its port after
    `down` seconds. The waits run off the event loop, so the load and the recorder's watches go on
    meanwhile."""
    async with servers_down(c, [index]):
        await asyncio.sleep(down)       # the outage itself


@contextlib.asynccontextmanager
async def servers_down(c, indices: list[int]):
    """The servers at `indices` SIGKILLed, down while the block runs, then each started again on
    its port (off the event loop, as kill_server)."""
    for index in indices:
        name = c.server_name(index)
        await asyncio.to_thread(c.stop_process, name, signal.SIGKILL)
        c.procs[f"stopped:{name}"] = c.procs.pop(name)    # not a process that died (check_alive)
        _fault(c, "kill-server", name)
    try:
        yield
    finally:
        for index in indices:
            c.procs.pop(f"stopped:{c.server_name(index)}")
            c.start_server(index)
            await asyncio.to_thread(c.wait_server, index=index)
            _fault(c, "start-server", c.server_name(index))


async def kill_servers_in_turn(c, down: float) -> None:
    """Each of the cluster's servers SIGKILLed and started again after `down` seconds, one after
    the other: the clients move to another server each time (kill_server)."""
    for index in range(c.servers):
        await kill_server(c, index, down)


async def kill_etcd_member(c, index: int, down: float = 1.0) -> None:
    """The member stays dead for `down` seconds: a restart alone takes about 0.1 s, a window in
    which the load may finish no request (and a member back that fast tests little)."""
    m = c.etcd.members[index]
    m.proc.kill()
    await asyncio.to_thread(m.proc.wait)
    _fault(c, "kill-etcd", m.name)
    await asyncio.sleep(down)       # the outage itself
    await c.restart_etcd_member(m)
    _fault(c, "start-etcd", m.name)


async def lose_etcd_and_restore(c, snapshot: Path) -> None:
    """Every etcd member SIGKILLed and its data directory deleted, then the cluster restored from
    `snapshot` (`llmgw ctl snapshot restore`, the README's runbook) and started; nothing else is
    touched (the servers, controller-managers, agents, gateway and engines run on)."""
    for m in c.etcd.members:
        m.proc.kill()
        await asyncio.to_thread(m.proc.wait)
    _fault(c, "kill-etcd-all", ",".join(m.name for m in c.etcd.members))
    for m in c.etcd.members:
        shutil.rmtree(m.data_dir)
    await asyncio.to_thread(restore, c.etcd, snapshot)
    _fault(c, "restore-etcd", snapshot.name)


async def lose_quorum(c, seconds: float) -> None:
    """A majority of the members silent (SIGSTOP, as behind a failed switch) for `seconds`."""
    members = c.etcd.members[:len(c.etcd.members) // 2 + 1]
    for m in members:
        _signal(m.proc.pid, signal.SIGSTOP)
    _fault(c, "stop-etcd-quorum", ",".join(m.name for m in members))
    await asyncio.sleep(seconds)     # the outage itself
    for m in members:
        _signal(m.proc.pid, signal.SIGCONT)
    _fault(c, "cont-etcd-quorum", ",".join(m.name for m in members))


async def kill_gateway(c) -> None:
    """Returns once the new gateway accepts connections (before it has its routes: a request
    that comes now must wait for them, not fail)."""
    await asyncio.to_thread(c.stop_process, "gateway", signal.SIGKILL)
    _fault(c, "kill-gateway", "gateway")
    c.start_gateway()
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", c.gateway_port)
        except OSError:
            c.check_alive()
            await asyncio.sleep(0.02)
            continue
        writer.close()
        break
    _fault(c, "start-gateway", "gateway")


async def partition_heal(c, nodes: list[str], held, interval: float) -> None:
    """SIGSTOP the agents of `nodes`; once `held()` is true, SIGCONT them one by one in that order,
    each `interval` after the one before was seen Ready again."""
    for n in nodes:
        stop_agent(c, n)
    await c.wait(f"the partition of {nodes} noticed", held)
    for n in nodes:
        cont_agent(c, n)
        await c.wait(f"{n} Ready again", lambda n=n: _ready(c, n))
        await asyncio.sleep(interval)    # the heal's schedule, not a synchronisation


async def _ready(c, node: str) -> bool:
    return await c.node_condition(node, "Ready") == "True"


def _engine_ports(c) -> str:
    first, last = c.engine_ports()[0], c.engine_ports()[-1]
    return f"{first}-{last}"


def cut_control_plane(c, node: str) -> None:
    """Everything on the node's link but connections to its engines' ports: the agent neither
    reaches the API server nor is reached by it; the gateway still reaches the engines."""
    ports = _engine_ports(c)
    c.net.rules(node, [f'iifname "eth0" tcp dport != {ports} drop'], [f'oifname "eth0" tcp sport != {ports} drop'])
    _fault(c, "cut-control-plane", node)


def cut_gateway(c, node: str) -> None:
    """Connections to the node's engines' ports (only the gateway makes them from outside)."""
    ports = _engine_ports(c)
    c.net.rules(node, [f'iifname "eth0" tcp dport {ports} drop'], [f'oifname "eth0" tcp sport {ports} drop'])
    _fault(c, "cut-gateway", node)


def cut_engine(c, node: str, port: int) -> None:
    """The gateway from one engine: its serve port on the node's link; its agent still reaches
    it (over the namespace's loopback)."""
    c.net.rules(node, [f'iifname "eth0" tcp dport {port} drop'], [f'oifname "eth0" tcp sport {port} drop'])
    _fault(c, "cut-engine", f"{node}:{port}")


def isolate_engine(c, node: str, port: int) -> None:
    """One engine from everything: its serve port on every interface of the node's namespace,
    so its agent's probes (over the loopback) fail as the gateway's connections do."""
    c.net.rules(node, [f"tcp dport {port} drop"], [f"tcp sport {port} drop"])
    _fault(c, "isolate-engine", f"{node}:{port}")


def lossy_link(c, node: str, percent: int) -> None:
    """Drop `percent` % of the packets on the node's link, each way (nftables' numgen random)."""
    drop = f"numgen random mod 100 < {percent} drop"
    c.net.rules(node, [f'iifname "eth0" {drop}'], [f'oifname "eth0" {drop}'])
    _fault(c, "lossy-link", f"{node} {percent}%")


def heal(c, node: str | None = None) -> None:
    """Every network fault of `node` (None: of every node) gone."""
    for n in [node] if node else [p.name for p in c.nodes]:
        c.net.heal(n)
        _fault(c, "heal", n)
