"""Scheduler: binds replicas that have no placement yet (see llmgw/scheduling).

Keys are replica names. The controller keeps a `Ledger` (free GPUs, ports and
replicas per model, per node) in step with the shared cache from the events
that reach `keys_for`, so a bind costs a walk of the free-GPU buckets, not a
scan of every replica. Shards are watched too: one that outlives its replica's
placement (a lost node's, until its agent confirms it stopped) keeps its GPUs
and ports booked. A decision and its booking in the ledger happen with no
`await` between them, so concurrent workers never hand out one GPU twice; the
placement is then written with a compare-and-swap update, and a lost compare
releases the booking and retries the key.

Status: Scheduled=False, reason Unschedulable (InsufficientGPUMemory when most
nodes' reason is that the replica's estimated memory, spec.memory, is more than
their free GPUs have: the message gives both, with the estimate's parts), with the count of nodes per
reason when nothing fits, re-tried every `scheduler_retry` seconds (setting,
default 5) and whenever a node changes or a replica frees its GPUs. A bind is
the placement (with, for a replica with an estimate, its KV budget spec.kvCache)
in one write, with a "Scheduled" event saying where; the
condition Scheduled=True that repeats it for people goes out with the replica
controller's first status write for the placed replica (a write it makes
anyway), not as a second write here.

Metrics (SchedulerCollector, on the controller-manager's /metrics): binds, counted
over the process's life, and while leading the replicas waiting for room by their
reason: the one most nodes give (placer's words: "insufficient GPUs", "no fabric", ...).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import AnyObject, Node, Placement, Replica, Shard, get_condition
from llmgw.api.errors import Conflict, NotFound
from llmgw.api.patches import ReplicaStatusPatch
from llmgw.runtime.controller import Context, Controller, Result, WatchedKind
from llmgw.scheduling import Fit, Ledger, budget, describe, place, request_for
from llmgw.scheduling.placer import MEMORY_REASON


class SchedulerController(Controller):
    name = "scheduler"
    watches = (Replica, Node, Shard)
    # Decisions are synchronous; workers overlap the etcd writes. Each bind waits its turn in
    # the process's write batches (llmgw.store.batcher) behind every other controller's
    # writes: at 10,000 nodes 64 workers held binds to ~1,000/s, 256 to ~1,550 (issue 34).
    workers = 256

    def __init__(self, settings: ControllerSettings = DEFAULTS) -> None:
        self.settings = settings
        # per leadership term (start): the ledger mirrors the term's cache
        self.ledger: Ledger | None = None
        self.unschedulable: dict[str, str] = {}   # replicas waiting for room -> the main reason
        self.binds = 0   # over the process's life, for llmgw_scheduler_binds_total

    def start(self, ctx: Context) -> None:
        """A new term's ledger is built from the cache, at its first use (a cold start's
        informers fill the cache after start); nothing booked in the last term carries over."""
        super().start(ctx)
        self.ledger, self.unschedulable = None, {}

    # ------------------------------------------------------------ ledger
    def _ledger(self) -> Ledger:
        """Built from the cache on first use in a term; afterwards kept current by keys_for."""
        if self.ledger is None:
            led = Ledger()
            for node in self.ctx.cache.list(Node):
                led.observe_node(node)
            for rep in self.ctx.cache.list(Replica):
                led.observe_replica(rep)
            for shard in self.ctx.cache.list(Shard):
                led.observe_shard(shard)
            self.ledger = led
        return self.ledger

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        led = self._ledger()
        if type(obj) is Node:
            # Waiting replicas are woken only by a change placement sees: a fleet's nodes
            # write their status all the time, and each wake retries every waiting replica.
            node = self.ctx.cache.get(Node, obj.name)
            if node is None:
                led.forget_node(obj.name)
            elif not led.observe_node(node):
                return []
            return list(self.unschedulable)
        if type(obj) is Shard:
            shard = self.ctx.cache.get(Shard, obj.name)
            if shard is not None:
                led.observe_shard(shard)
                return []
            return list(self.unschedulable) if led.forget_shard(obj.name, obj.spec.replica) else []
        if type(obj) is not Replica:
            return []
        name = obj.name
        cur = self.ctx.cache.get(Replica, name)
        if cur is None:
            had = name in led.replicas
            led.forget_replica(name)
            self.unschedulable.pop(name, None)
            return list(self.unschedulable) if had else []
        led.observe_replica(cur)
        if cur.spec.placement or cur.metadata.deletionTimestamp:
            self.unschedulable.pop(name, None)
            return []
        return [name]

    # --------------------------------------------------------- reconcile
    async def reconcile(self, key: str) -> Result | None:
        cache, led = self.ctx.cache, self._ledger()
        rep = cache.get(Replica, key)
        if rep is None or rep.spec.placement or rep.metadata.deletionTimestamp:
            self.unschedulable.pop(key, None)
            return None
        led.observe_replica(rep)
        if key in led.assumed:
            # An earlier write ended without an answer: see what the store has.
            try:
                rep = await self.ctx.store.get(Replica, key)
            except NotFound:
                led.forget_replica(key)
                return None
            led.unassume(key)
            if rep.spec.placement or rep.metadata.deletionTimestamp:
                cache.assume(rep)
                led.observe_replica(rep)
                return None
        out = place(led, request_for(rep))
        if not isinstance(out, Fit):
            self.unschedulable[key] = main = _main_reason(out.reasons)
            await self._unschedulable(rep, "InsufficientGPUMemory" if main == MEMORY_REASON else "Unschedulable",
                                      out.message)
            return Result(requeue_after=self.settings.scheduler_retry)
        self.unschedulable.pop(key, None)
        led.assume(key, rep.spec.model, tuple((s.node, s.gpus) for s in out.slots), rep.spec.kvEvents)
        # A shallow copy with a new spec: the cached replica is shared and stays as it is.
        new = rep.model_copy(update={"spec": rep.spec.model_copy(update={"placement": [
            Placement(rank=s.rank, node=s.node, gpus=list(s.gpus), fabric=s.fabric) for s in out.slots],
            "kvCache": budget(led, out, rep.spec.memory)})})
        try:
            written = await self.ctx.store.update(new, current=rep)
        except NotFound:
            led.unassume(key)
            return None
        except Conflict:  # FencedOut is one: this manager lost leadership
            led.unassume(key)      # refused for sure: release the GPUs; the key is retried
            raise
        # Any other error leaves the outcome unknown: the booking stays until the
        # retry reads the replica back (above).
        cache.assume(written)
        led.observe_replica(written)
        self.binds += 1
        self.ctx.events.record(written, "Normal", "Scheduled", f"placed {describe(out.slots)}")
        return None

    async def _unschedulable(self, rep: Replica, reason: str, message: str) -> None:
        self.ctx.events.record(rep, "Warning", "FailedScheduling", message)
        cond = get_condition(rep.status.conditions, "Scheduled")
        if cond and (cond.status, cond.reason, cond.message) == ("False", reason, message):
            return
        patch: ReplicaStatusPatch = {"conditions": [
            {"type": "Scheduled", "status": "False", "reason": reason, "message": message}]}
        try:
            written = await self.ctx.store.patch_status(Replica, rep.metadata.name, patch, current=rep)
        except NotFound:
            return
        self.ctx.cache.assume(written)


def _main_reason(reasons: dict[str, int]) -> str:
    """The reason most nodes give (ties: the first by name); "no nodes" when there are none."""
    if not reasons:
        return "no nodes"
    return min(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[0]


class SchedulerCollector:
    """llmgw_scheduler_binds_total, and llmgw_scheduler_unschedulable_replicas while `leading()`."""

    def __init__(self, scheduler: SchedulerController, leading: Callable[[], bool]) -> None:
        self.scheduler, self.leading = scheduler, leading

    def collect(self) -> Iterator[Metric]:
        binds = CounterMetricFamily("llmgw_scheduler_binds", "Replicas placed by this scheduler")
        binds.add_metric([], self.scheduler.binds)
        yield binds
        if not self.leading():
            return
        waiting = GaugeMetricFamily("llmgw_scheduler_unschedulable_replicas",
                                    "Replicas that fit on no node, by the reason most nodes give",
                                    labels=["reason"])
        for reason, n in sorted(Counter(self.scheduler.unschedulable.values()).items()):
            waiting.add_metric([reason], n)
        yield waiting
