"""Fault-injection scenarios (the short profile): a real cluster, a load through the gateway, a
nemesis, then the invariants over the recorded history (see invariants.py, docs/robustness.md).

Each scenario has its own cluster (3 nodes x 2 fake GPUs unless it says otherwise, node grace
3 s, two controller-managers). The scenarios marked xfail are the failures of issue 21; each
fails on the invariant its bug breaks (the reason names the case).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.robustness import invariants as inv
from tests.robustness import nemesis
from tests.robustness.harness import fault_cluster

pytestmark = pytest.mark.timeout(600)

ORPHAN_BOUND = 30.0   # s an engine may outlive its shard: drain delay + stop grace + a loaded machine


def common(c, model: str, replicas: int, max_surge: int = 1) -> dict:
    """The invariants every scenario must keep."""
    h = c.history
    return {"exclusive_engines": inv.exclusive_engines(h),
            "surge_bound": inv.surge_bound(h, model, replicas, max_surge),
            "no_orphans": inv.no_orphans(h, ORPHAN_BOUND),
            "ready_on_own_engine": inv.ready_on_own_engine(h),
            "converged": inv.converged(h)}


async def test_drain_under_load_loses_no_request(tmp_path):
    async with fault_cluster(tmp_path) as c:
        await c.apply_model("m", replicas=2)
        await c.wait_model_ready("m", 2)
        victim = (await c.replicas("m"))[0].spec.placement[0].node
        async with c.load(["m"]):
            start = time.monotonic()
            await c.drain(victim)

            async def drained():
                node = await c.store.get("nodes", victim)
                return node.status.drain is not None and node.status.drain.phase == "Drained"
            await c.wait(f"{victim} Drained", drained)
            await c.settle({"m": 2})
            end = time.monotonic()
        c.holds(**common(c, "m", 2), no_failed_requests=inv.no_failed_requests(c.history),
                ready_floor=inv.ready_floor(c.history, "m", 2, [(start, end)]))
