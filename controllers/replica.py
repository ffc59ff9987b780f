"""Replica controller: turns a placed Replica into Shards and folds their status back.

Once the scheduler set ``spec.placement``:

* creates one Shard per rank, ``<replica>-<rank>``, keyed under its node, with
  an ownerReference to the Replica and the finalizer ``llmgw.io/process``;
  ports come from the node's ``status.portRange`` and avoid every port of any
  other shard on that node; rank 0 gets a serve and a dist-init port, other
  ranks a serve port and rank 0's dist-init port; never a port in the node's
  ``status.foreignPorts`` (held by processes that are not engines of this
  node, as its agent reports) nor one a shard there failed on with PortInUse
  this term; ``headAddress`` is rank 0's node's first address;
* folds shard phases into the replica phase: Scheduled (shards created),
  Starting (any started), Ready (rank 0 Ready, the others Running or Ready),
  and ``status.endpoint`` = ``<head address>:<rank 0 serve port>``; the same
  write sets the condition Scheduled=True with where the scheduler placed it
  (the scheduler's bind is the placement alone); shard events are gathered
  for ``batch_seconds`` first, so shards moving through several phases
  quickly cost one status write, not one per phase;
* rebuilds the replica as a unit when any shard fails (or stops, or is
  deleted, or sits on another node than the placement says) or a node of it
  was deleted: phase Failed, ``restarts`` + 1, ``backoffUntil`` = now for the
  first failure (a crash costs no wait beyond the rebuild), then 10 s
  doubling per further consecutive failure up to 5 min (settings
  ``rebuild_backoff_base`` / ``rebuild_backoff_max``); a replica that had
  been Ready for ``rebuild_backoff_reset`` (10 min) when it failed starts the
  streak again, so a failure now and then is not punished like a crash loop
  (``status.consecutiveFailures`` counts the streak, ``restarts`` every
  rebuild). A shard refused for a port held by a foreign process (PortInUse)
  is not the engine's fault: rebuilt at once, on other ports, the streak
  left as it was. A node that is only silent is not a failure here: the node
  lifecycle controller moves its replicas, make-before-break;
  every shard deleted (the last lines of a failed shard's engine log, at most
  ``LOG_TAIL_LINES`` lines and ``LOG_TAIL_CHARS`` characters, go into the
  ReplicaFailed event and the Ready condition: the shard that held them is
  deleted within seconds); once they are gone and the backoff has passed the
  placement is cleared (Scheduled=False, reason Rebuilding) and the scheduler
  places it again;
* a shard's ``llmgw.io/process`` finalizer is removed once its agent reports
  phase Stopped, or its Node object is deleted (by an operator: the one way to
  give up on an agent). Never merely because the node is silent or lost: its
  engines may still run, so its GPUs and ports stay booked;
* a Replica with deletionTimestamp: phase Terminating, shards deleted and
  stopped, then the Replica's ``llmgw.io/shards`` finalizer is removed.
"""
from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone
from typing import Iterable

from controllers.indexes import REPLICAS_BY_NODE, SHARDS_BY_NODE, SHARDS_BY_REPLICA
from controllers.nodes import node_deleted
from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import AnyObject, Node, ObjectMeta, Replica, ReplicaPhase, Shard, ShardPorts, ShardSpec, get_condition
from llmgw.api.errors import NotFound
from llmgw.api.patches import ConditionPatch, ReplicaStatusPatch
from llmgw.api.wellknown import MODEL_LABEL, PROCESS_FINALIZER, REPLICA_LABEL, SHARDS_FINALIZER, shard_name
from llmgw.engines.base import join_host_port
from llmgw.runtime.controller import Context, Controller, Result, WatchedKind
from llmgw.scheduling import describe

log = logging.getLogger("llmgw.controllers.replica")

LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 2000


def crash_log(shards: list[Shard]) -> str:
    """The end of the first failed shard's engine log, bounded in lines and characters ('' when none)."""
    tail = next((s.status.logTail for s in shards if s.status.phase == "Failed" and s.status.logTail), [])
    text = "\n".join(tail[-LOG_TAIL_LINES:])
    return text[-LOG_TAIL_CHARS:]


def backoff_seconds(streak: int, base: float = 10.0, cap: float = 300.0) -> float:
    """Crash-loop delay after the ``streak``-th failure in a row (1-based): none for the
    first, then base doubling to cap.

    Not llmgw.backoff's jittered policy: this delay is a schedule users read
    (status.backoffUntil, "rebuilding in 20s") and set (rebuild_backoff_*), so it
    stays exact; and one replica's failures are its own, with no herd to spread."""
    return 0.0 if streak <= 1 else min(cap, base * 2 ** (streak - 2))


def held_ports(shard: Shard) -> set[int]:
    """Ports of its node to hand out no more when the agent refused to start the shard because a
    process not ours holds one (PortInUse): the shard's own, and any the refusal names."""
    started = get_condition(shard.status.conditions, "Started")
    refusal = started.message if started is not None and started.reason == "PortInUse" else None
    if shard.status.phase != "Failed" or not (refusal is not None or shard.status.message.startswith("PortInUse:")):
        return set()
    named = re.findall(r"\bport (\d+)", (refusal or "") + " " + shard.status.message)
    return {*shard.spec.ports.own(shard.spec.rank), *map(int, named)}


def fold_phase(replica: Replica, shards: list[Shard]) -> ReplicaPhase:
    """Replica phase from complete, healthy shards (one per rank)."""
    by_rank = {s.spec.rank: s for s in shards}
    head = by_rank.get(0)
    if head is not None and head.status.phase == "Ready" and all(
            s.status.phase in ("Ready", "Running") for s in shards):
        return "Ready"
    if any(s.status.phase in ("Pulling", "Starting", "Running", "Ready") for s in shards):
        return "Starting"
    return "Scheduled"


def pulling_message(shards: list[Shard]) -> str:
    """The weights' pulls of shards in phase Pulling, e.g. "pulling weights: node-a 1.2/4.0 GB"
    ("" when none is): `get replicas -o wide` and `describe` show it."""
    pulls = [(s.spec.node, s.status.pull) for s in shards if s.status.phase == "Pulling"]
    return "pulling weights: " + ", ".join(
        f"{node} {_size(p.bytesDone)} of {_size(p.bytesTotal)}" if p is not None and p.bytesTotal
        else f"{node} resolving" for node, p in pulls) if pulls else ""


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class _MinTimer:
    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, seconds: float | None) -> None:
        if seconds is not None:
            self.value = seconds if self.value is None else min(self.value, seconds)

    def result(self) -> Result | None:
        return Result(requeue_after=max(0.05, self.value)) if self.value is not None else None


class ReplicaController(Controller):
    name = "replica"
    watches = (Replica, Shard, Node)
    indexes = (SHARDS_BY_REPLICA, SHARDS_BY_NODE, REPLICAS_BY_NODE)
    workers = 32  # each replica's steps are a few etcd round trips: overlap them
    batch_seconds = 0.05

    def __init__(self, settings: ControllerSettings = DEFAULTS) -> None:
        self.settings = settings
        # per leadership term (start): node -> ports handed out, not yet in the cache
        self._reserved: dict[str, set[int]] = {}
        # node -> ports a shard failed on with PortInUse: never handed out again (until the
        # agent's status.foreignPorts, which outlives this memory, lists them anyway). Kept
        # across terms on purpose: it is what a node said of its ports, not a view of the
        # cache; the failed shard is gone by the next term, and its port is still taken.
        self._port_held: dict[str, set[int]] = {}

    def start(self, ctx: Context) -> None:
        """Ports handed out in the last term were booked against the cache, which by now
        holds every shard that was created, so nothing reserved carries over."""
        super().start(ctx)
        self._reserved = {}

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if type(obj) is Replica:
            return [obj.metadata.name]
        if type(obj) is Shard:
            return [obj.spec.replica]
        if type(obj) is not Node:
            return []
        cache = self.ctx.cache
        keys = {r.metadata.name for r in cache.index(Replica, "node", obj.metadata.name)}
        keys |= {s.spec.replica for s in cache.index(Shard, "node", obj.metadata.name)}
        return keys

    # ------------------------------------------------------------------ main
    async def reconcile(self, key: str) -> Result | None:
        cache = self.ctx.cache
        r = cache.get(Replica, key)
        shards = sorted(cache.index(Shard, "replica", key), key=lambda s: s.spec.rank)
        timer = _MinTimer()
        if r is None:
            await self._teardown(None, shards)
            return timer.result()
        if r.metadata.deletionTimestamp is not None:
            await self._terminate(r, shards)
            return timer.result()
        if not r.spec.placement:
            if shards:
                await self._teardown(r, shards)
            elif r.status.phase not in ("Pending",) or r.status.endpoint:
                await self._patch(r, {"phase": "Pending", "endpoint": None})
            return timer.result()
        if r.status.phase == "Failed":
            await self._continue_rebuild(r, shards, timer)
            return timer.result()

        reason = self._failure(r, shards)
        if reason:
            refused = False
            for s in shards:
                if held := held_ports(s):
                    self._port_held.setdefault(s.spec.node, set()).update(held)
                    refused = True
            await self._fail(r, shards, reason, crash=not refused)
            return timer.result()
        if len(shards) < len(r.spec.placement):
            complete = await self._create_shards(r, shards, timer)
            if complete is None:
                return timer.result()
            shards = complete
        await self._fold(r, shards)
        return timer.result()

    # -------------------------------------------------------------- failures
    def _failure(self, r: Replica, shards: list[Shard]) -> str | None:
        nodes_by_rank = {p.rank: p.node for p in r.spec.placement}
        for s in shards:
            if s.metadata.deletionTimestamp is not None:
                return f"shard {s.name} was deleted"
            if nodes_by_rank.get(s.spec.rank) != s.spec.node:
                return f"shard {s.name} is on node {s.spec.node}, not where the placement says"
            if s.status.phase == "Failed":
                detail = s.status.message or (f"exit code {s.status.exitCode}" if s.status.exitCode is not None else "")
                return f"shard {s.name} on {s.spec.node} failed" + (f": {detail}" if detail else "")
            if s.status.phase in ("Stopping", "Stopped"):
                return f"shard {s.name} on {s.spec.node} stopped unexpectedly"
        for node in dict.fromkeys(p.node for p in r.spec.placement):
            if self.ctx.cache.get(Node, node) is None:
                return f"node {node} was deleted"
        return None

    async def _fail(self, r: Replica, shards: list[Shard], reason: str, crash: bool = True) -> None:
        """crash=False: not the engine's fault (PortInUse): rebuilt at once, the streak as it was."""
        now = datetime.now(timezone.utc)
        restarts = r.status.restarts + 1
        ready = get_condition(r.status.conditions, "Ready")
        stable = (ready is not None and ready.status == "True" and ready.lastTransitionTime is not None
                  and (now - ready.lastTransitionTime).total_seconds()
                  >= self.settings.rebuild_backoff_reset)
        if not crash:
            streak, delay = r.status.consecutiveFailures, 0.0
        else:
            streak = 1 if stable else r.status.consecutiveFailures + 1
            delay = backoff_seconds(streak, self.settings.rebuild_backoff_base,
                                    self.settings.rebuild_backoff_max)
        until = now + timedelta(seconds=delay)
        log_tail = crash_log(shards)
        cause = f"{reason}\nlast lines of its log:\n{log_tail}" if log_tail else reason
        await self._patch(r, {
            "phase": "Failed", "endpoint": None, "restarts": restarts, "consecutiveFailures": streak,
            "message": f"{reason}; rebuilding in {delay:g}s",
            "backoffUntil": until.isoformat(),
            "conditions": [{"type": "Ready", "status": "False", "reason": "Rebuilding", "message": cause}],
        })
        self.ctx.events.record(r, "Warning", "ReplicaFailed",
                               f"{reason}; rebuilding the whole replica in {delay:g}s "
                               f"(restart {restarts}, {streak} in a row)"
                               + ("" if crash else "; a port held by another process is no crash: "
                                  "not counted, and the rebuild avoids the port")
                               + (f"\nlast lines of its log:\n{log_tail}" if log_tail else ""))
        await self._teardown(r, shards)

    async def _continue_rebuild(self, r: Replica, shards: list[Shard], timer: _MinTimer) -> None:
        if shards and not await self._teardown(r, shards):
            return
        left = ((r.status.backoffUntil - datetime.now(timezone.utc)).total_seconds()
                if r.status.backoffUntil else 0.0)
        if left > 0:
            timer.add(left)
            return
        new = r.model_copy(deep=True)
        new.spec.placement = []
        updated = await self.ctx.store.update(new, current=r)
        self.ctx.cache.assume(updated)
        await self._patch(updated, {
            "phase": "Pending", "endpoint": None, "message": "waiting to be placed again",
            "conditions": [{"type": "Scheduled", "status": "False", "reason": "Rebuilding",
                            "message": "placement cleared after a failure"}],
        })
        self.ctx.events.record(r, "Normal", "Rebuilding", "old shards gone and backoff over; placement cleared")

    # ---------------------------------------------------------- tearing down
    async def _teardown(self, r: Replica | None, shards: list[Shard]) -> bool:
        """Delete shards, release the stopped ones (and those of deleted nodes); True once none is left."""
        left = 0
        for s in shards:
            if s.metadata.deletionTimestamp is None:
                try:
                    s = await self.ctx.store.delete(Shard, s.name, node=s.spec.node)
                except NotFound:
                    self.ctx.cache.assume_deleted(Shard, s.name)
                    continue
                if not s.metadata.finalizers:
                    self.ctx.cache.assume_deleted(Shard, s.name)
                    continue
                self.ctx.cache.assume(s)
            if PROCESS_FINALIZER in s.metadata.finalizers:
                # Only the agent's word (Stopped) or the Node's deletion frees the shard's GPUs
                # and ports: a silent node's engines may still hold them.
                stopped = s.status.phase == "Stopped"
                deleted = not stopped and await node_deleted(self.ctx.cache, self.ctx.store, s.spec.node)
                if not (stopped or deleted):
                    left += 1
                    continue
                if deleted:
                    self.ctx.events.record(r if r is not None else s, "Warning", "ShardAbandoned",
                                           f"node {s.spec.node} was deleted: shard {s.name} released "
                                           "without its agent")
                released = s.model_copy(deep=True)
                released.metadata.finalizers = [f for f in s.metadata.finalizers if f != PROCESS_FINALIZER]
                try:
                    s = await self.ctx.store.update(released, current=s)
                except NotFound:
                    self.ctx.cache.assume_deleted(Shard, s.name)
                    continue
            if s.metadata.finalizers:
                self.ctx.cache.assume(s)
                left += 1       # someone else's finalizer
            else:
                self.ctx.cache.assume_deleted(Shard, s.name)
        return left == 0

    async def _terminate(self, r: Replica, shards: list[Shard]) -> None:
        if r.status.phase != "Terminating":
            await self._patch(r, {"phase": "Terminating", "endpoint": None,
                                  "message": "stopping shards before the replica goes"})
            self.ctx.events.record(r, "Normal", "Terminating", f"stopping {len(shards)} shard(s)")
        if not await self._teardown(r, shards):
            return
        if SHARDS_FINALIZER in r.metadata.finalizers:
            new = r.model_copy(deep=True)
            new.metadata.finalizers = [f for f in new.metadata.finalizers if f != SHARDS_FINALIZER]
            try:
                gone = await self.ctx.store.update(new, current=r)
            except NotFound:
                gone = new
                gone.metadata.finalizers = []
            self.ctx.cache.assume_deletion(gone)
            self.ctx.events.record(r, "Normal", "ShardsGone", "every shard stopped; replica released")

    # -------------------------------------------------------------- creating
    def _allocate(self, node: Node, count: int) -> list[int]:
        used = set(self._reserved.get(node.name, ()))
        used.update(node.status.foreignPorts, self._port_held.get(node.name, ()))
        for s in self.ctx.cache.index(Shard, "node", node.name):
            used.update(s.spec.ports.own(0))  # dist-init too on the other ranks' nodes, to be safe
        out = []
        rng = node.status.portRange
        for port in range(rng.first, rng.last + 1):
            if port not in used:
                out.append(port)
                if len(out) == count:
                    self._reserved.setdefault(node.name, set()).update(out)
                    return out
        raise RuntimeError(f"node {node.name}: no free port in {rng.first}-{rng.last}")

    def _release(self, node: str, ports: list[int]) -> None:
        held = self._reserved.get(node)
        if held is not None:
            held.difference_update(ports)
            if not held:
                del self._reserved[node]

    async def _create_shards(self, r: Replica, shards: list[Shard], timer: _MinTimer) -> list[Shard] | None:
        cache = self.ctx.cache
        have = {s.spec.rank: s for s in shards}
        placement = sorted(r.spec.placement, key=lambda p: p.rank)
        head_node = cache.get(Node, placement[0].node)
        if head_node is None or not head_node.status.addresses:
            self.ctx.events.record(r, "Warning", "NoHeadAddress",
                                   f"node {placement[0].node} reports no address; cannot start rank 0")
            timer.add(5.0)
            return None
        head = head_node.status.addresses[0]
        profile = r.spec.profile
        created = []
        for p in placement:
            if p.rank in have:
                continue
            node = cache.get(Node, p.node)
            if node is None:
                timer.add(1.0)
                return None
            ports = self._allocate(node, ShardPorts.needed(p.rank, r.spec.kvEvents))
            try:
                if p.rank == 0:
                    kv = ports[2:] if r.spec.kvEvents else [None, None]
                    shard_ports = ShardPorts(serve=ports[0], distInit=ports[1], kvEvents=kv[0], kvReplay=kv[1])
                else:
                    shard_ports = ShardPorts(serve=ports[0], distInit=have[0].spec.ports.distInit)
                shard = Shard(
                    metadata=ObjectMeta(
                        name=shard_name(r.name, p.rank),
                        labels={MODEL_LABEL: r.spec.model, REPLICA_LABEL: r.name},
                        finalizers=[PROCESS_FINALIZER],
                        ownerReferences=[r.owner_reference()],
                    ),
                    spec=ShardSpec(
                        replica=r.name, model=r.spec.model, node=p.node, rank=p.rank,
                        worldSize=len(placement), gpus=list(p.gpus), ports=shard_ports,
                        headAddress=head, fabric=p.fabric, engine=profile.engine,
                        launchMode=profile.launch_mode, gpusPerNode=profile.gpusPerNode,
                        source=r.spec.source, digest=r.spec.digest,
                        servedModelNames=r.spec.servedModelNames or [r.spec.model],
                        args=list(profile.args), env=dict(profile.env), adapters=r.spec.adapters,
                        kvCache=r.spec.kvCache,
                    ),
                )
                shard = await self.ctx.store.create(shard)
                cache.assume(shard)
            finally:
                self._release(p.node, ports)
            have[p.rank] = shard
            created.append(shard)
        if created:
            where = ", ".join(f"{s.name} on {s.spec.node}" for s in created)
            self.ctx.events.record(r, "Normal", "ShardsCreated",
                                   f"created {where}; head {head}:{have[0].spec.ports.serve}")
        return [have[rank] for rank in sorted(have)]

    # --------------------------------------------------------------- folding
    async def _fold(self, r: Replica, shards: list[Shard]) -> None:
        phase = fold_phase(r, shards)
        head = next(s for s in shards if s.spec.rank == 0)
        endpoint = f"{head.spec.headAddress}:{head.spec.ports.serve}"
        kv_events, kv_replay = (f"tcp://{join_host_port(head.spec.headAddress, port)}" if port else None
                                for port in (head.spec.ports.kvEvents, head.spec.ports.kvReplay))
        ready = phase == "Ready"
        msg = {"Ready": f"serving at {endpoint}",
               "Starting": pulling_message(shards)
               or f"{sum(s.status.phase in ('Ready', 'Running') for s in shards)}/{len(shards)} shards up",
               "Scheduled": f"{len(shards)} shard(s) created, waiting for agents"}[phase]
        conds: list[ConditionPatch] = [{"type": "Ready", "status": "True" if ready else "False",
                  "reason": "ShardsReady" if ready else "ShardsNotReady", "message": msg},
                 {"type": "Scheduled", "status": "True", "reason": "Scheduled",
                  "message": describe(r.spec.placement)}]
        st = r.status
        if (st.phase, st.endpoint, st.kvEvents, st.kvReplay, st.message) == (
                phase, endpoint, kv_events, kv_replay, msg) and all(
                (c := get_condition(st.conditions, want["type"])) is not None
                and (c.status, c.reason, c.message) == (want["status"], want["reason"], want["message"])
                for want in conds):
            return
        await self._patch(r, {"phase": phase, "endpoint": endpoint, "kvEvents": kv_events, "kvReplay": kv_replay,
                              "message": msg, "conditions": conds})
        if phase != st.phase and phase == "Ready":
            self.ctx.events.record(r, "Normal", "Ready", f"all {len(shards)} shard(s) up; serving at {endpoint}")

    async def _patch(self, r: Replica, patch: ReplicaStatusPatch) -> None:
        updated = await self.ctx.store.patch_status(Replica, r.name, patch, current=r)
        self.ctx.cache.assume(updated)
