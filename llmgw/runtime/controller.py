"""The controller interface every reconciler in ``controllers/`` implements.

A controller is a subclass of :class:`Controller`::

    class SchedulerController(Controller):
        name = "scheduler"
        watches = ("replicas", "nodes")   # first entry is the primary kind

        def keys_for(self, kind, obj):
            if kind == "replicas":
                return [obj.metadata.name]
            # a node changed: every pending replica may fit now
            return [r.metadata.name for r in self.ctx.cache.list("replicas")
                    if not r.spec.placement]

        async def reconcile(self, key):
            replica = self.ctx.cache.get("replicas", key)
            if replica is None:
                return None                      # done
            ...
            return Result(requeue_after=5.0)     # look again in 5 s

The manager (llmgw.runtime.manager.Manager) runs one informer per kind
(kinds: "nodes", "models", "replicas", "shards", and the pseudo-kind
"heartbeats") into a shared :class:`~llmgw.runtime.cache.Cache`; every
event on a kind listed in ``watches`` calls ``keys_for(kind, obj)`` and
enqueues the keys in the controller's own work queue.  For "heartbeats" obj
is the node name (a ``str``) and the event fires when that node's heartbeat
key appears or vanishes.  On deletion events ``obj`` is the last known object.

``reconcile(key)`` reads the cache, compares desired with actual, makes one
step and returns:

* ``None`` or ``Result()``: done; the key's backoff is forgotten.
* ``Result(requeue_after=s)``: done for now, reconcile again in ``s`` seconds.
* raises: the key is retried with per-key exponential backoff (5 ms doubling
  to 5 min).  ``FencedOut`` / ``Conflict`` are ordinary errors here.

A key is never reconciled by two workers at once.  After each own write,
call ``ctx.cache.assume(written_obj)`` so the next reconcile sees it before
the watch event arrives.

``ctx`` is set by the manager before the controller starts:

* ``ctx.store``: a *fenced* Store: writes raise ``FencedOut`` once this
  manager lost leadership.  Reads are plain.
* ``ctx.cache``: the shared Cache (get/list/index/heartbeats/assume).
* ``ctx.events``: EventRecorder; ``ctx.events.record(obj, "Normal"|"Warning",
  reason, message)`` is synchronous and never raises (written in background).
* ``ctx.clock``: ``time.monotonic``-like callable (seconds).

A controller's settings are not in ``ctx``: it takes the typed settings
object it reads in its constructor (controllers/settings.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from llmgw.runtime.cache import Cache
    from llmgw.runtime.events import EventRecorder


@dataclass
class Result:
    """What a reconcile returns: done (``Result()``) or look again later."""

    requeue_after: float | None = None


@dataclass
class Context:
    store: Any                      # llmgw.store.Store (fenced)
    cache: "Cache"
    events: "EventRecorder"
    clock: Callable[[], float] = time.monotonic


class Controller:
    """Base class of a reconciler; see the module docstring."""

    name: str = ""
    watches: tuple[str, ...] = ()
    workers: int = 2
    # Seconds to gather events of a secondary kind before reconciling their key:
    # a model with a hundred replicas then reconciles once per burst of replica
    # changes, not once per change. Events of the primary kind are never delayed.
    batch_seconds: float = 0.0
    ctx: Context

    @property
    def primary_kind(self) -> str:
        return self.watches[0]

    def keys_for(self, kind: str, obj: Any) -> Iterable[str]:
        """Keys to enqueue for an event on ``obj`` of ``kind``.

        Default: the object's name when ``kind`` is the primary kind.
        """
        if kind == self.primary_kind:
            return [obj if isinstance(obj, str) else obj.metadata.name]
        return []

    async def reconcile(self, key: str) -> Result | None:  # pragma: no cover
        raise NotImplementedError
