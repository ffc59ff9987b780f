"""Model controller: keeps ``spec.replicas`` Ready replicas of the Model's current template
(with ``spec.autoscaling``: the autoscaler's ``status.desiredReplicas``, ``Model.wanted_replicas``).

* Replica names are ``<model>-<templatehash>-<5 random chars>`` (the model part
  is cut so that the name stays within 60 characters: shard names append
  ``-<rank>``); each replica has an ownerReference to the Model, the label
  ``llmgw.io/model=<model>`` and the finalizer ``llmgw.io/shards`` (removed by
  the replica controller once its shards are gone).
* Scaling down is make-before-break's mirror: it removes unplaced and Failed
  replicas first, then Ready ones while as many as wanted stay Ready, those
  whose removal frees whole nodes first (no other replica on them), newest
  first among equals; a replica still starting (placed, its engine pulling or
  loading) is never chosen: the surplus waits until it is Ready (or Failed).
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

* A replica of a Model whose source the controller-manager can read (a directory or GGUF
  file it sees, or a pulled source's heads before the pull) carries ``spec.memory``: what
  each of its GPUs must have free, estimated from the model's files (controllers/estimates.py,
  read in a thread once per spec, not in the reconcile); no replica of such a Model is
  created before its estimate is read (for at most READ_WAIT). The scheduler then refuses
  GPUs with less, and gives the placed replica its KV budget (spec.kvCache).

Writes Model status: replicas, readyReplicas, updatedReplicas, templateHash,
observedGeneration, fit (each profile's estimate, or why none, and the fewest KV tokens a
placed replica of it was given), conditions Available, Progressing and MemoryEstimated.
Progressing is False with reason CrashLoop while a replica of the current template that is
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
from typing import Callable, Iterable

from controllers.estimates import READ_WAIT, Estimates, NoEstimate, ProfileResult, api_estimate, fit_status
from controllers.indexes import REPLICAS_BY_MODEL, REPLICAS_BY_NODE
from llmgw.api import AnyObject, Model, ObjectMeta, Replica, ReplicaSpec, get_condition, kv_events, template_hash
from llmgw.api.errors import NotFound
from llmgw.api.patches import ConditionPatch, ModelStatusPatch
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT, MODEL_LABEL, SHARDS_FINALIZER
from llmgw.engines import ENGINES
from llmgw.fit import Estimate
from llmgw.runtime.controller import Context, Controller, Result, WatchedKind

log = logging.getLogger("llmgw.controllers.model")

REPLICA_NAME_MAX = 60
CRASH_LOOP_FAILURES = 2
CREATE_BATCH = 32
BATCH_REPLICAS = 200


def replica_name(model: str, thash: str) -> str:
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    base = model[:REPLICA_NAME_MAX - len(thash) - 7].rstrip("-")
    return f"{base}-{thash}-{suffix}"


def unplaced_since(r: Replica) -> datetime:
    times = [r.metadata.creationTimestamp or datetime.now(timezone.utc)]
    if r.status.backoffUntil:
        times.append(r.status.backoffUntil)
    c = get_condition(r.status.conditions, "Scheduled")
    if c is not None and c.status != "True" and c.lastTransitionTime:
        times.append(c.lastTransitionTime)
    return max(times)


class Facts:
    """What a plan reads of a replica, taken once per object: the cache replaces a replica's
    object on every change, so a plan keeps the facts of each object it saw (a ``Memo``) and a
    reconcile of a model with a thousand replicas reads each unchanged one in one lookup."""

    __slots__ = ("replica", "name", "active", "thash", "ready", "placed", "profile", "replaces", "evict",
                 "failures", "owner_uid", "kv_tokens")

    def __init__(self, r: Replica) -> None:
        meta, spec = r.metadata, r.spec
        self.replica = r
        self.name = meta.name
        self.active = meta.deletionTimestamp is None
        self.thash = spec.templateHash
        self.ready = r.status.phase == "Ready"
        self.placed = bool(spec.placement)
        self.profile = spec.profileIndex
        self.replaces = meta.annotations.get(DRAINING_REPLACEMENT_FOR)
        self.evict = meta.annotations.get(EVICT)
        self.failures = r.status.consecutiveFailures
        owner = next((o for o in meta.ownerReferences if o.kind == "Model"), None)
        self.owner_uid = owner.uid if owner is not None else None
        self.kv_tokens = spec.kvCache.tokens if spec.kvCache is not None else None


Memo = dict[str, Facts]   # replica name -> the facts of the last object seen under that name


def facts_of(replicas: list[Replica], memo: Memo) -> list[Facts]:
    """The facts of each replica, from `memo` where its object is the one seen before; forgets
    replicas no longer there once the memo holds twice as many names as `replicas`."""
    out = []
    for r in replicas:
        f = memo.get(r.metadata.name)
        if f is None or f.replica is not r:
            f = memo[r.metadata.name] = Facts(r)
        out.append(f)
    if len(memo) > 2 * len(out) + 64:
        keep = {f.name for f in out}
        for name in [n for n in memo if n not in keep]:
            del memo[name]
    return out


def _victim_order(f: Facts) -> tuple[bool, bool, float]:
    """Sort key: the replica to remove first comes first."""
    return (f.placed, f.ready, -_created(f))


def _created(f: Facts) -> float:
    return (f.replica.metadata.creationTimestamp or datetime.now(timezone.utc)).timestamp()


def _scale_down_victims(candidates: list[Facts], surplus: int, spare_ready: int,
                        replicas_on: Callable[[str], int]) -> list[Facts]:
    """Which of the current template's replicas go when there are `surplus` too many (see the module's
    docstring): at most `spare_ready` Ready ones. `replicas_on(node)`: the live replicas placed on a
    node, of every model."""
    idle = [f for f in candidates if not f.placed or f.replica.status.phase == "Failed"]
    victims = sorted(idle, key=_victim_order)[:surplus]
    ready = [f for f in candidates if f.ready]
    users: dict[str, int] = {}

    def frees(f: Facts) -> tuple[int, float]:   # whole nodes its removal frees, then the newest
        nodes = {p.node for p in f.replica.spec.placement}
        return sum(1 for n in nodes if users.setdefault(n, replicas_on(n)) <= 1), _created(f)

    for _ in range(min(surplus - len(victims), len(ready), spare_ready)):
        f = max(ready, key=frees)
        ready.remove(f)
        victims.append(f)
        for n in {p.node for p in f.replica.spec.placement}:
            users[n] = users.setdefault(n, replicas_on(n)) - 1
    return victims


@dataclass
class Plan:
    template_hash: str                                              # of the model's current template
    create: list[int] = field(default_factory=list)                 # profile index per new replica
    delete: list[tuple[Replica, str, str]] = field(default_factory=list)   # (replica, reason, message)
    status: ModelStatusPatch = field(default_factory=ModelStatusPatch)  # Model status fields to write
    requeue_after: float | None = None


def plan(model: Model, replicas: list[Replica], now: datetime, memo: Memo | None = None,
         replicas_on: Callable[[str], int] = lambda node: 0) -> Plan:
    return plan_facts(model, facts_of(replicas, {} if memo is None else memo), now, replicas_on)


def plan_facts(model: Model, replicas: list[Facts], now: datetime,
               replicas_on: Callable[[str], int] = lambda node: 0) -> Plan:
    """`replicas_on(node)`: the live replicas of every model placed on a node (scale-down frees nodes)."""
    spec = model.spec
    thash = template_hash(spec)
    want = model.wanted_replicas
    out = Plan(template_hash=thash)
    active = [f for f in replicas if f.active]
    names = {f.name for f in active}
    replaced = {f.replaces for f in active if f.replaces is not None} & names
    evicted: list[Facts] = []
    staying: list[Facts] = []
    for f in active:
        if f.name in replaced:
            continue
        (staying if f.evict is None else evicted).append(f)
    protected = {f.name for f in staying if f.replaces in replaced}
    new = [f for f in staying if f.thash == thash]
    old = [f for f in staying if f.thash != thash]

    # 1. unplaced past the deadline: swap for the next profile
    for f in new:
        if f.placed or f.ready or f.profile + 1 >= len(spec.profiles):
            continue
        left = spec.placementDeadlineSeconds - (now - unplaced_since(f.replica)).total_seconds()
        if left > 0:
            out.requeue_after = left if out.requeue_after is None else min(out.requeue_after, left)
            continue
        out.create.append(f.profile + 1)
        out.delete.append((f.replica, "PlacementDeadline",
                           f"unplaced for {spec.placementDeadlineSeconds}s with profile {f.profile}; "
                           f"trying profile {f.profile + 1}"))

    # 2. new replicas, within the surge budget while rolling
    max_total = want + (spec.update.maxSurge if old else 0)
    room = max_total - len(staying)
    out.create += [0] * max(0, min(want - len(new), room))

    # 3. surplus of the current template (scale down)
    deleting = {r.name for r, _, _ in out.delete}
    surplus = len(new) - want
    if surplus > 0:  # the choice is the costly part of a plan: only when scaling down
        candidates = [f for f in new if f.name not in deleting and f.name not in protected]
        spare = sum(1 for f in active if f.ready and f.name not in deleting) - want
        for f in _scale_down_victims(candidates, surplus, spare, replicas_on):
            out.delete.append((f.replica, "ScaledDown", f"scaled down to {want} replicas"))
            deleting.add(f.name)

    # 4. old template: unready ones at once, Ready ones while enough stay Ready
    min_ready = max(0, want - spec.update.maxUnavailable)
    ready = sum(1 for f in staying if f.ready and f.name not in deleting)
    for f in sorted((f for f in old if f.name not in protected), key=_victim_order):
        if not f.ready:
            out.delete.append((f.replica, "Outdated", f"template {f.thash} replaced by {thash}"))
        elif ready - 1 >= min_ready:
            out.delete.append((f.replica, "Outdated", f"template {f.thash} replaced by {thash}; "
                                                      f"{ready - 1} replicas stay Ready"))
            ready -= 1

    # 5. evicted replicas nobody else replaces: once the rest is Ready enough
    for f in evicted:
        if not f.ready or ready >= max(min_ready, 1 if want else 0):
            out.delete.append((f.replica, "Evicted", f"evicted ({f.evict}); replacement in place"))

    # status
    ready_all = sum(1 for f in active if f.ready)
    updated = sum(1 for f in active if f.thash == thash)
    staying_ready = sum(1 for f in staying if f.ready)
    new_ready = sum(1 for f in new if f.ready)
    available = staying_ready >= min_ready
    conds: list[ConditionPatch] = [{
        "type": "Available", "status": "True" if available else "False",
        "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
        "message": f"{staying_ready}/{want} replicas Ready (at least {min_ready} required)",
        "observedGeneration": model.metadata.generation,
    }]
    complete = not old and not evicted and len(new) == want and new_ready == len(new)
    if complete:
        reason, msg = "RolloutComplete", f"{want} replicas of template {thash} Ready"
    elif old:
        reason, msg = "ReplicasUpdating", f"{len(new)}/{want} replicas of template {thash}, {len(old)} old remaining"
    else:
        reason, msg = "ScalingReplicas", f"{new_ready}/{want} replicas Ready"
    looping = crash_looping(new)
    conds.append({"type": "Progressing", "status": "False" if looping else "True",
                  "reason": "CrashLoop" if looping else reason, "message": looping or msg,
                  "observedGeneration": model.metadata.generation})
    out.status = {"observedGeneration": model.metadata.generation, "replicas": len(active),
                  "readyReplicas": ready_all, "updatedReplicas": updated, "templateHash": thash,
                  "conditions": conds}
    return out


def crash_looping(replicas: list[Facts]) -> str:
    """Why the first crash-looping replica (unready, failed again and again) keeps failing ('' if none)."""
    for f in replicas:
        if f.failures >= CRASH_LOOP_FAILURES and not f.ready:
            r = f.replica
            ready = get_condition(r.status.conditions, "Ready")
            cause = ready.message if ready is not None and ready.status == "False" else r.status.message
            return f"replica {f.name} failed {f.failures} times in a row: {cause}"
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
        elif k == "fit":
            if [f.model_dump(mode="json") for f in st.fit] != v:
                return True
        elif getattr(st, k) != v:
            return True
    return False


def _inputs(model: Model) -> tuple[object, ...]:
    """What a reconcile reads of its Model: the spec (its generation), identity, deletion, and the
    autoscaler's count; not the status this controller writes."""
    meta = model.metadata
    return meta.uid, meta.generation, meta.deletionTimestamp, model.status.desiredReplicas


class ModelController(Controller):
    name = "model"
    watches = (Model, Replica)
    indexes = (REPLICAS_BY_MODEL, REPLICAS_BY_NODE)
    batch_seconds = 0.1
    workers = 8   # models reconcile on their own: the creates of several overlap

    def batch_delay(self, key: str) -> float:
        # A reconcile reads every replica of its model, so replica events gather longer the more
        # replicas there are: 0.1 s per BATCH_REPLICAS. The model controller's cost per replica
        # event then stays the same from ten replicas to thousands (issue 34's 10,000-node run
        # spent half its CPU here with a fixed 0.1 s).
        n = self.ctx.cache.count(Replica, REPLICAS_BY_MODEL.name, key)
        return self.batch_seconds * max(1.0, n / BATCH_REPLICAS)

    def start(self, ctx: Context) -> None:
        super().start(ctx)
        self._memo: dict[str, Memo] = {}   # model -> its replicas' facts, for this term
        self._seen: dict[str, tuple[object, ...]] = {}   # model -> what of it the last reconcile read
        self._estimates = Estimates(lambda name: self.ctx.queue.add(name))

    async def stop(self) -> None:
        self._estimates.stop()

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if type(obj) is Model:
            # The echo of this controller's own status write changes nothing it reads: without
            # this, each reconcile that wrote the status was followed by another at once, and
            # the replica events' batching was halved (a predicate, as controller-runtime's).
            cur = self.ctx.cache.get(Model, obj.metadata.name)
            if cur is not None and self._seen.get(cur.metadata.name) == _inputs(cur):
                return []
            return [obj.metadata.name]
        if type(obj) is Replica:
            return [obj.spec.model]
        return []

    async def reconcile(self, key: str) -> Result | None:
        cache = self.ctx.cache
        model = cache.get(Model, key)
        replicas = cache.index(Replica, "model", key)
        if model is None or model.metadata.deletionTimestamp is not None:
            self._memo.pop(key, None)
            self._seen.pop(key, None)
            self._estimates.forget(key)
            for r in replicas:
                if r.metadata.deletionTimestamp is None:
                    await self._delete(r, "ModelDeleted", f"model {key} is being deleted")
            return None
        self._seen[key] = _inputs(model)
        memo = self._memo.setdefault(key, {})
        mine: list[Facts] = []
        for f in facts_of(replicas, memo):
            if f.owner_uid is None or f.owner_uid == model.metadata.uid:
                mine.append(f)
            elif f.active:
                await self._delete(f.replica, "Orphaned", f"owned by an earlier model {key}")

        def replicas_on(node: str) -> int:
            return sum(1 for r in cache.index(Replica, "node", node) if r.metadata.deletionTimestamp is None)

        p = plan_facts(model, mine, datetime.now(timezone.utc), replicas_on)
        fits = self._estimates.get(model)
        if fits is None and (wait := self._estimates.wait_left(key)) > 0:
            # its files are being read: created once they are (the read enqueues the model)
            p.create = []
            p.requeue_after = wait if p.requeue_after is None else min(p.requeue_after, wait)
        elif fits is not None and model.spec.source is not None:   # no source (the sim's): nothing to say
            p.status["fit"], cond = fit_status(fits, _context(mine), model.metadata.generation)
            p.status["conditions"].append(cond)
        made = fits or [NoEstimate(f"its files were not read within {READ_WAIT:g} s")] * len(model.spec.profiles)
        # Writes of one step go out together, in batches (like a ReplicaSet's slow
        # start): a hundred new replicas cost a few round trips, not a hundred.
        for i in range(0, len(p.create), CREATE_BATCH):
            batch = p.create[i:i + CREATE_BATCH]
            names = await asyncio.gather(*(self._create(model, p.template_hash, index, made[index])
                                           for index in batch))
            self._created(model, batch, names, made)
        for r, reason, message in p.delete:
            await self._delete(r, reason, message)
        if _status_differs(model, p.status):
            updated = await self.ctx.store.patch_status(Model, key, p.status, current=model)
            cache.assume(updated)
        return Result(requeue_after=p.requeue_after) if p.requeue_after is not None else None

    async def _create(self, model: Model, thash: str, index: int, fit: ProfileResult) -> str:
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
                             source=spec.source, digest=spec.digest, servedModelNames=model.served_names,
                             nodeSelector=dict(spec.nodeSelector), adapters=spec.adapters,
                             kvEvents=kv_events(spec) and ENGINES[profile.engine].kv_events,
                             memory=api_estimate(fit) if isinstance(fit, Estimate) else None),
        )
        created = await self.ctx.store.create(replica)
        self.ctx.cache.assume(created)
        return created.name

    def _created(self, model: Model, indexes: list[int], names: list[str],
                 fits: list[ProfileResult]) -> None:
        """One event per profile for a batch of creates (a scale-up to a thousand replicas is
        about thirty events, not a thousand writes), naming the first few replicas."""
        for index in dict.fromkeys(indexes):
            mine = [n for i, n in zip(indexes, names, strict=True) if i == index]
            profile = model.spec.profiles[index]
            shown = ", ".join(mine[:3]) + (f" and {len(mine) - 3} more" if len(mine) > 3 else "")
            what = f"replica {shown}" if len(mine) == 1 else f"{len(mine)} replicas: {shown}"
            fit = fits[index]
            said = f"; {fit.summary()}" if isinstance(fit, Estimate) else f"; no estimate: {fit.message}"
            self.ctx.events.record(model, "Normal", "ReplicaCreated",
                                   f"created {what} (profile {index}: {profile.engine}, "
                                   f"{profile.nodes} node(s) x {profile.gpusPerNode} GPU(s){said})")

    async def _delete(self, r: Replica, reason: str, message: str) -> None:
        try:
            gone = await self.ctx.store.delete(Replica, r.name)
        except NotFound:
            self.ctx.cache.assume_deleted(Replica, r.name)
            return
        self.ctx.cache.assume_deletion(gone)
        model = self.ctx.cache.get(Model, r.spec.model)
        self.ctx.events.record(model or r, "Normal", reason, f"deleting replica {r.name}: {message}")


def _context(replicas: list[Facts]) -> dict[int, int]:
    """Profile -> the fewest KV tokens a live replica of it was given at placement (spec.kvCache)."""
    out: dict[int, int] = {}
    for f in replicas:
        if f.active and f.kv_tokens is not None:
            out[f.profile] = min(out.get(f.profile, f.kv_tokens), f.kv_tokens)
    return out
