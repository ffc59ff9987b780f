"""Model controller: keeps ``spec.replicas`` Ready replicas of the Model's current template
(with ``spec.autoscaling``: the autoscaler's ``status.desiredReplicas``, ``Model.wanted_replicas``).

* Replica names are ``<model>-<templatehash>-<5 random chars>`` (the model part
  is cut so that the name stays within 60 characters: shard names append
  ``-<rank>``); each replica has an ownerReference to the Model, the label
  ``llmgw.io/model=<model>`` and the finalizer ``llmgw.io/shards`` (removed by
  the replica controller once its shards are gone).
* Scaling down removes unscheduled replicas first, then unready ones, then
  Ready ones (newest first).
* A template change (``template_hash``) rolls make-before-break: at most
  ``spec.replicas + update.maxSurge`` replicas exist, and a Ready replica of
  the old template is deleted only while at least
  ``spec.replicas - update.maxUnavailable`` replicas stay Ready.  Unready old
  replicas go at once.
* A replica of the current template that stays unplaced longer than
  ``spec.placementDeadlineSeconds`` with profile i is replaced by one with
  profile i+1 (if there is one).  "Unplaced since" is the latest of its
  creation, its crash backoff end, and its Scheduled=False transition.
* Drain cooperation (see llmgw/api/wellknown.py): replicas being drained
  are neither counted nor scaled down.
* When the Model is deleted (or a replica belongs to an older Model of the
  same name) its replicas are deleted; garbage collection does the same.

Writes Model status: replicas, readyReplicas, updatedReplicas, templateHash,
observedGeneration, conditions Available and Progressing. Progressing is
False with reason CrashLoop while a replica of the current template that is
not Ready has failed ``CRASH_LOOP_FAILURES`` or more times in a row; its
message carries that replica's last failure (with the end of the engine's log).

``plan(model, replicas, now)`` is the pure decision; ``ModelController``
carries it out.
"""
from __future__ import annotations

import asyncio
import logging
import random
import string
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable

from controllers.indexes import REPLICAS_BY_MODEL
from llmgw.api import AnyObject, Model, ObjectMeta, Replica, get_condition, template_hash
from llmgw.api.errors import NotFound
from llmgw.api.patches import ConditionPatch, ModelStatusPatch
from llmgw.api.types import ReplicaSpec
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT, MODEL_LABEL, SHARDS_FINALIZER
from llmgw.runtime.controller import Controller, Result, WatchedKind

log = logging.getLogger("llmgw.controllers.model")

REPLICA_NAME_MAX = 60
CRASH_LOOP_FAILURES = 2
CREATE_BATCH = 32


def replica_name(model: str, thash: str) -> str:
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    base = model[:REPLICA_NAME_MAX - len(thash) - 7].rstrip("-")
    return f"{base}-{thash}-{suffix}"


def is_ready(r: Replica) -> bool:
    return r.status.phase == "Ready"


def unplaced_since(r: Replica) -> datetime:
    times = [r.metadata.creationTimestamp or datetime.now(timezone.utc)]
    if r.status.backoffUntil:
        times.append(r.status.backoffUntil)
    c = get_condition(r.status.conditions, "Scheduled")
    if c is not None and c.status != "True" and c.lastTransitionTime:
        times.append(c.lastTransitionTime)
    return max(times)


def _victim_order(r: Replica) -> tuple[bool, bool, float]:
    """Sort key: the replica to remove first comes first."""
    created = (r.metadata.creationTimestamp or datetime.now(timezone.utc)).timestamp()
    return (bool(r.spec.placement), is_ready(r), -created)


@dataclass
class Plan:
    template_hash: str                                              # of the model's current template
    create: list[int] = field(default_factory=list)                 # profile index per new replica
    delete: list[tuple[Replica, str, str]] = field(default_factory=list)   # (replica, reason, message)
    status: ModelStatusPatch = field(default_factory=ModelStatusPatch)  # Model status fields to write
    requeue_after: float | None = None


def plan(model: Model, replicas: list[Replica], now: datetime) -> Plan:
    spec = model.spec
    thash = template_hash(spec)
    want = model.wanted_replicas
    out = Plan(template_hash=thash)
    active = [r for r in replicas if r.metadata.deletionTimestamp is None]
    names = {r.name for r in active}
    replaced = {r.metadata.annotations[DRAINING_REPLACEMENT_FOR] for r in active
                if DRAINING_REPLACEMENT_FOR in r.metadata.annotations} & names
    evicted = [r for r in active if EVICT in r.metadata.annotations and r.name not in replaced]
    staying = [r for r in active if r.name not in replaced and EVICT not in r.metadata.annotations]
    protected = {r.name for r in staying if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) in replaced}
    new = [r for r in staying if r.spec.templateHash == thash]
    old = [r for r in staying if r.spec.templateHash != thash]

    # 1. unplaced past the deadline: swap for the next profile
    for r in new:
        if r.spec.placement or is_ready(r) or r.spec.profileIndex + 1 >= len(spec.profiles):
            continue
        left = spec.placementDeadlineSeconds - (now - unplaced_since(r)).total_seconds()
        if left > 0:
            out.requeue_after = left if out.requeue_after is None else min(out.requeue_after, left)
            continue
        out.create.append(r.spec.profileIndex + 1)
        out.delete.append((r, "PlacementDeadline",
                           f"unplaced for {spec.placementDeadlineSeconds}s with profile {r.spec.profileIndex}; "
                           f"trying profile {r.spec.profileIndex + 1}"))

    # 2. new replicas, within the surge budget while rolling
    max_total = want + (spec.update.maxSurge if old else 0)
    room = max_total - len(staying)
    out.create += [0] * max(0, min(want - len(new), room))

    # 3. surplus of the current template (scale down)
    deleting = {r.name for r, _, _ in out.delete}
    surplus = len(new) - want
    if surplus > 0:  # the sort is the costly part of a plan: only when scaling down
        victims = sorted((r for r in new if r.name not in deleting and r.name not in protected), key=_victim_order)
        for r in victims[:surplus]:
            out.delete.append((r, "ScaledDown", f"scaled down to {want} replicas"))
            deleting.add(r.name)

    # 4. old template: unready ones at once, Ready ones while enough stay Ready
    min_ready = max(0, want - spec.update.maxUnavailable)
    ready = sum(1 for r in staying if is_ready(r) and r.name not in deleting)
    for r in sorted((r for r in old if r.name not in protected), key=_victim_order):
        if not is_ready(r):
            out.delete.append((r, "Outdated", f"template {r.spec.templateHash} replaced by {thash}"))
        elif ready - 1 >= min_ready:
            out.delete.append((r, "Outdated", f"template {r.spec.templateHash} replaced by {thash}; "
                                              f"{ready - 1} replicas stay Ready"))
            ready -= 1

    # 5. evicted replicas nobody else replaces: once the rest is Ready enough
    for r in evicted:
        if not is_ready(r) or ready >= max(min_ready, 1 if want else 0):
            out.delete.append((r, "Evicted", f"evicted ({r.metadata.annotations[EVICT]}); replacement in place"))

    # status
    ready_all = sum(1 for r in active if is_ready(r))
    updated = sum(1 for r in active if r.spec.templateHash == thash)
    staying_ready = sum(1 for r in staying if is_ready(r))
    available = staying_ready >= min_ready
    conds: list[ConditionPatch] = [{
        "type": "Available", "status": "True" if available else "False",
        "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
        "message": f"{staying_ready}/{want} replicas Ready (at least {min_ready} required)",
        "observedGeneration": model.metadata.generation,
    }]
    complete = not old and not evicted and len(new) == want and all(is_ready(r) for r in new)
    if complete:
        reason, msg = "RolloutComplete", f"{want} replicas of template {thash} Ready"
    elif old:
        reason, msg = "ReplicasUpdating", f"{len(new)}/{want} replicas of template {thash}, {len(old)} old remaining"
    else:
        reason, msg = "ScalingReplicas", f"{sum(1 for r in new if is_ready(r))}/{want} replicas Ready"
    looping = crash_looping(new)
    conds.append({"type": "Progressing", "status": "False" if looping else "True",
                  "reason": "CrashLoop" if looping else reason, "message": looping or msg,
                  "observedGeneration": model.metadata.generation})
    out.status = {"observedGeneration": model.metadata.generation, "replicas": len(active),
                  "readyReplicas": ready_all, "updatedReplicas": updated, "templateHash": thash,
                  "conditions": conds}
    return out


def crash_looping(replicas: list[Replica]) -> str:
    """Why the first crash-looping replica (unready, failed again and again) keeps failing ('' if none)."""
    for r in replicas:
        if r.status.consecutiveFailures >= CRASH_LOOP_FAILURES and not is_ready(r):
            ready = get_condition(r.status.conditions, "Ready")
            cause = ready.message if ready is not None and ready.status == "False" else r.status.message
            return f"replica {r.name} failed {r.status.consecutiveFailures} times in a row: {cause}"
    return ""


def _status_differs(model: Model, status: ModelStatusPatch) -> bool:
    st = model.status
    for k, v in status.items():
        if k == "conditions":
            for c in status["conditions"]:
                cur = get_condition(st.conditions, c["type"])
                if cur is None or (cur.status, cur.reason, cur.message, cur.observedGeneration) != (
                        c["status"], c["reason"], c["message"], c["observedGeneration"]):
                    return True
        elif getattr(st, k) != v:
            return True
    return False


class ModelController(Controller):
    name = "model"
    watches = (Model, Replica)
    indexes = (REPLICAS_BY_MODEL,)
    batch_seconds = 0.1
    workers = 8   # models reconcile on their own: the creates of several overlap

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if type(obj) is Model:
            return [obj.metadata.name]
        if type(obj) is Replica:
            return [obj.spec.model]
        return []

    async def reconcile(self, key: str) -> Result | None:
        cache = self.ctx.cache
        model = cache.get(Model, key)
        replicas = cache.index(Replica, "model", key)
        if model is None or model.metadata.deletionTimestamp is not None:
            for r in replicas:
                if r.metadata.deletionTimestamp is None:
                    await self._delete(r, "ModelDeleted", f"model {key} is being deleted")
            return None
        mine: list[Replica] = []
        foreign: list[Replica] = []
        for r in replicas:
            owners = [o for o in r.metadata.ownerReferences if o.kind == "Model"]
            (foreign if owners and owners[0].uid != model.metadata.uid else mine).append(r)
        for r in foreign:
            if r.metadata.deletionTimestamp is None:
                await self._delete(r, "Orphaned", f"owned by an earlier model {key}")

        p = plan(model, mine, datetime.now(timezone.utc))
        # Writes of one step go out together, in batches (like a ReplicaSet's slow
        # start): a hundred new replicas cost a few round trips, not a hundred.
        for i in range(0, len(p.create), CREATE_BATCH):
            await asyncio.gather(*(self._create(model, p.template_hash, index)
                                   for index in p.create[i:i + CREATE_BATCH]))
        for r, reason, message in p.delete:
            await self._delete(r, reason, message)
        if _status_differs(model, p.status):
            updated = await self.ctx.store.patch_status(Model, key, p.status, current=model)
            cache.assume(updated)
        return Result(requeue_after=p.requeue_after) if p.requeue_after is not None else None

    async def _create(self, model: Model, thash: str, index: int) -> None:
        spec = model.spec
        profile = spec.profiles[index]
        replica = Replica(
            metadata=ObjectMeta(
                name=replica_name(model.name, thash),
                labels={MODEL_LABEL: model.name},
                finalizers=[SHARDS_FINALIZER],
                ownerReferences=[model.owner_reference()],
            ),
            spec=ReplicaSpec(model=model.name, templateHash=thash, profileIndex=index, profile=profile,
                             source=spec.source, servedModelNames=model.served_names,
                             nodeSelector=dict(spec.nodeSelector)),
        )
        created = await self.ctx.store.create(replica)
        self.ctx.cache.assume(created)
        self.ctx.events.record(model, "Normal", "ReplicaCreated",
                               f"created replica {created.name} (profile {index}: {profile.engine}, "
                               f"{profile.nodes} node(s) x {profile.gpusPerNode} GPU(s))")

    async def _delete(self, r: Replica, reason: str, message: str) -> None:
        try:
            gone = await self.ctx.store.delete(Replica, r.name)
        except NotFound:
            self.ctx.cache.assume_deleted(Replica, r.name)
            return
        self.ctx.cache.assume_deletion(gone)
        model = self.ctx.cache.get(Model, r.spec.model)
        self.ctx.events.record(model or r, "Normal", reason, f"deleting replica {r.name}: {message}")
