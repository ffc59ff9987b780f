"""Adapters: where each LoRA adapter is placed, and where it is resident (docs/contracts.md, "Adapters").

Keys: an Adapter's name; a change of a Model enqueues its adapters, of a Replica or a Shard the
adapters placed on that replica or reported by its engine and those of its model pinned or not
Ready, a gateway's demand report those it names.

- Placement (status.placement): the Ready replicas of the base Model asked to hold the adapter,
  spec.minReplicas of them (every one, when spec.pinned), and at least one while the gateways
  report requests for it (in flight or waiting: a request for an adapter resident nowhere waits
  in its queue at the gateway, whose report is sent at the first one) and for
  ``adapter_idle_seconds`` after the last (settings). A burst of requests for a cold adapter
  so makes one placement, one load. A replica keeps what it was given while it exists (one
  being rebuilt too: its agent loads the adapter again before it is Ready); new places are the
  Ready replicas with a free slot (the Model's spec.adapters.maxLoaded, less the adapters placed
  there), the emptiest first. Where none has one for an adapter with requests, the least
  recently requested adapter placed for demand alone (not pinned, past its minReplicas, no
  request now) is evicted from its replica (event Evicted) to make room. One worker: each
  placement is written and assumed in the cache before the next adapter's is decided, so no
  replica is given more adapters than it has slots.
- Direct loads (a gateway asked a replica's agent to load it at once: llmgw/gateway/loads.py):
  while a gateway's demand report says the adapter is `loading`, no place is added for its demand
  and nothing evicted for it. A Ready replica whose serving shard reports it Loaded where it is
  not placed is adopted (placement and resident in one write; its demand placement begins),
  unless the report is from before its agent saw this controller's last write taking it off
  there; a placed replica whose shard reports it Evicted (its agent unloaded it for another
  gateway's direct load) is dropped (event Evicted).
- Residency (status.resident): the placed replicas whose serving shard (rank 0) is Ready and lists
  the adapter Loaded, as its agent read it from the engine (llmgw/agent/adapters.py). A replica
  whose engine restarted is not resident until its agent has loaded the adapter again; a replica
  newly placed, until its shard reports a sync of its agent that saw the placement
  (status.adaptersSeen at least the placement's write's revision): an earlier report may be
  from before an unload there.
- status.pending says, for each placed replica where it is not resident, why: Loading,
  ReplicaNotReady, or LoadFailed with the engine's or the pull's words (and a Warning event).
- The condition Ready: True once resident on as many replicas as asked (Resident; OnDemand when
  none is asked and none holds it); else the reason: BaseModelNotFound, AdaptersDisabled (the
  Model has no spec.adapters), NoReplicas, NoFreeSlot, LoadFailed or Loading.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable

from controllers.indexes import (
    ADAPTERS_BY_MODEL,
    ADAPTERS_BY_PLACEMENT,
    ADAPTERS_WANTING,
    REPLICAS_BY_MODEL,
    SHARDS_BY_REPLICA,
)
from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import ADAPTER_READY, AnyObject, LoraAdapter, Model, Replica, Shard, ShardAdapter, get_condition
from llmgw.api.demand import total_demand
from llmgw.api.patches import AdapterPendingPatch, AdapterStatusPatch, ConditionPatch
from llmgw.runtime.controller import DEMAND, Context, Controller, Result, WatchedKind

# The placement of a replica placed in this reconcile, whose write's revision is not known yet.
_UNWRITTEN = sys.maxsize


class AdapterController(Controller):
    name = "adapter"
    watches = (LoraAdapter, Model, Replica, Shard, DEMAND)
    indexes = (ADAPTERS_BY_MODEL, ADAPTERS_BY_PLACEMENT, ADAPTERS_WANTING, REPLICAS_BY_MODEL, SHARDS_BY_REPLICA)
    workers = 1

    def __init__(self, settings: ControllerSettings = DEFAULTS) -> None:
        self.settings = settings
        self._demanded: dict[str, float] = {}   # adapter -> when its last look found demand (this term)
        self._evicted: dict[str, float] = {}    # adapter -> when it was last evicted (its demand before is spent)
        # (adapter, replica) -> the revision of the status write that newly placed it there: a report
        # of the replica's serving shard counts only once its agent has seen that placement
        # (status.adaptersSeen at least it); an earlier one may be from before an unload there.
        self._placed_at: dict[tuple[str, str], int] = {}
        # (adapter, replica) -> the revision of the status write that took it off there: a report of
        # it Loaded there is adopted only once its agent has seen that (an earlier one may be from
        # before its unload, which the write asked for).
        self._removed_at: dict[tuple[str, str], int] = {}

    def start(self, ctx: Context) -> None:
        super().start(ctx)
        self._demanded, self._evicted, self._placed_at, self._removed_at = {}, {}, {}, {}

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if isinstance(obj, str):    # a gateway's demand report changed or expired: the adapters it names
            # (one whose demand ended keeps its place until its requeue, adapter_idle_seconds on)
            named = {m for r in self.ctx.cache.demand() for m in r.models}
            return [a for a in named if self.ctx.cache.get(LoraAdapter, a) is not None]
        if type(obj) is LoraAdapter:
            return (obj.name,)
        if type(obj) is Model:
            return [a.name for a in self.ctx.cache.index(LoraAdapter, "model", obj.name)]
        # A replica or a shard: the adapters placed on its replica (or its engine reports), and those
        # of its model still short of replicas or pinned (on every one), which it may now take;
        # never all of a model's (a shard's every status write would look at a thousand adapters).
        replica = obj.name if type(obj) is Replica else obj.spec.replica
        reported = [a.name for a in obj.status.adapters] if type(obj) is Shard else []
        cache = self.ctx.cache
        return {*(a.name for a in cache.index(LoraAdapter, "placed", replica)), *reported,
                *(a.name for a in cache.index(LoraAdapter, "wanting", obj.spec.model))}

    async def reconcile(self, key: str) -> Result | None:
        adapter = self.ctx.cache.get(LoraAdapter, key)
        if adapter is None or adapter.metadata.deletionTimestamp is not None:
            return None
        model = self.ctx.cache.get(Model, adapter.spec.baseModel)
        ready = self._ready_replicas(adapter.spec.baseModel)
        usable = model is not None and model.spec.adapters is not None
        kept = self._drop_evicted(adapter) if usable else []
        adopted = self._adopted(adapter, ready, kept) if usable else []
        hot, hot_for = self._hot(adapter.name)
        demand = total_demand(self.ctx.cache.demand(), adapter.name)
        asked = len(ready) if adapter.spec.pinned else adapter.spec.minReplicas
        wanted = max(asked, 1 if hot else 0)
        placement: list[str] = []
        if model is None:
            why: tuple[str, str] | None = ("BaseModelNotFound", f"Model {adapter.spec.baseModel} does not exist")
        elif model.spec.adapters is None:
            why = ("AdaptersDisabled", f"Model {model.name} has no spec.adapters: its engines load no adapters")
        else:
            # a gateway loading it directly on a replica: no place of the controller's own for the demand
            placement, placed_ready = self._place(adapter, ready, wanted, kept + adopted,
                                                  asked if demand.loading else wanted)
            if placed_ready < wanted and not adapter.spec.pinned and demand.total and not demand.loading:
                freed = await self._evict_for(adapter, ready, placement)
                if freed is not None:
                    placement, placed_ready = [*placement, freed], placed_ready + 1
            short, slots = wanted - placed_ready, model.spec.adapters.maxLoaded
            why = None if short <= 0 else ("NoReplicas", f"Model {model.name} has no Ready replica") if not ready \
                else ("Loading", "a gateway loads it on a replica directly") if demand.loading \
                else ("NoFreeSlot", f"{short} more replica(s) of {model.name} asked for, but none of its Ready "
                                    f"replicas has a free slot (spec.adapters.maxLoaded {slots})")
        self._note_placed(adapter, placement, adopted)
        resident, pending = self._residency(adapter, placement, ready)
        if why is None and len(resident) < wanted:
            failed = [p for p in pending if p["reason"] == "LoadFailed"]
            why = ("LoadFailed", "; ".join(f"{p['replica']}: {p['message']}" for p in failed)) if failed else (
                "Loading", f"resident on {len(resident)} of {wanted} replica(s)")
        ok = ("Resident", f"resident on {', '.join(resident)}") if resident else (
            "OnDemand", "minReplicas 0 and no requests for it: loaded at the first")
        reason, words = why or ok
        cond: ConditionPatch = {"type": ADAPTER_READY, "status": "False" if why else "True", "reason": reason,
                                "message": words, "observedGeneration": adapter.metadata.generation}
        patch: AdapterStatusPatch = {"observedGeneration": adapter.metadata.generation, "placement": placement,
                                     "resident": resident, "pending": pending, "conditions": [cond]}
        again = Result(requeue_after=hot_for) if hot_for else None    # when its demand placement ends
        if self._unchanged(adapter, patch, cond):
            return again
        held = get_condition(adapter.status.conditions, ADAPTER_READY)
        if held is None or held.reason != cond["reason"]:
            failing = cond["reason"] == "LoadFailed"
            self.ctx.events.record(adapter, "Warning" if failing else "Normal", cond["reason"], cond["message"])
        written = await self.ctx.store.patch_status(LoraAdapter, adapter.name, patch, current=adapter)
        self.ctx.cache.assume(written)
        for marks in (self._placed_at, self._removed_at):
            for placed, at in marks.items():
                if placed[0] == adapter.name and at == _UNWRITTEN:
                    marks[placed] = written.revision
        return again

    def _drop_evicted(self, adapter: LoraAdapter) -> list[str]:
        """Its placement less the replicas whose agent reports it Evicted (unloaded there to load
        another that a gateway asked for directly), each dropped with an Evicted event."""
        kept = []
        for replica in adapter.status.placement:
            serving = self._serving(replica)
            held = _held(serving, adapter.name) if serving is not None and serving.status.phase == "Ready" and \
                self._reported_since_placed(adapter.name, replica, serving) else None
            if held is None or held.state != "Evicted":
                kept.append(replica)
                continue
            self._evicted[adapter.name] = self.ctx.clock()      # its demand placement is over
            self.ctx.events.record(adapter, "Normal", "Evicted",
                                   f"unloaded from {replica} by its agent, for an adapter a gateway asked it to load")
        return kept

    def _adopted(self, adapter: LoraAdapter, ready: list[Replica], placed: list[str]) -> list[str]:
        """The Ready replicas not placed whose serving shard reports it Loaded (with spec.digest, if
        set): loaded there at a gateway's direct request, for a request (its demand placement
        begins). A report from before its agent saw the write that last took it off there is not
        taken (it may be from before that unload)."""
        out = []
        for r in ready:
            serving = self._serving(r.name)
            if r.name in placed or serving is None or serving.status.phase != "Ready":
                continue
            held = _held(serving, adapter.name)
            if held is None or held.state != "Loaded" or \
                    adapter.spec.digest is not None and held.digest != adapter.spec.digest or \
                    serving.status.adaptersSeen < self._removed_at.get((adapter.name, r.name), 0):
                continue
            self._removed_at.pop((adapter.name, r.name), None)
            self._demanded[adapter.name] = self.ctx.clock()
            out.append(r.name)
        return out

    async def _evict_for(self, adapter: LoraAdapter, ready: list[Replica], placement: list[str]) -> str | None:
        """A slot for an adapter the gateways want and no replica has room for: the one of the least
        recently requested adapter placed for demand alone (not pinned, past its minReplicas, no
        request for it now) on a Ready replica; the replica, or None when there is none to take."""
        ready_names = {r.name for r in ready}
        reports = self.ctx.cache.demand()
        taken: list[tuple[float, str, LoraAdapter]] = []
        for r in ready_names - set(placement):
            for other in self.ctx.cache.index(LoraAdapter, "placed", r):
                if other.name == adapter.name or other.spec.pinned or total_demand(reports, other.name).total:
                    continue
                if sum(p in ready_names for p in other.status.placement) > other.spec.minReplicas:
                    taken.append((self._demanded.get(other.name, 0.0), r, other))
        if not taken:
            return None
        _, replica, victim = min(taken, key=lambda t: (t[0], t[1], t[2].name))
        patch: AdapterStatusPatch = {"placement": [r for r in victim.status.placement if r != replica],
                                     "resident": [r for r in victim.status.resident if r != replica],
                                     "pending": [p for p in _pending(victim) if p["replica"] != replica]}
        written = await self.ctx.store.patch_status(LoraAdapter, victim.name, patch, current=victim)
        self.ctx.cache.assume(written)
        self._removed_at[(victim.name, replica)] = written.revision
        self._evicted[victim.name] = self.ctx.clock()      # its demand placement is over
        self.ctx.events.record(victim, "Normal", "Evicted",
                               f"unloaded from {replica}, the least recently requested, for {adapter.name}")
        return replica

    def _hot(self, name: str) -> tuple[bool, float]:
        """Whether it is placed for demand: the gateways report requests for it now, or did less
        than adapter_idle_seconds ago; and the seconds until that ends with no more (0: none to wait)."""
        now = self.ctx.clock()
        if total_demand(self.ctx.cache.demand(), name).total:
            self._demanded[name] = now
        last = self._demanded.get(name)
        if last is not None and last <= self._evicted.get(name, float("-inf")):
            return False, 0.0       # evicted since its last request
        left = 0.0 if last is None else last + self.settings.adapter_idle_seconds - now
        if last is not None and left <= 0:
            del self._demanded[name]
            return last == now, 0.0
        return last is not None, max(left, 0.0)

    def _ready_replicas(self, model: str) -> list[Replica]:
        return sorted((r for r in self.ctx.cache.index(Replica, "model", model)
                       if r.status.phase == "Ready" and r.metadata.deletionTimestamp is None
                       and r.spec.adapters is not None), key=lambda r: r.name)

    def _place(self, adapter: LoraAdapter, ready: list[Replica], wanted: int, placed: list[str],
               add_to: int) -> tuple[list[str], int]:
        """The placement, and how many of it are Ready. It keeps, in their order, the Ready replicas
        `placed` before (up to `wanted`: those where it is resident or reported Loaded first) and
        those not Ready now that still exist (being rebuilt: their agent loads it again before they
        are Ready, and then they count again, first), then adds the emptiest Ready replicas with a
        free slot, up to `add_to` Ready in all."""
        ready_names = {r.name for r in ready}
        before = [r for r in placed if r in ready_names or (
            (live := self.ctx.cache.get(Replica, r)) is not None and live.metadata.deletionTimestamp is None)]
        counted = set(sorted((r for r in before if r in ready_names), key=lambda r: not self._loaded(adapter, r))
                      [:wanted])
        kept = [r for r in before if r in counted or r not in ready_names]
        used = {r.name: self.ctx.cache.count(LoraAdapter, "placed", r.name) - (r.name in adapter.status.placement)
                for r in ready}
        free = [r for r in ready if r.name not in kept and r.spec.adapters is not None
                and used[r.name] < r.spec.adapters.maxLoaded]
        free.sort(key=lambda r: (used[r.name], r.name))
        added = [r.name for r in free[:max(0, add_to - len(counted))]]
        return kept + added, len(counted) + len(added)

    def _loaded(self, adapter: LoraAdapter, replica: str) -> bool:
        """Whether the replica's serving shard reports the adapter Loaded."""
        serving = self._serving(replica)
        held = _held(serving, adapter.name) if serving is not None else None
        return held is not None and held.state == "Loaded"

    def _serving(self, replica: str) -> Shard | None:
        return next((s for s in self.ctx.cache.index(Shard, "replica", replica) if s.spec.rank == 0), None)

    def _note_placed(self, adapter: LoraAdapter, placement: list[str], adopted: list[str]) -> None:
        """Mark each replica newly placed (but those `adopted`, placed as their engine reports it
        loaded) and each no longer placed (their write's revision follows the write)."""
        for key in [k for k in self._placed_at if k[0] == adapter.name and k[1] not in placement]:
            del self._placed_at[key]
        for replica in adapter.status.placement:
            if replica not in placement:
                self._removed_at[(adapter.name, replica)] = _UNWRITTEN
        for replica in placement:
            if replica not in adapter.status.placement and replica not in adopted:
                self._placed_at[(adapter.name, replica)] = _UNWRITTEN
                self._removed_at.pop((adapter.name, replica), None)

    def _reported_since_placed(self, adapter: str, replica: str, serving: Shard) -> bool:
        """Whether the serving shard's report is from after its agent saw the adapter placed there."""
        placed = self._placed_at.get((adapter, replica))
        if placed is None:
            return True
        if serving.status.adaptersSeen < placed:
            return False
        del self._placed_at[(adapter, replica)]
        return True

    def _residency(self, adapter: LoraAdapter, placement: list[str],
                   ready: list[Replica]) -> tuple[list[str], list[AdapterPendingPatch]]:
        ready_names = {r.name for r in ready}
        resident: list[str] = []
        pending: list[AdapterPendingPatch] = []
        for replica in placement:
            serving = self._serving(replica)
            held = _held(serving, adapter.name) if serving is not None and serving.status.phase == "Ready" and \
                self._reported_since_placed(adapter.name, replica, serving) else None
            if replica in ready_names and held is not None and held.state == "Loaded" and \
                    (adapter.spec.digest is None or held.digest == adapter.spec.digest):
                resident.append(replica)
            elif serving is None or serving.status.phase != "Ready":
                pending.append({"replica": replica, "reason": "ReplicaNotReady",
                                "message": f"its engine is {serving.status.phase if serving else 'not placed'}"})
            elif held is not None and held.state == "Failed":
                pending.append({"replica": replica, "reason": "LoadFailed", "message": held.message})
            else:
                pending.append({"replica": replica, "reason": "Loading", "message": ""})
        return resident, pending

    @staticmethod
    def _unchanged(adapter: LoraAdapter, patch: AdapterStatusPatch, cond: ConditionPatch) -> bool:
        s = adapter.status
        held = get_condition(s.conditions, ADAPTER_READY)
        return (s.observedGeneration == patch["observedGeneration"] and s.placement == patch["placement"]
                and s.resident == patch["resident"]
                and _pending(adapter) == patch["pending"]
                and held is not None and (held.status, held.reason, held.message) ==
                (cond["status"], cond["reason"], cond["message"]))


def _pending(a: LoraAdapter) -> list[AdapterPendingPatch]:
    return [{"replica": p.replica, "reason": p.reason, "message": p.message} for p in a.status.pending]


def _held(shard: Shard, name: str) -> ShardAdapter | None:
    return next((a for a in shard.status.adapters if a.name == name), None)
