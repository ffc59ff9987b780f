"""The autoscaler: its decision (recommend, decide) and the real controller on a real etcd, fed by
demand reports written under real leases (store.demand, as the server writes a gateway's)."""
from __future__ import annotations

import asyncio

import pytest

from controllers.autoscaler import AutoscalerController, _History, decide, recommend
from controllers.scheduler import SchedulerController
from controllers.settings import ControllerSettings
from llmgw.api import SCALED, AutoscalingSpec, Model, get_condition
from llmgw.api.demand import DemandReport, ModelDemand
from tests.fixtures.controlplane import control_plane
from tests.fixtures.poll import until

FAST = {"autoscale_interval": 0.1}


def spec(**kw) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate({"minReplicas": 0, "maxReplicas": 5, "targetInFlight": 4, **kw})


def test_recommendation_is_demand_over_target_within_bounds_and_zero_only_after_the_delay():
    s = spec(scaleToZeroDelaySeconds=60)
    assert recommend(s, ModelDemand(inFlight=12), 0, 1) == 3
    assert recommend(s, ModelDemand(inFlight=12, waiting=1), 0, 1) == 4
    assert recommend(s, ModelDemand(inFlight=100), 0, 1) == 5             # maxReplicas
    assert recommend(s, ModelDemand(), 59, 1) == 1
    assert recommend(s, ModelDemand(), 60, 1) == 0
    assert recommend(s, ModelDemand(), 0, 0) == 0                         # the delay never starts one
    assert recommend(s, ModelDemand(waiting=1), 0, 0) == 1
    assert recommend(spec(minReplicas=2), ModelDemand(), 1000, 2) == 2


def test_scale_down_waits_until_every_recommendation_of_the_window_is_lower():
    s = spec(scaleDownStabilizationSeconds=10, scaleToZeroDelaySeconds=1000)
    h = _History(since=0.0)
    d = decide(s, 1, h, 0.0, ModelDemand(inFlight=12), 1)
    assert (d.desired, d.reason, d.message) == (3, "ScaledUp",
                                                "12 in flight over 1 replicas, target 4 per replica -> 3")
    assert decide(s, 3, h, 5.0, ModelDemand(inFlight=4), 3).desired == 3     # 3 (at 0.0) is in the window
    assert decide(s, 3, h, 9.5, ModelDemand(inFlight=4), 3).desired == 3
    d = decide(s, 3, h, 10.5, ModelDemand(inFlight=4), 3)                    # the window holds only 1s
    assert (d.desired, d.reason) == (1, "ScaledDown")


def test_a_new_term_scales_nothing_down_before_it_watched_a_whole_window():
    s = spec(scaleDownStabilizationSeconds=10, scaleToZeroDelaySeconds=0)
    h = _History(since=100.0)
    assert decide(s, 4, h, 100.0, ModelDemand(), 4).desired == 4
    assert decide(s, 4, h, 110.0, ModelDemand(), 4).desired == 0


def test_scale_up_takes_the_lowest_recommendation_of_its_window():
    s = spec(scaleUpStabilizationSeconds=10, scaleDownStabilizationSeconds=0)
    h = _History(since=0.0)
    assert decide(s, 1, h, 0.0, ModelDemand(inFlight=4), 1).desired == 1
    assert decide(s, 1, h, 5.0, ModelDemand(inFlight=20), 1).desired == 1    # a spike: 1 is in the window
    assert decide(s, 1, h, 10.5, ModelDemand(inFlight=20), 1).desired == 5


def autoscaled(name: str, **scaling) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": 1, "profiles": [{"engine": "sim"}],
        "autoscaling": {"minReplicas": 0, "maxReplicas": 4, "targetInFlight": 2, **scaling}}})


def scaled(cp, name: str):
    m = cp.cache.get(Model, name)
    return m and m.status.desiredReplicas, m and len(cp.replicas(name))


async def report(store, gateway: str, ttl: int = 30, **models: int) -> None:
    await store.demand.report(DemandReport(gateway=gateway, models={
        m: ModelDemand(inFlight=n) for m, n in models.items()}), ttl=ttl)


@pytest.mark.timeout(120)
async def test_scales_up_with_demand_adds_gateways_and_scales_down_then_to_zero(store):
    async with control_plane(store, gpus=4, settings=FAST,
                             extra=(AutoscalerController(ControllerSettings(**FAST)),)) as cp:
        await store.create(autoscaled("as", scaleDownStabilizationSeconds=2, scaleToZeroDelaySeconds=3))
        # no demand yet: minReplicas (0) until the delay, so at most one
        await report(store, "gw-a", **{"as": 3})                  # ceil(3 / 2) = 2
        await until(lambda: scaled(cp, "as") == (2, 2), "2 replicas for 3 in flight")
        # the next decision's message counts the model's Ready replicas (its status): wait for both
        await until(lambda: cp.cache.get(Model, "as").status.replicas == 2, "both replicas Ready")
        await report(store, "gw-b", **{"as": 4})                  # 3 + 4 = 7 -> 4
        await until(lambda: scaled(cp, "as") == (4, 4), "4 replicas for two gateways' 7 in flight")
        m = cp.cache.get(Model, "as")
        cond = get_condition(m.status.conditions, SCALED)
        assert (cond.reason, cond.message) == ("ScaledUp", "7 in flight over 2 replicas, target 2 per replica -> 4")
        assert cp.events("ScaledUp", "as")

        await report(store, "gw-a")                               # demand falls to 4 -> 2, after the window
        await report(store, "gw-b", **{"as": 4})
        await until(lambda: scaled(cp, "as") == (2, 2), "scaled down to 2 after the window")
        await report(store, "gw-b")
        await until(lambda: scaled(cp, "as") == (0, 0), "scaled to zero after the delay")
        assert cp.events("ScaledToZero", "as")


@pytest.mark.timeout(120)
async def test_a_dead_gateways_demand_expires_with_its_lease(store):
    async with control_plane(store, gpus=4, settings=FAST,
                             extra=(AutoscalerController(ControllerSettings(**FAST)),)) as cp:
        await store.create(autoscaled("lease", minReplicas=1, scaleDownStabilizationSeconds=0))
        await report(store, "gw-dead", ttl=2, lease=8)             # then never again
        await until(lambda: scaled(cp, "lease") == (4, 4), "4 replicas for 8 in flight")
        await until(lambda: cp.cache.demand() == [], "the report gone with its lease", timeout=30)
        await until(lambda: scaled(cp, "lease") == (1, 1), "back to minReplicas")


@pytest.mark.timeout(120)
async def test_a_scale_up_the_scheduler_cannot_place_says_so_and_goes_no_higher(store):
    async with control_plane(store, nodes=("n1",), gpus=2, settings=FAST, placer=SchedulerController(),
                             extra=(AutoscalerController(ControllerSettings(**FAST)),)) as cp:
        await store.create(autoscaled("wide", minReplicas=1, maxReplicas=8, scaleDownStabilizationSeconds=0))
        await report(store, "gw-a", wide=6)                        # ceil(6 / 2) = 3; 2 GPUs hold 2

        def unplaceable():
            m = cp.cache.get(Model, "wide")
            cond = m and get_condition(m.status.conditions, SCALED)
            return cond if cond is not None and cond.reason == "Unplaceable" else None
        cond = await until(unplaceable, "the Scaled condition saying the scale-up cannot be placed")
        assert cond.status == "False" and cond.message.startswith("1 of 3 replicas cannot be placed (")
        await report(store, "gw-a", wide=16)                       # would be 8: held at 3
        await until(lambda: cp.events("Unplaceable", "wide"), "a warning event")
        for _ in range(5):   # several looks at the higher demand (autoscale_interval 0.1 s)
            await until(lambda: cp.cache.get(Model, "wide").status.desiredReplicas == 3, "held at 3")
        assert len(cp.replicas("wide")) == 3

        await report(store, "gw-a", wide=2)                        # 1 wanted: it fits again
        await until(lambda: (c := get_condition(cp.cache.get(Model, "wide").status.conditions, SCALED))
                    and c.reason != "Unplaceable", "the condition cleared once every replica is placed",
                    timeout=60)


@pytest.mark.timeout(120)
async def test_three_gateways_under_a_sawtooth_make_at_most_one_move_per_direction_per_window(store):
    """kubeai#67's flapping, avoided by the windows: three gateways report a load that swings
    between high and low every half second; each direction moves at most once per window (here:
    up once or twice, never down: every down-window holds a high report)."""
    up_window, down_window = 2, 3
    async with control_plane(store, gpus=4, settings=FAST,
                             extra=(AutoscalerController(ControllerSettings(**FAST)),)) as cp:
        await store.create(autoscaled("saw", minReplicas=1, scaleUpStabilizationSeconds=up_window,
                                      scaleDownStabilizationSeconds=down_window, scaleToZeroDelaySeconds=600))
        loop = asyncio.get_running_loop()
        moves: list[tuple[float, int]] = []          # (when, desired) at each change seen

        async def watch() -> None:
            last = None
            while True:
                m = cp.cache.get(Model, "saw")
                desired = m.status.desiredReplicas if m else None
                if desired is not None and desired != last:
                    moves.append((loop.time(), desired))
                    last = desired
                await asyncio.sleep(0.02)
        watcher = asyncio.create_task(watch())
        try:
            end = loop.time() + 9.0
            high = True
            while loop.time() < end:
                for gw in ("gw-a", "gw-b", "gw-c"):
                    await report(store, gw, saw=3 if high else 1)   # 9 in flight (4 wanted), then 3 (2)
                high = not high
                await asyncio.sleep(0.5)
        finally:
            watcher.cancel()
    steps = list(zip(moves, moves[1:], strict=False))
    ups = [t for (_, a), (t, b) in steps if b > a]
    downs = [t for (_, a), (t, b) in steps if b < a]
    for times, window in ((ups, up_window), (downs, down_window)):
        assert all(b - a >= window * 0.9 for a, b in zip(times, times[1:], strict=False)), (moves, window)
    assert len(ups) + len(downs) <= 9.0 / up_window + 9.0 / down_window, moves
    assert downs == [] and len(ups) <= 2, moves
