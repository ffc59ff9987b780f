"""Autoscaler: decides each autoscaled Model's replica count from the gateways' demand.

Demand is what the gateways report (``/llmgw/demand/<gateway>``, each under its gateway's lease:
a dead gateway's figures expire with it), summed per model over the live reports: requests in
flight plus requests waiting. Every ``autoscale_interval`` seconds, and at every report, a model's
*recommendation* is ``clamp(ceil(demand / targetInFlight), minReplicas, maxReplicas)``, except
that no demand recommends 0 for a model that has replicas only once there has been none for
``scaleToZeroDelaySeconds`` (until then at least 1); a model at zero with no demand stays there
(a new model at minReplicas 0 starts no replica before its first request). The desired count then
moves, as Kubernetes' HPA does:

* up, to the lowest recommendation of the last ``scaleUpStabilizationSeconds`` (0: at once);
* down, to the highest recommendation of the last ``scaleDownStabilizationSeconds``: only when
  every recommendation of the window is lower. A new leadership term knows no history, so it
  scales nothing down before it has watched a whole window (several managers never flap a model).

The count is written to the Model's ``status.desiredReplicas`` (never its spec: `llmgw apply` of
the same manifest changes nothing), with the condition ``Scaled`` and an event saying why ("12 in
flight over 2 replicas, target 4 per replica -> 3"); the model controller keeps that many.

A scale-up the scheduler cannot place says so instead of growing: while replicas of the model
are unschedulable (their condition Scheduled=False), ``Scaled`` is False with reason
``Unplaceable`` and the scheduler's words, and the count does not go up further (it may go
down); once they are placed, scaling up resumes.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from controllers.indexes import REPLICAS_BY_MODEL
from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import SCALED, AnyObject, AutoscalingSpec, Model, Replica, get_condition
from llmgw.api.demand import ModelDemand, total_demand
from llmgw.api.patches import ModelStatusPatch
from llmgw.runtime.controller import DEMAND, Context, Controller, Result, WatchedKind


@dataclass
class _History:
    """What the autoscaler remembers of one model in this term."""

    since: float                                                   # first look at it this term
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)   # (when, count)
    idle_since: float | None = None                                # no demand at all since then


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str        # ScaledUp, ScaledDown, ScaledToZero, or Steady
    message: str


def recommend(scaling: AutoscalingSpec, demand: ModelDemand, idle_for: float, current: int) -> int:
    """The count the demand asks for now, within the bounds; no demand asks a model with replicas
    for zero only after the delay (the delay keeps a replica; it never starts one)."""
    wanted = math.ceil(demand.total / scaling.targetInFlight)
    if wanted == 0 and current and idle_for < scaling.scaleToZeroDelaySeconds:
        wanted = 1
    return scaling.clamp(wanted)


def decide(scaling: AutoscalingSpec, current: int, history: _History, now: float, demand: ModelDemand,
           replicas: int) -> Decision:
    """Record this look's recommendation and stabilize it (see the module's docstring)."""
    idle_for = 0.0 if history.idle_since is None else now - history.idle_since
    rec = recommend(scaling, demand, idle_for, current)
    recs = history.recommendations
    recs.append((now, rec))
    keep = max(scaling.scaleUpStabilizationSeconds, scaling.scaleDownStabilizationSeconds)
    while recs and recs[0][0] < now - keep:
        recs.popleft()
    up = min(r for t, r in recs if t >= now - scaling.scaleUpStabilizationSeconds)
    down = max(r for t, r in recs if t >= now - scaling.scaleDownStabilizationSeconds)
    desired = current
    if up > current:
        desired = up
    elif down < current and now - history.since >= scaling.scaleDownStabilizationSeconds:
        desired = down
    waiting = f" and {demand.waiting} waiting" if demand.waiting else ""
    why = (f"{demand.inFlight} in flight{waiting} over {replicas} replicas, target {scaling.targetInFlight} "
           f"per replica -> {desired}")
    if desired == current:
        return Decision(current, "Steady", why)
    if desired == 0:
        return Decision(0, "ScaledToZero", f"no demand for {idle_for:.0f}s: {why}")
    return Decision(desired, "ScaledUp" if desired > current else "ScaledDown", why)


class AutoscalerController(Controller):
    name = "autoscaler"
    watches = (Model, DEMAND, Replica)   # replicas: read at each look, never a reason for one
    indexes = (REPLICAS_BY_MODEL,)

    def __init__(self, settings: ControllerSettings = DEFAULTS) -> None:
        self.settings = settings

    def start(self, ctx: Context) -> None:
        super().start(ctx)
        self._history: dict[str, _History] = {}   # per term: a new leader watches a window afresh

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if type(obj) is Model:
            return [obj.name]
        if kind == DEMAND:   # a gateway's report changed or expired: every autoscaled model may move
            return [m.name for m in self.ctx.cache.list(Model) if m.spec.autoscaling is not None]
        return []

    async def reconcile(self, key: str) -> Result | None:
        model = self.ctx.cache.get(Model, key)
        if model is None or model.metadata.deletionTimestamp is not None:
            self._history.pop(key, None)
            return None
        scaling = model.spec.autoscaling
        if scaling is None:
            self._history.pop(key, None)
            if model.status.desiredReplicas is not None:   # autoscaling was turned off: spec.replicas counts
                await self._write(model, {"desiredReplicas": None})
            return None
        now = self.ctx.clock()
        history = self._history.setdefault(key, _History(since=now))
        demand = total_demand(self.ctx.cache.demand(), key)
        if demand.total:
            history.idle_since = None
        elif history.idle_since is None:
            history.idle_since = now
        current = model.wanted_replicas
        d = decide(scaling, current, history, now, demand, model.status.replicas)
        unplaced = self._unschedulable(key)
        status: Literal["True", "False"] = "True"
        reason, message = d.reason, d.message
        if unplaced:
            if d.desired > current:
                d = Decision(current, "Unplaceable", d.message)
            status, reason = "False", "Unplaceable"
            message = (f"{len(unplaced)} of {d.desired} replicas cannot be placed ({unplaced[0]}); "
                       f"not scaling up until they are: {d.message}")
        held = get_condition(model.status.conditions, SCALED)
        if (d.desired != current or model.status.desiredReplicas is None
                or (unplaced and (held is None or (held.status, held.reason) != (status, reason)))
                or (not unplaced and held is not None and held.reason == "Unplaceable")):
            await self._write(model, {"desiredReplicas": d.desired, "conditions": [{
                "type": SCALED, "status": status, "reason": reason, "message": message,
                "observedGeneration": model.metadata.generation}]})
            if d.desired != current:
                self.ctx.events.record(model, "Normal", d.reason, d.message)
            elif unplaced and (held is None or held.reason != "Unplaceable"):
                self.ctx.events.record(model, "Warning", "Unplaceable", message)
        return Result(requeue_after=self.settings.autoscale_interval)

    def _unschedulable(self, model: str) -> list[str]:
        """The scheduler's words for each replica of `model` it could not place."""
        out = []
        for r in self.ctx.cache.index(Replica, REPLICAS_BY_MODEL.name, model):
            cond = get_condition(r.status.conditions, "Scheduled")
            if not r.spec.placement and r.metadata.deletionTimestamp is None and cond is not None \
                    and cond.status == "False":
                out.append(cond.message)
        return out

    async def _write(self, model: Model, patch: ModelStatusPatch) -> None:
        self.ctx.cache.assume(await self.ctx.store.patch_status(Model, model.name, patch, current=model))
