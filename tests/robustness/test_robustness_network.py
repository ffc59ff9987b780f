"""Network faults (issue 33): nftables rules on one node's link in the namespaced fault cluster,
under load, then the invariants over the history (the promises in docs/contracts.md, "The
network fails between components").
"""
from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from tests.robustness import invariants as inv
from tests.robustness import nemesis
from tests.robustness.test_robustness_scenarios import by_load, common, with_model

pytestmark = [pytest.mark.timeout(600), pytest.mark.serial,   # faults and their timing: alone
              pytest.mark.skipif(shutil.which("nft") is None,
                                 reason="needs nft (Debian's nftables; hack/test.sh installs it)")]

CUT = 15.0          # s a cut lasts: several of the gateway's 2 s connect timeouts and a probe or two
STARTED_AFTER = 3.0  # s after a cut from which no request may fail
STOPS_WITHIN = 5.0   # s after a cut from which the gateway no longer picks the replica
TIMEOUT = 5.0       # s: the gateway's response and stream idle timeouts in the cut-engine scenario
PROMPT = 3.0         # s a request may take: above the gateway's 2 s connect timeout, the cost of a wrong pick


async def test_node_cut_from_control_plane_keeps_serving(tmp_path):
    """The agent of the node with m's one replica neither reaches the API server nor is reached
    by it; the gateway still reaches its engine. The node is judged lost, m is replaced
    make-before-break while the old engine serves on, and when the link heals the agent stops
    its engine: no request fails, nothing is double-booked, no engine outlives its shard."""
    async with with_model(tmp_path, 1) as c:
        victim = by_load(await c.replicas("m"))[0]
        async with c.load(["m"]):
            nemesis.cut_control_plane(c, victim)
            await c.wait_serving("m", lambda r: victim not in {p.node for p in r.spec.placement},
                                 f"m moved off {victim}, cut from the control plane")
            nemesis.heal(c, victim)
            await c.settle({"m": 1})
        c.holds(**common(c, "m", 1), no_failed_requests=inv.no_failed_requests(c.history))


async def test_gateway_cut_from_one_engine_stops_choosing_it(tmp_path):
    """The gateway cannot reach one of m's two engines; its agent still does, so the replica stays
    Ready. The load: whole responses and streams of 300 tokens (3 s each). No request that started
    3 s after the cut fails; from 5 s after it no request waits on the cut replica for its
    response to start (a connect that times out ejects it, and only a probe that connects returns
    it: llmgw/gateway/outlier.py); every request in flight at the cut ends at the gateway's
    response timeout or stream idle timeout (5 s each here), long before the heal; after the heal
    it answers again. First seen failing: the gateway tried the replica again with a request
    each time its ejection ended (strict xfail); streams in flight at the cut waited for the
    heal (no idle timeout)."""
    timeouts = ["--response-timeout", str(TIMEOUT), "--stream-idle-timeout", str(TIMEOUT)]
    async with with_model(tmp_path, 2, args=["--tokens-per-second", "100"], gateway_args=timeouts) as c:
        target = (await c.ready("m"))[0]
        shard = next(s for s in await c.shards() if s.spec.replica == target.name)
        h = c.history
        async with c.load(["m"], concurrency=2, streams=2) as load:
            await c.wait("a stream open on the replica about to be cut", lambda: load.streaming[target.name] > 0,
                         interval=0.05)
            nemesis.cut_engine(c, shard.spec.node, shard.spec.ports.serve)
            cut = time.monotonic()
            await asyncio.sleep(CUT)     # the fault's length, not a synchronisation
            nemesis.heal(c, shard.spec.node)
            healed = time.monotonic()
            await c.wait(f"{target.name} answering again after the heal",
                         lambda: any(r.replica == target.name and r.start > healed for r in h.requests))
            await c.settle({"m": 2})
        c.holds(**common(c, "m", 2),
                no_failed_requests=inv.no_failed_requests(h, [(cut + STARTED_AFTER, time.monotonic())]),
                prompt_requests=inv.prompt_requests(h, [(cut + STOPS_WITHIN, healed)], PROMPT),
                in_flight_ended=inv.ended_by(h, cut, healed))
