"""The controller interface every reconciler in ``controllers/`` implements.

A controller is a subclass of :class:`Controller`; kinds are named by their
class (``llmgw.api``), and the cache and the store hand back that class::

    class SchedulerController(Controller):
        name = "scheduler"
        watches = (Replica, Node)            # first entry is the primary kind

        def keys_for(self, kind, obj):
            if type(obj) is Replica:
                return [obj.name]
            # a node changed: every pending replica may fit now
            return [r.name for r in self.ctx.cache.list(Replica) if not r.spec.placement]

        async def reconcile(self, key):
            replica = self.ctx.cache.get(Replica, key)   # Replica | None
            if replica is None:
                return None                      # done
            ...
            return Result(requeue_after=5.0)     # look again in 5 s

The manager (llmgw.runtime.manager.Manager) runs one informer per kind
(Node, Model, Replica, Shard, and the pseudo-kind ``HEARTBEATS``) into a
shared :class:`~llmgw.runtime.cache.Cache`; every event on a kind listed in
``watches`` calls ``keys_for(kind, obj)``, with the kind as ``watches`` names
it, and enqueues the keys in the controller's own work queue.  For
``HEARTBEATS`` obj is the node name (a ``str``) and the event fires when that
node's heartbeat key appears or vanishes; for ``DEMAND`` obj is a gateway's name and the
event fires when its demand report is written or expires.  On deletion events ``obj`` is the
last known object.  (A kind's plural name, "replicas", is taken wherever a
class is, for tests; typed code names the class.)  ``keys_for`` runs for every
event: it tells kinds apart by ``type(obj) is Replica``, which narrows ``obj``
for mypy as isinstance does (a kind is never subclassed) at a quarter of the
cost of isinstance's miss (pydantic's metaclass is an ABCMeta).

``reconcile(key)`` reads the cache, compares desired with actual, makes one
step and returns:

* ``None`` or ``Result()``: done; the key's backoff is forgotten.
* ``Result(requeue_after=s)``: done for now, reconcile again in ``s`` seconds.
* raises: the key is retried with per-key exponential backoff (``retry_base``
  doubling to ``retry_max``: 5 ms to 5 min unless the controller says otherwise).
  ``FencedOut`` / ``Conflict`` are ordinary errors here.

A failure the controller reports itself (in a status) is retried after the same
backoff: ``ctx.queue.add_rate_limited(key)`` requeues the key and returns the delay,
and ``Result(keep_backoff=True)`` keeps the backoff growing for the next failure (a
reconcile that returns without it, or ``None``, forgets it, as a success does).
Work that must not hold a worker (a git fetch of up to minutes) runs in a task of
its own whose end calls ``ctx.queue.add(key)``; ``stop()`` ends such tasks when the
term does.

``indexes`` names the cache indexes a controller reads (``cache.index(Replica,
"node", name)`` reads an ``Index(Replica, "node", ...)``, llmgw/runtime/cache.py):
the manager registers them in each term's cache.

A key is never reconciled by two workers at once.  After each own write,
call ``ctx.cache.assume(written_obj)`` so the next reconcile sees it before
the watch event arrives.

Leadership comes in terms: a manager leads, loses the leader key (or steps down), and
may lead again later. At the start of each term, before any event of it reaches
``keys_for``, the manager calls ``start(ctx)`` with that term's :class:`Context` (a store
fenced by the new leader key, a new event recorder, new work queues; the cache is the
manager's, kept listed and watching across terms and while standby); the base ``start``
keeps it as ``self.ctx``. Then every object the cache holds reaches ``keys_for`` as an
ADDED. A controller that keeps state between reconciles (a ledger,
what it last looked at, when it first saw a node silent) builds it in ``start``
(calling ``super().start(ctx)``): the previous term's writes may have been fenced out or
raced another leader's, and state built on them would be stale. What is kept across terms is kept on purpose, with
the reason beside it (the replica controller's ports that failed with PortInUse).

``ctx``, the term's context:

* ``ctx.store``: a *fenced* store (a :class:`ControllerStore`): writes raise
  ``FencedOut`` once this manager lost leadership.  Reads are plain.  Status
  is written with ``patch_status(kind, name, patch, current=obj)``, the patch
  typed per kind (``llmgw.api.patches``).
* ``ctx.cache``: the shared Cache (get/list/index/heartbeats/assume).
* ``ctx.queue``: the controller's work queue (add, add_after, add_rate_limited).
* ``ctx.events``: EventRecorder; ``ctx.events.record(obj, "Normal"|"Warning",
  reason, message)`` is synchronous and never raises (written in background).
* ``ctx.clock``: ``time.monotonic``-like callable (seconds).
* ``ctx.term``: which of this manager's leadership terms it is (1, 2, ...), for logs.

A controller's settings are not in ``ctx``: it takes the typed settings
object it reads in its constructor (controllers/settings.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from llmgw.api import AnyObject, ObjectClient, ObjectT, StatusPatch
from llmgw.runtime.cache import Cache, Index
from llmgw.runtime.events import EventRecorder
from llmgw.runtime.workqueue import WorkQueue

# The pseudo-kind of node heartbeats: its objects are node names.
HEARTBEATS = "heartbeats"
# The pseudo-kind of the gateways' demand reports: its objects are gateway names (the reports
# are in ``ctx.cache.demand()``).
DEMAND = "demand"

# A kind as ``watches`` names it: its class, HEARTBEATS or DEMAND (or a plural name, for tests).
WatchedKind = type[AnyObject] | str


class ControllerStore(ObjectClient, Protocol):
    """What controllers write through: an ObjectClient (llmgw.store.Store, fenced) whose
    update and patch_status may start from the caller's copy of the object (``current``,
    from the cache, never changed in place): no read first while that copy is the stored one."""

    async def update(self, obj: ObjectT, *, current: ObjectT | None = None) -> ObjectT: ...

    async def patch_status(self, kind: type[ObjectT], name: str, patch: StatusPatch,
                           node: str | None = None, *, current: ObjectT | None = None) -> ObjectT: ...


@dataclass
class Result:
    """What a reconcile returns: done (``Result()``) or look again later."""

    requeue_after: float | None = None
    # The key's backoff is kept for its next failure (a reported failure, or a look that was no
    # success yet); by default a reconcile that did not raise forgets it.
    keep_backoff: bool = False


@dataclass(frozen=True)
class Context:
    """One leadership term's: a fresh one per controller at each term's start."""

    store: ControllerStore          # fenced: writes fail once leadership is lost
    cache: Cache
    events: EventRecorder
    clock: Callable[[], float] = time.monotonic
    term: int = 1                   # which of this manager's terms (1, 2, ...)
    queue: WorkQueue = field(default_factory=WorkQueue)   # the controller's, this term


class Controller:
    """Base class of a reconciler; see the module docstring."""

    name: str = ""
    watches: tuple[WatchedKind, ...] = ()
    # The cache indexes reconcile and keys_for read (cache.index); the manager registers them.
    indexes: tuple[Index[Any], ...] = ()
    workers: int = 2
    # The per-key backoff of a failed reconcile (raised or reported), doubling from base to max.
    retry_base: float = 0.005
    retry_max: float = 300.0
    # Seconds to gather events of a secondary kind before reconciling their key:
    # a model with a hundred replicas then reconciles once per burst of replica
    # changes, not once per change. Events of the primary kind are never delayed.
    batch_seconds: float = 0.0
    ctx: Context

    def batch_delay(self, key: str) -> float:
        """How long events of a secondary kind for `key` gather before it is reconciled;
        ``batch_seconds`` unless a controller whose reconcile grows with a key's size says more."""
        return self.batch_seconds

    def start(self, ctx: Context) -> None:
        """A leadership term starts (see the module's docstring): keep its context. Override
        to build per-term state fresh, calling ``super().start(ctx)``."""
        self.ctx = ctx

    async def stop(self) -> None:
        """The term ends (its workers are cancelled): end what the controller runs beside them."""

    @property
    def primary_kind(self) -> WatchedKind:
        return self.watches[0]

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        """Keys to enqueue for an event on ``obj`` of ``kind``.

        Default: the object's name when ``kind`` is the primary kind.
        """
        if kind == self.primary_kind:
            return [obj if isinstance(obj, str) else obj.metadata.name]
        return []

    async def reconcile(self, key: str) -> Result | None:  # pragma: no cover
        raise NotImplementedError
