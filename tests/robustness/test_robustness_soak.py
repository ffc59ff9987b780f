"""The long profile: one cluster, a random schedule of nemeses for a while, the invariants after.

Skipped unless LLMGW_ROBUSTNESS=long; LLMGW_ROBUSTNESS_SECONDS sets how long (default 600),
LLMGW_ROBUSTNESS_SEED the schedule's seed (default: random, printed).

    LLMGW_ROBUSTNESS=long .venv/bin/python -m pytest -q -s tests/robustness/test_robustness_soak.py

Cluster: 4 nodes x 2 fake GPUs, 3 etcd members, two controller-managers; models `m` (2
replicas) and `s` (1 replica), a load on both. Each round picks one nemesis whose promise
holds today (drain + uncordon, rolling update, leader kill, server kill, etcd member kill,
agent kill + restart, agent SIGSTOP shorter than its heartbeat's lease), waits for the
cluster to settle, and marks the round's time as a window in which no request may fail.
The nemeses of issue 21's cases (an agent silent past the node grace, a partition heal, an
engine crash of a single replica, a foreign port) stay in the short profile until fixed.

Figures of one run (2026-12-04, 2 cores shared with other work, 600 s, seed 777064795): 324
rounds, 445 faults written (a kill and its restart count as two), 26910 requests, 0 failed, 2394
object changes and 5094 engine samples recorded, 8 invariants checked over them: all held. An
earlier run (seed 331239277, same figures within 2%) broke surge_bound with a drain during a
rollout, the drain's own make-before-break budget, which the checker now leaves out.
After issue 21's fixes landed (2026-12-04, idle 2 cores, 300 s, seed 924973823): 182 rounds, 222
faults, 14718 requests, 0 failed, 1564 changes and 2835 samples, 8 invariants: all held.
"""
from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from tests.robustness import invariants as inv
from tests.robustness import nemesis
from tests.robustness.harness import fault_cluster

pytestmark = [pytest.mark.skipif(os.environ.get("LLMGW_ROBUSTNESS") != "long",
                                 reason="the long profile: set LLMGW_ROBUSTNESS=long"),
              pytest.mark.timeout(0)]

MODELS = {"m": 2, "s": 1}


async def _drain_and_back(c, rng) -> str:
    node = rng.choice(sorted({p.node for r in await c.replicas("m") for p in r.spec.placement}))
    await c.drain(node)
    await c.wait_drained(node)
    await c.cordon(node, False)
    return f"drain {node}"


async def _update(c, rng) -> str:
    await c.set_args("m", ["--tokens-per-second", str(rng.choice([200, 300, 400, 500]))])
    return "rolling update of m"


async def _kill_leader(c, rng) -> str:
    return f"kill leader {await nemesis.kill_leader(c)}"


async def _kill_server(c, rng) -> str:
    await nemesis.kill_server(c)
    return "kill server"


async def _kill_etcd(c, rng) -> str:
    i = rng.randrange(len(c.etcd.members))
    await nemesis.kill_etcd_member(c, i)
    return f"kill etcd member {i}"


async def _kill_agent(c, rng) -> str:
    node = rng.choice([n.name for n in c.nodes])
    nemesis.kill_agent(c, node)
    nemesis.restart_agent(c, node)
    return f"kill agent {node}"


async def _pause_agent(c, rng) -> str:
    node = rng.choice([n.name for n in c.nodes])
    nemesis.stop_agent(c, node)
    await asyncio.sleep(3.0)     # the pause itself: shorter than the heartbeat's 15 s lease
    nemesis.cont_agent(c, node)
    return f"pause agent {node} 3s"


NEMESES = [_drain_and_back, _update, _kill_leader, _kill_server, _kill_etcd, _kill_agent, _pause_agent]


async def test_soak(tmp_path):
    seconds = float(os.environ.get("LLMGW_ROBUSTNESS_SECONDS", "600"))
    seed = int(os.environ.get("LLMGW_ROBUSTNESS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"soak: seed {seed}, {seconds:g}s")
    async with fault_cluster(tmp_path, nodes=4, etcd_members=3) as c:
        for name, n in MODELS.items():
            await c.apply_model(name, replicas=n)
        for name, n in MODELS.items():
            await c.wait_model_ready(name, n)
        windows, rounds = [], []
        deadline = time.monotonic() + seconds
        async with c.load(list(MODELS)):
            while time.monotonic() < deadline:
                start = time.monotonic()
                rounds.append(await rng.choice(NEMESES)(c, rng))
                await c.settle(MODELS)
                windows.append((start, time.monotonic()))
                print(f"round {len(rounds)}: {rounds[-1]} ({time.monotonic() - start:.0f}s)")
        h = c.history
        checks = {"no_failed_requests": inv.no_failed_requests(h, windows),
                  "exclusive_engines": inv.exclusive_engines(h),
                  "no_orphans": inv.no_orphans(h, 30.0),
                  "ready_on_own_engine": inv.ready_on_own_engine(h),
                  "ports_free_when_given": inv.ports_free_when_given(h),
                  "converged": inv.converged(h),
                  **{f"surge_bound[{m}]": inv.surge_bound(h, m, n, 1) for m, n in MODELS.items()}}
        print(f"soak: {len(rounds)} rounds, {len(h.faults)} faults, {len(h.requests)} requests "
              f"({sum(not r.ok for r in h.requests)} failed), {len(h.changes)} changes, {len(h.samples)} samples, "
              f"{len(checks)} invariants checked")
        c.holds(**checks)
