"""Network faults (issue 33): nftables rules on one node's link in the namespaced fault cluster,
under load, then the invariants over the history (the promises in docs/contracts.md, "The
network fails between components").
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import time

import pytest

from tests.robustness import invariants as inv
from tests.robustness import nemesis
from tests.robustness.test_robustness_scenarios import by_load, common, with_model

pytestmark = [pytest.mark.timeout(600), pytest.mark.skipif(shutil.which("nft") is None,
                                 reason="needs nft (Debian's nftables; hack/test.sh installs it)")]

CUT = 15.0          # s a cut lasts: several of the gateway's 2 s connect timeouts and a probe or two
STARTED_AFTER = 3.0  # s after a cut from which no request may fail
STOPS_WITHIN = 5.0   # s after a cut from which the gateway no longer picks the replica
TIMEOUT = 5.0       # s: the gateway's response and stream idle timeouts in the cut-engine scenario
PROMPT = 3.0         # s a request may take: above the gateway's 2 s connect timeout, the cost of a wrong pick


@contextlib.asynccontextmanager
async def _streaming_on_one(c):
    """m under load (two clients of whole responses, two of streams) until the block ends; yields
    (replica, shard) of one of its Ready replicas once a stream is open on it."""
    target = (await c.ready("m"))[0]
    shard = next(s for s in await c.shards() if s.spec.replica == target.name)
    async with c.load(["m"], concurrency=2, streams=2) as load:
        await c.wait("a stream open on the replica about to be cut", lambda: load.streaming[target.name] > 0,
                     interval=0.05)
        yield target, shard


@pytest.mark.faults
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


@pytest.mark.serial   # its bounds are seconds after the cut (STARTED_AFTER, STOPS_WITHIN, PROMPT): alone
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
        h = c.history
        async with _streaming_on_one(c) as (target, shard):
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


IN_FLIGHT = 15.0    # s: the most a request in flight at a cut waits for its first byte or its stream's end
LONG_CUT = 25.0     # s a cut lasts in the in-flight scenarios: 10 s past IN_FLIGHT, so no heal ends a wait


@pytest.mark.faults   # its bound (15 s) is TCP keepalive's (11 s, the kernel's) and the gateway's reaction
@pytest.mark.parametrize("cut", ["from the gateway alone", "from everything"])
async def test_requests_in_flight_on_a_cut_engine_end_within_bounds_at_default_timeouts(tmp_path, cut):
    """Issue 45: one of m's two engines cut (from the gateway alone: the control plane sees nothing;
    or from everything, its agent's probes too) for 25 s, with the gateway's default timeouts
    (600 s for a response, 300 s between chunks) under load with streams. No request in flight at
    the cut waits more than 15 s for its first byte, or a started stream for its end; whole ones
    all succeed (retried elsewhere: the replica left the table, was ejected, or TCP keepalive
    found the connection dead in 11 s); every stream on the cut engine ends with an error event;
    no request started 3 s after the cut fails. First seen failing: in flight waited for the heal."""
    async with with_model(tmp_path, 2, args=["--tokens-per-second", "100"]) as c:
        h = c.history
        async with _streaming_on_one(c) as (_, shard):
            if cut == "from everything":
                nemesis.isolate_engine(c, shard.spec.node, shard.spec.ports.serve)
            else:
                nemesis.cut_engine(c, shard.spec.node, shard.spec.ports.serve)
            at = time.monotonic()
            await asyncio.sleep(LONG_CUT)     # the fault's length, not a synchronisation
            nemesis.heal(c, shard.spec.node)
            await c.settle({"m": 2})
        c.holds(**common(c, "m", 2),
                no_failed_requests=inv.no_failed_requests(h, [(at + STARTED_AFTER, time.monotonic())]),
                in_flight_bounded=inv.in_flight_bounded(h, at, IN_FLIGHT))
