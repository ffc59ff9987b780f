"""The long profile: one cluster, a random schedule of nemeses for a while, the invariants after.

Skipped unless LLMGW_ROBUSTNESS=long; LLMGW_ROBUSTNESS_SECONDS sets how long (default 600),
LLMGW_ROBUSTNESS_SEED the schedule's seed (default: random, printed).

    LLMGW_ROBUSTNESS=long .venv/bin/python -m pytest -q -s tests/robustness/test_robustness_soak.py

Cluster: 4 nodes x 2 fake GPUs, 3 etcd members, 3 API servers, two controller-managers, a gateway whose
response and stream idle timeouts are 8 s; models `m` (2 replicas) and `s` (1 replica), 200
tokens a second; a load on both: three clients of whole responses and two of 300-token
streams. Each round picks one nemesis at random and waits for the cluster to settle: drain +
uncordon, rolling update, leader kill, a server kill (one of the three), each server killed in
turn (0.5 or 5 s down each), two of the three down for 5 or 20 s, all three down until
every node is held back as MassSilence, etcd member kill, agent kill + restart,
agent SIGSTOP shorter than its heartbeat's lease, and the nemeses of issue 21's seven cases (an
agent silent past the node grace, half the nodes silent and healed one by one, the crash of a
single replica's engine, a watch resumed through a restarted server, foreign listeners during a
rollout), a hung engine (SIGSTOP, SIGCONT), the network's faults (nftables in the nodes'
namespaces: a node cut from the control plane, a node or one engine cut from the gateway, one
of m's engines cut from everything for 20 s, packet loss on two links healed link by link),
etcd's quorum lost for 10 or 20 s, and the gateway killed and started again. A round whose
nemesis promises it (all but the engine crash, the hung engine and the cut from the gateway;
the gateway's restart from when it listens; an engine cut from everything from 3 s after the
cut) is a window in which no request may fail (a request that overlaps a round without that promise is
excused: a stream begun before an engine's crash); a server kill's, one in which no Node is
written Ready=False (not all servers down: their nodes go NotReady); a partition's, all servers
down's, a lossy link's or a lost quorum's round, one in which its nodes lose no replica; a hang
or a cut of 20 s, one in which every request in flight at its start ends within two timeouts
(its try and its retry); an engine cut from everything, one in which every request in flight at
the cut ends within 15 s.

Figures of one run (2026-12-04, 2 cores shared with other work, 600 s, seed 777064795): 324
rounds, 445 faults written (a kill and its restart count as two), 26910 requests, 0 failed, 2394
object changes and 5094 engine samples recorded, 8 invariants checked over them: all held. An
earlier run (seed 331239277, same figures within 2%) broke surge_bound with a drain during a
rollout, the drain's own make-before-break budget, which the checker now leaves out.
After issue 21's fixes landed (2026-12-04, idle 2 cores, 300 s, seed 924973823): 182 rounds, 222
faults, 14718 requests, 0 failed, 1564 changes and 2835 samples, 8 invariants: all held.
With the streamed load, the quorum loss, the gateway restart and the bounded hangs and cuts
(2026-12-05, 2 cores shared, 600 s, seed 5150): 89 rounds, 163 faults ({'cont-agent': 17,
'cont-engine': 11, 'cont-etcd-quorum': 4, 'cut-control-plane': 5, 'cut-gateway': 3, 'heal': 23,
'kill-agent': 3, 'kill-engine': 4, 'kill-etcd': 6, 'kill-gateway': 6, 'kill-leader': 8,
'kill-server': 10, 'lossy-link': 6, ...}), 18841 requests (413 failed, none in a promised
window), 920 changes, 4647 samples, 13 invariants: all held. Its first run (same seed) found a
controller-manager started just after the quorum returned dying at its first read of etcd (now
`--etcd-wait`); its second, two faults of the foreign_port_once checker.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from llmgw.api import Node
from tests.robustness import invariants as inv
from tests.robustness import nemesis
from tests.robustness.harness import fault_cluster

pytestmark = [pytest.mark.skipif(os.environ.get("LLMGW_ROBUSTNESS") != "long",
                                 reason="the long profile: set LLMGW_ROBUSTNESS=long"),
              pytest.mark.timeout(0), pytest.mark.serial]

MODELS = {"m": 2, "s": 1}
TIMEOUT = 8.0   # s: the gateway's response and stream idle timeouts (a loaded 2-core machine)
# s within which a request in flight at a hang or a cut ends: its try's timeout, and its one retry's
# (s has one replica: the retry goes to the same engine), each seen by a watchdog ticking once a second
ENDS_WITHIN = 2 * (TIMEOUT + 1)


@dataclass
class Round:
    """What a nemesis did; `lossless`: no request may fail in its round (its promise today), from
    `since` if set; `kept`: nodes none of whose replicas may be evicted (a partition held back);
    `bounded`: (at, by) pairs: every request in flight at `at` must end before `by`; `nodes_ready`:
    every Node stays Ready through it."""

    what: str
    lossless: bool = True
    kept: set[str] = field(default_factory=set)
    since: float | None = None
    bounded: list[tuple[float, float]] = field(default_factory=list)
    nodes_ready: bool = False     # no Node may be written Ready=False in its round


async def _drain_and_back(c, rng) -> Round:
    node = rng.choice(sorted({p.node for r in await c.replicas("m") for p in r.spec.placement}))
    await c.drain(node)
    await c.wait_drained(node)
    await c.cordon(node, False)
    return Round(f"drain {node}")


async def _update(c, rng) -> Round:
    await c.set_args("m", ["--tokens-per-second", str(rng.choice([200, 300, 400, 500]))])
    return Round("rolling update of m")


async def _kill_leader(c, rng) -> Round:
    return Round(f"kill leader {await nemesis.kill_leader(c)}")


async def _kill_server(c, rng) -> Round:
    index = rng.randrange(c.servers)
    await nemesis.kill_server(c, index)
    return Round(f"kill {c.server_name(index)}", nodes_ready=True)


async def _kill_servers_in_turn(c, rng) -> Round:
    """Each of the three servers SIGKILLed, down for a while, and started again, one after the
    other: the agents' beats and everyone's watches move to a live server each time."""
    down = rng.choice([0.5, 5.0])
    await nemesis.kill_servers_in_turn(c, down)
    return Round(f"kill each server in turn, {down:g}s down", nodes_ready=True)


async def _two_servers_down(c, rng) -> Round:
    """Two of the three servers SIGKILLed for 5 s or for 20 s (longer than a heartbeat key lives,
    15 s), then started again: everyone goes on on the third; no Node is written Ready=False."""
    down, seconds = sorted(rng.sample(range(c.servers), 2)), rng.choice([5.0, 20.0])
    async with nemesis.servers_down(c, down):
        await asyncio.sleep(seconds)     # the outage itself
    return Round(f"{', '.join(c.server_name(i) for i in down)} down {seconds:g}s", nodes_ready=True)


async def _all_servers_down(c, rng) -> Round:
    """Every server SIGKILLed until every node was judged silent (its heartbeat key expired and
    the node grace ran out: held back as MassSilence), then started again: the gateway serves on
    from its tables, and no node loses a replica."""
    nodes = [n.name for n in c.nodes]
    async with nemesis.servers_down(c, list(range(c.servers))):
        await c.wait("every node judged while no server runs", lambda: c.evicted_or_held(nodes))
    return Round("every server down until the nodes are held back", kept=set(nodes))


async def _kill_etcd(c, rng) -> Round:
    i = rng.randrange(len(c.etcd.members))
    await nemesis.kill_etcd_member(c, i)
    return Round(f"kill etcd member {i}")


async def _kill_agent(c, rng) -> Round:
    node = rng.choice([n.name for n in c.nodes])
    nemesis.kill_agent(c, node)
    nemesis.restart_agent(c, node)
    return Round(f"kill agent {node}")


async def _pause_agent(c, rng) -> Round:
    node = rng.choice([n.name for n in c.nodes])
    nemesis.stop_agent(c, node)
    await asyncio.sleep(3.0)     # the pause itself: shorter than the heartbeat's 15 s lease
    nemesis.cont_agent(c, node)
    return Round(f"pause agent {node} 3s")


# ------------------------------------------------------------------ issue 21's cases

async def _silent_past_grace(c, rng) -> Round:
    """Cases 1 and 4: a node's agent silent past the node grace while its engines serve on; its
    replicas move off make-before-break, then it comes back."""
    node = rng.choice(sorted({p.node for m in MODELS for r in await c.replicas(m) for p in r.spec.placement}))
    nemesis.stop_agent(c, node)
    await _moved_off(c, node, "silent")
    nemesis.cont_agent(c, node)
    return Round(f"agent of {node} silent past the grace")


async def _moved_off(c, node: str, why: str) -> None:
    async def moved():
        return not [r for m in MODELS for r in await c.replicas(m) if node in {p.node for p in r.spec.placement}]
    await c.wait(f"replicas moved off the {why} {node}", moved)


async def _partition(c, rng) -> Round:
    """Cases 2 and 3: half the nodes silent (mass silence: eviction held back), healed one by one."""
    silent = rng.sample([n.name for n in c.nodes], len(c.nodes) // 2)
    await nemesis.partition_heal(c, silent, lambda: c.evicted_or_held(silent), rng.choice([0.0, 2.0]))
    return Round(f"partition of {sorted(silent)}, healed one by one", kept=set(silent))


async def _crash_single(c, rng) -> Round:
    """Case 5: the engine of the single replica of s killed; rebuilt at once (first_rebuild_at_once).
    Its requests fail until then: no promise of requests in this round, which lasts until s serves
    again (settle alone could pass before the agent saw the crash, and the next round's window
    would then hold this one's failures: soak seed 4242)."""
    first = (await c.ready("s"))[0]
    pid = next(s.status.pid for s in await c.shards() if s.spec.replica == first.name and s.status.pid)
    nemesis.kill_engine(c, pid)
    await c.wait_serving("s", lambda r: r.name != first.name or r.status.restarts > first.status.restarts,
                         "s Ready again after the crash")
    return Round(f"kill the engine of s (pid {pid})", lossless=False)


async def _server_kill_resume(c, rng) -> Round:
    """Case 6: a watch resumed through a restarted server from before its restart (watches_resume)."""
    _, before = await c.api.list(Node)
    await nemesis.kill_server(c)
    node = rng.choice([n.name for n in c.nodes])
    await c.resume_watch("nodes", before, lambda: c.cordon(node, True))
    await c.cordon(node, False)
    return Round("kill server, resume a watch from before it")


async def _foreign_port(c, rng) -> Round:
    """Case 7: a foreign listener on each node's lowest free engine port while m rolls (new shards
    get ports): the port goes to one shard at most (foreign_port_once)."""
    free = {}
    for n in c.nodes:
        held = {p for e in c.engine_processes(n.name) for p in e.ports}
        free[n.name] = next(p for p in c.engine_ports() if p not in held)
    with c.squatting(free):        # a port taken meanwhile: that node goes without
        old = {r.name for r in await c.replicas("m")}
        await c.set_args("m", ["--tokens-per-second", str(rng.choice([250, 350, 450]))])
        await c.wait_rolled("m", old, MODELS["m"])
    return Round("foreign listeners during a rolling update of m")


async def _hang_engine(c, rng) -> Round:
    """An engine SIGSTOPped for 2 or 20 s, then continued. s has one replica, so its requests
    may fail; a request in flight at a 20 s hang ends at the gateway's timeouts (its try's and
    its retry's), before the engine goes on (docs/contracts.md, "An engine hangs")."""
    pid = rng.choice([e.pid for e in c.engine_processes()])
    nemesis.stop_engine(c, pid)
    stopped, hang = time.monotonic(), rng.choice([2.0, 20.0])
    await asyncio.sleep(hang)     # the hang itself
    nemesis.cont_engine(c, pid)
    bounded = [(stopped, stopped + ENDS_WITHIN)] if hang > ENDS_WITHIN else []
    return Round(f"engine pid {pid} stopped {hang:g}s, then continued", lossless=False, bounded=bounded)


# ------------------------------------------------------------------ the network (issue 33)

async def _cut_control_plane(c, rng) -> Round:
    """A node cut from the control plane, not from the gateway: judged lost, its replicas move
    off make-before-break while its engines serve on; healed once they moved."""
    node = rng.choice([n.name for n in c.nodes])
    nemesis.cut_control_plane(c, node)
    await _moved_off(c, node, "cut off")
    nemesis.heal(c, node)
    return Round(f"{node} cut from the control plane")


async def _cut_gateway(c, rng) -> Round:
    """A node, or one engine on it, cut from the gateway for a few seconds (its agent still reaches
    it: its replicas stay Ready), then every link healed at once. A request that picks it waits
    the connect timeout and goes to another replica, but s has no other: no promise of requests
    in this round (test_robustness_network holds the promise where another replica serves)."""
    e = rng.choice(c.engine_processes())
    if rng.random() < 0.5:
        nemesis.cut_gateway(c, e.node)
        what = f"{e.node} cut from the gateway"
    else:
        nemesis.cut_engine(c, e.node, e.ports[0])
        what = f"the gateway cut from engine {e.node}:{e.ports[0]}"
    cut, length = time.monotonic(), rng.choice([3.0, 20.0])
    await asyncio.sleep(length)     # the cut itself
    nemesis.heal(c)
    bounded = [(cut, cut + ENDS_WITHIN)] if length > ENDS_WITHIN else []
    return Round(what, lossless=False, bounded=bounded)


async def _isolate_engine(c, rng) -> Round:
    """One of m's engines cut from everything (the gateway and its agent's probes) for 20 s, then
    healed (issue 45): m's other replica serves, so no request to m started 3 s after the cut
    fails, and every request in flight at the cut ends within 15 s of it (its replica leaves the
    table, or TCP keepalive finds its connection dead in 11 s), long before the heal."""
    shard = rng.choice([s for s in await c.shards() if s.spec.model == "m"])
    nemesis.isolate_engine(c, shard.spec.node, shard.spec.ports.serve)
    cut = time.monotonic()
    await asyncio.sleep(20.0)     # the cut itself
    nemesis.heal(c, shard.spec.node)
    return Round(f"engine {shard.spec.node}:{shard.spec.ports.serve} of m cut from everything",
                 since=cut + 3.0, bounded=[(cut, cut + 15.0)])


async def _lossy_links(c, rng) -> Round:
    """Two nodes' links drop 5 or 10 % of their packets each way for a few seconds, healed link by
    link: TCP retransmits, so no request fails and nothing is judged lost."""
    nodes = rng.sample([n.name for n in c.nodes], 2)
    percent = rng.choice([5, 10])
    for n in nodes:
        nemesis.lossy_link(c, n, percent)
    await asyncio.sleep(5.0)                         # the loss itself
    for n in nodes:
        nemesis.heal(c, n)
        await asyncio.sleep(1.0)                     # the heal's schedule, not a synchronisation
    return Round(f"{percent}% loss on {sorted(nodes)}, healed link by link", kept=set(nodes))


async def _lose_quorum(c, rng) -> Round:
    """A majority of etcd's members silent for 10 or 20 s: nothing is written or decided, the
    gateway serves from its table, no node is judged lost (docs/contracts.md, "etcd loses its
    quorum")."""
    seconds = rng.choice([10.0, 20.0])
    await nemesis.lose_quorum(c, seconds)
    return Round(f"etcd quorum lost for {seconds:g}s", kept={n.name for n in c.nodes})


async def _restart_gateway(c, rng) -> Round:
    """The gateway SIGKILLed and started again: requests in flight and those sent while it is down
    fail; none that comes once it listens does (it waits for the routes: docs/gateway.md)."""
    await nemesis.kill_gateway(c)
    return Round("kill gateway, start it again", since=time.monotonic())


NEMESES = [_drain_and_back, _update, _kill_leader, _kill_server, _kill_servers_in_turn, _two_servers_down,
           _all_servers_down, _kill_etcd, _kill_agent,
           _pause_agent, _silent_past_grace, _partition, _crash_single, _server_kill_resume, _foreign_port,
           _hang_engine, _cut_control_plane, _cut_gateway, _isolate_engine, _lossy_links, _lose_quorum,
           _restart_gateway]


async def test_soak(tmp_path):
    seconds = float(os.environ.get("LLMGW_ROBUSTNESS_SECONDS", "600"))
    seed = int(os.environ.get("LLMGW_ROBUSTNESS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"soak: seed {seed}, {seconds:g}s")
    timeouts = ["--response-timeout", str(TIMEOUT), "--stream-idle-timeout", str(TIMEOUT)]
    async with fault_cluster(tmp_path, nodes=4, etcd_members=3, gateway_args=timeouts, servers=3) as c:
        for name, n in MODELS.items():
            await c.apply_model(name, replicas=n, args=["--tokens-per-second", "200"])
        for name, n in MODELS.items():
            await c.wait_model_ready(name, n)
        windows, rounds, kept, bounded, excused, ready = [], [], [], [], [], []
        deadline = time.monotonic() + seconds
        async with c.load(list(MODELS), streams=2):
            while time.monotonic() < deadline:
                start = time.monotonic()
                rounds.append(await rng.choice(NEMESES)(c, rng))
                await c.settle(MODELS)
                r, end = rounds[-1], time.monotonic()
                if r.lossless:
                    windows.append((r.since or start, end))
                if not r.lossless:
                    excused.append((start, end))
                elif r.since:              # promised only from `since`: what came before is excused
                    excused.append((start, r.since))
                bounded += rounds[-1].bounded
                kept += inv.no_eviction(c.history, rounds[-1].kept, start)
                if r.nodes_ready:
                    ready += inv.nodes_stay_ready(c.history, start, end)
                print(f"round {len(rounds)}: {rounds[-1].what} ({time.monotonic() - start:.0f}s)")
        h = c.history
        checks = {"no_failed_requests": inv.no_failed_requests(h, windows, excused),
                  "exclusive_engines": inv.exclusive_engines(h),
                  "no_orphans": inv.no_orphans(h, 30.0),
                  "ready_on_own_engine": inv.ready_on_own_engine(h),
                  "ports_free_when_given": inv.ports_free_when_given(h),
                  "no_eviction": kept,
                  "nodes_stay_ready": ready,
                  "first_rebuild_at_once": inv.first_rebuild_at_once(h),
                  "watches_resume": inv.watches_resume(h),
                  "foreign_port_once": inv.foreign_port_once(h),
                  "in_flight_ended": [v for at, by in bounded for v in inv.ended_by(h, at, by)],
                  "converged": inv.converged(h),
                  **{f"surge_bound[{m}]": inv.surge_bound(h, m, n, 1) for m, n in MODELS.items()}}
        kinds = Counter(f.nemesis for f in h.faults)
        print(f"soak: {len(rounds)} rounds, {len(h.faults)} faults ({dict(sorted(kinds.items()))}), "
              f"{len(h.requests)} requests ({sum(not r.ok for r in h.requests)} failed), {len(h.changes)} changes, "
              f"{len(h.samples)} samples, {len(checks)} invariants checked")
        c.holds(**checks)
