"""The controller manager: leader election, informers, work queues and workers.

``Manager(store, controllers, identity=..., settings=...)``; ``await
manager.run()`` loops forever. It starts one informer per watched kind (plus
heartbeats or demand when asked for) into one Cache, whether it leads or not:
a standby keeps its cache listed and watching, as controller-runtime's caches
do, so that a new leader starts reconciling as soon as it wins, without
listing the fleet again (docs/contracts.md, "Warm standby"). Then it campaigns
for /llmgw/leader/<component>; while leader, it builds a fenced store (from the
leader key's create_revision), an EventRecorder, fresh work queues and a Context
per controller, starts each controller's term with it (``controller.start(ctx)``,
before any event of the term), waits for the caches to sync (at once for a warm
standby), then runs ``controller.workers`` workers per controller and the
runnables (llmgw.runtime.runnable: leader-only work such as compaction), and
beside them tells each controller of everything the cache holds (as a list
would, so that every object is reconciled once by the new leader; in batches,
so that the first reconcile does not wait for the last object). On losing
leadership the workers and runnables are cancelled, the informers go on, and the
manager campaigns again; while not leader no event reaches a controller.

An informer that finds etcd restored under it (llmgw.store.errors.Restored), leader
or standby, has the manager drop its cache and informers for new ones listed whole
from the restored etcd (its cache would mix kinds listed from it with kinds not yet:
a Replica whose Model is not relisted yet looks orphaned); a leading term ends
with it, the leader key resigned, and the next term waits for the new caches' sync
before any controller acts, as after a restart.

The store is what ``ManagerStore`` says: llmgw.store.Store is one.

``manager.stop(resign=True)`` ends ``run()``; with resign the leader key is
released so another manager takes over at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from llmgw.api import KINDS
from llmgw.api.errors import Conflict
from llmgw.runtime.cache import Cache
from llmgw.runtime.controller import DEMAND, HEARTBEATS, Context, Controller, ControllerStore, WatchedKind
from llmgw.runtime.events import EventRecorder, EventWriter
from llmgw.runtime.informer import DemandInformer, HeartbeatInformer, Informer, InformerStore
from llmgw.runtime.leader import Campaigner, LeaderElector, Leadership
from llmgw.runtime.metrics import ManagerMetrics
from llmgw.runtime.runnable import Runnable
from llmgw.runtime.settings import ManagerSettings
from llmgw.runtime.workqueue import WorkQueue
from llmgw.store.errors import Restored

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger("llmgw.manager")

STOP_TIMEOUT = 10.0
REPLAY_BATCH = 500   # objects told of at a term's start between two chances for the workers to run


class TermStore(ControllerStore, EventWriter, Protocol):
    """The store of one leadership term, fenced by its leader key: what controllers write
    through and where their events go."""


class ManagerStore(InformerStore, Campaigner, Protocol):
    """What the manager needs of the store (llmgw.store.Store): election and leases to lead,
    lister-watchers for the informers, and a fenced view of itself for each term."""

    def fenced(self, leader_key: str, create_revision: int) -> TermStore: ...


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def _all_set(events: list[asyncio.Event]) -> None:
    await asyncio.gather(*(e.wait() for e in events))


class Manager:
    def __init__(self, store: ManagerStore, controllers: list[Controller], *, identity: str | None = None,
                 settings: ManagerSettings | None = None, component: str = "controller-manager",
                 runnables: Sequence[Runnable] = ()):
        self.store = store
        self.controllers = list(controllers)
        self.runnables = list(runnables)
        self.identity = identity or default_identity()
        self.settings = settings if settings is not None else ManagerSettings()
        self.elector = LeaderElector(store, component, self.identity, self.settings.lease_seconds)
        self.metrics = ManagerMetrics(lambda: {n: len(q) for n, q in self.queues.items()},
                                      lambda: {i.kind: i.lists for i in self.informers})
        self.queues = self._new_queues()
        # plural name -> (controller, the kind as its watches name it)
        self.watchers: dict[str, list[tuple[Controller, WatchedKind]]] = {}
        for c in self.controllers:
            for kind in c.watches:
                plural = kind if isinstance(kind, str) else kind.kind_plural
                self.watchers.setdefault(plural, []).append((c, kind))
        self._new_cache()
        self._informing: list[asyncio.Task[None]] = []
        self._restored = asyncio.Event()    # etcd restored under an informer: the cache is dropped
        self._rebuilding: asyncio.Task[None] | None = None
        self._dispatching = False           # while leader: events reach the controllers' queues
        self.is_leader = False
        self.leadership: Leadership | None = None
        self.events: EventRecorder | None = None
        self.terms = 0
        self._resign = True
        self._task: asyncio.Task[None] | None = None
        self.leading = asyncio.Event()     # set while leader with synced caches
        # A span per reconcile (controller-manager --otel): OpenTelemetry's, an optional extra.
        self.tracer: Tracer | None = None

    # ------------------------------------------------------------------ life
    def _new_cache(self) -> None:
        """One cache and one informer per kind, leader or standby, until etcd is restored under them.
        Controllers hear of each other's writes from the writer's assume (at once) as well as from
        the watch (later)."""
        self.cache = Cache(on_assume=self._handle, indexes=[i for c in self.controllers for i in c.indexes])
        idle = self.settings.informer_idle_timeout
        self.informers: list[Informer | HeartbeatInformer | DemandInformer] = [
            HeartbeatInformer(self.store, self.cache, self._handle, idle_timeout=idle) if kind == HEARTBEATS else
            DemandInformer(self.store, self.cache, self._handle, idle_timeout=idle) if kind == DEMAND else
            Informer(self.store, kind, self.cache, self._handle, idle_timeout=idle)
            for kind in self.watchers
        ]
        for i in self.informers:
            i.reflector.on_gone = self._gone

    def _inform(self) -> None:
        self._informing = [asyncio.create_task(i.run(), name=f"informer-{i.kind}") for i in self.informers]

    async def _stop_informing(self) -> None:
        for t in self._informing:
            t.cancel()
        if self._informing:
            await asyncio.wait(self._informing, timeout=STOP_TIMEOUT)

    def _gone(self, err: Exception) -> None:
        if isinstance(err, Restored) and not self._restored.is_set():
            log.warning("%s: %s; its cache is listed again whole, the term (if it leads) ends", self.identity, err)
            self._restored.set()
            self._rebuilding = asyncio.create_task(self._rebuild(), name="cache-rebuilt")

    async def _rebuild(self) -> None:
        await self._stop_informing()
        self._new_cache()
        self._inform()

    async def run(self) -> None:
        self._task = asyncio.current_task()
        self._inform()
        try:
            while True:
                if self._rebuilding is not None:   # etcd restored: the new caches before a term
                    await self._rebuilding
                    self._rebuilding = None
                    self._restored.clear()
                leadership = await self.elector.acquire()
                self.leadership = leadership
                try:
                    await self._lead(leadership)
                finally:
                    self.is_leader = False
                    self.leading.clear()
                    self.metrics.leader.set(0)
                    if self._resign:
                        try:
                            await asyncio.wait_for(leadership.resign(), STOP_TIMEOUT)
                        except (Exception, asyncio.TimeoutError):  # noqa: BLE001 - the lease expires anyway
                            pass
                    self.leadership = None
                log.warning("%s lost leadership; campaigning again", self.identity)
                await asyncio.sleep(self.elector.retry)
        except asyncio.CancelledError:
            pass
        finally:
            if self._rebuilding is not None:
                self._rebuilding.cancel()
                await asyncio.wait([self._rebuilding], timeout=STOP_TIMEOUT)
            await self._stop_informing()

    async def stop(self, resign: bool = True) -> None:
        """End run(); resign=False leaves the leader key to expire (like a crash)."""
        self._resign = resign
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def healthy(self) -> tuple[bool, str]:
        running = self._task is not None and not self._task.done()
        return running, f"ok leader={self.is_leader} identity={self.identity}" if running else "stopped"

    # ---------------------------------------------------------------- a term
    def _new_queues(self) -> dict[str, WorkQueue]:
        return {c.name: WorkQueue(base_delay=c.retry_base, max_delay=c.retry_max,
                                  stats=self.metrics.queue_stats(c.name)) for c in self.controllers}

    def _handle(self, plural: str, type: str, obj: Any) -> None:
        """An informer's (or an assume's) event: the keys of each controller that watches the kind
        go to its queue, while this manager leads; a standby's cache takes it in and no more."""
        if not self._dispatching:
            return
        for c, kind in self.watchers.get(plural, ()):
            try:
                queue, secondary = self.queues[c.name], kind != c.primary_kind
                for key in c.keys_for(kind, obj):
                    queue.add_after(key, c.batch_delay(key) if secondary else 0.0)
            except Exception:
                log.exception("%s: keys_for(%s) failed", c.name, plural)

    async def _replay(self) -> None:
        """Tell the controllers of everything the cache holds, as an ADDED each, as the first list
        of a cold start did: a new leader reconciles every object once. Beside the workers, letting
        them run every REPLAY_BATCH objects: the first reconcile need not wait for a fleet's worth
        of keys_for (at 10,000 nodes, tens of thousands of objects). The heartbeats first: each a
        reconcile of the node lifecycle that reads the cache alone (a live node's writes nothing),
        so the term's first loop turns are short; the kinds whose first event has a controller
        build its state from the whole cache (the scheduler's ledger) after them."""
        for plural in sorted(self.watchers, key=lambda plural: plural != HEARTBEATS):
            items: list[Any] = (list(self.cache.heartbeats()) if plural == HEARTBEATS else
                                [r.gateway for r in self.cache.demand()] if plural == DEMAND else
                                self.cache.list(KINDS[plural]))
            for n, obj in enumerate(items, 1):
                self._handle(plural, "ADDED", obj)
                if n % REPLAY_BATCH == 0:
                    await asyncio.sleep(0)

    async def _lead(self, leadership: Leadership) -> None:
        self.terms += 1
        fenced = self.store.fenced(leadership.key, leadership.create_revision)
        self.queues = self._new_queues()
        events = EventRecorder(fenced)
        self.events = events
        for c in self.controllers:   # before any event of the term reaches keys_for
            c.start(Context(store=fenced, cache=self.cache, events=events, clock=time.monotonic, term=self.terms,
                            queue=self.queues[c.name]))
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(events.run(), name="events")]
        hold = asyncio.create_task(self.elector.hold(leadership), name="leader-hold")
        # etcd restored under the term: its cache is dropped, and the term ends
        ended = asyncio.create_task(self._restored.wait(), name="etcd-restored")
        tasks.append(ended)
        try:
            # at once for a warm standby; a cold start waits for its first lists
            synced = asyncio.create_task(_all_set([i.synced for i in self.informers]), name="informers-synced")
            tasks.append(synced)
            await asyncio.wait({hold, synced, ended}, return_when=asyncio.FIRST_COMPLETED)
            if hold.done() or ended.done():
                return
            self._dispatching = True
            self.is_leader = True
            self.metrics.leader.set(1)
            for c in self.controllers:
                for n in range(max(1, int(getattr(c, "workers", 1)))):
                    tasks.append(asyncio.create_task(self._worker(c, self.queues[c.name]), name=f"{c.name}-{n}"))
            tasks.append(asyncio.create_task(self._replay(), name="replay"))
            tasks += [asyncio.create_task(self._run(r), name=type(r).__name__) for r in self.runnables]
            self.leading.set()
            log.info("%s leads with controllers %s", self.identity, ", ".join(c.name for c in self.controllers))
            await asyncio.wait({hold, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._dispatching = False
            for q in self.queues.values():
                q.shutdown()
            for t in (*tasks, hold):
                t.cancel()
            # bounded: a task stuck in a store call that ignores cancellation must not wedge us
            _, stuck = await asyncio.wait([*tasks, hold], timeout=STOP_TIMEOUT)
            for t in stuck:
                log.error("task %s did not stop within %.0fs; abandoning it", t.get_name(), STOP_TIMEOUT)
            for c in self.controllers:   # once no worker can start more: what each runs beside them
                # bounded as the tasks are: a controller's stop that hangs must not wedge the manager
                try:
                    await asyncio.wait_for(c.stop(), STOP_TIMEOUT)
                except TimeoutError:
                    log.error("controller %s did not stop within %.0fs; abandoning what it runs", c.name,
                              STOP_TIMEOUT)

    @staticmethod
    async def _run(runnable: Runnable) -> None:
        try:
            await runnable.run()
        except Exception:
            log.exception("%s failed; it starts again with the next leadership term", type(runnable).__name__)

    def _span(self, c: Controller, key: str) -> contextlib.AbstractContextManager[object]:
        """The reconcile's span, which records what it raised; nothing without a tracer."""
        if self.tracer is None:
            return contextlib.nullcontext()
        return self.tracer.start_as_current_span(
            f"reconcile {c.name}", attributes={"llmgw.controller": c.name, "llmgw.key": key, "llmgw.term": self.terms})

    async def _worker(self, c: Controller, queue: WorkQueue) -> None:
        duration = self.metrics.duration.labels(c.name)
        errors = self.metrics.errors.labels(c.name)
        while (key := await queue.get()) is not None:
            t0 = time.perf_counter()
            try:
                with self._span(c, key):
                    result = await c.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                errors.inc()
                delay = queue.add_rate_limited(key)
                if isinstance(err, Conflict):
                    log.debug("%s %s: %s; retry in %.3fs", c.name, key, err, delay)
                else:
                    log.warning("%s %s: reconcile failed: %s: %s; retry in %.3fs", c.name, key,
                                type(err).__name__, err, delay, exc_info=log.isEnabledFor(logging.DEBUG))
            else:
                if result is None or not result.keep_backoff:
                    queue.forget(key)
                if result is not None and result.requeue_after is not None:
                    queue.add_after(key, result.requeue_after)
            finally:
                duration.observe(time.perf_counter() - t0)
                queue.done(key)
