"""Informers: keep a Cache of one kind (or of heartbeats) in step with the store.

Each is a reflector (llmgw.reflector) over the store: list, report what changed
since the cache's contents (a DELETED for each object that vanished), watch from
the list's revision + 1. ``Compacted`` relists; ``StoreUnavailable`` (a dropped
stream, etcd down) backs off (llmgw.backoff) and watches again from the last
revision seen; a stream silent for ``idle_timeout`` is re-opened where it left off.

Every change that reaches the cache calls ``handler(kind, type, obj)`` with type
ADDED / MODIFIED / DELETED; for heartbeats obj is the node name, for demand the gateway's. ``synced`` is set
after the first successful list.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from llmgw.api import KINDS, AnyObject, ObjectT
from llmgw.api.client import EventType
from llmgw.api.demand import DemandReport
from llmgw.backoff import Backoff
from llmgw.reflector import ListerWatcher, Reflector, object_name
from llmgw.runtime.cache import Cache
from llmgw.runtime.settings import ManagerSettings

log = logging.getLogger("llmgw.informer")

Handler = Callable[[str, EventType, Any], None]   # (kind, type, the object or, for heartbeats, the node)
ItemT = TypeVar("ItemT")   # an object, a node name (heartbeats) or a gateway's report (demand)

# The default is the settings' (ManagerSettings.informer_idle_timeout): one place holds it.
IDLE_TIMEOUT: float = ManagerSettings.model_fields["informer_idle_timeout"].default


class HeartbeatSource(Protocol):
    """The nodes' heartbeats as a lister-watcher of node names (llmgw.store's store.heartbeats)."""

    def lister_watcher(self) -> ListerWatcher[str]: ...


class DemandSource(Protocol):
    """The gateways' demand reports as a lister-watcher (llmgw.store's store.demand)."""

    def lister_watcher(self) -> ListerWatcher[DemandReport]: ...


class InformerStore(Protocol):
    """What informers read: lister-watchers of a kind's objects, of the heartbeats and of the
    gateways' demand (llmgw.store.Store)."""

    def lister_watcher(self, kind: type[ObjectT], *,
                       held: Callable[[str], AnyObject | None] | None = None) -> ListerWatcher[ObjectT]: ...

    @property
    def heartbeats(self) -> HeartbeatSource: ...

    @property
    def demand(self) -> DemandSource: ...


def _ignore(kind: str, type: EventType, obj: Any) -> None:
    pass



class _Informer(Generic[ItemT]):
    """An informer of items of one type: a reflector whose changes go to the cache, then to the handler."""

    def __init__(self, kind: str, cache: Cache, handler: Handler | None, lw: ListerWatcher[ItemT],
                 key: Callable[[ItemT], str], known: Callable[[], Iterable[ItemT]], *,
                 idle_timeout: float = IDLE_TIMEOUT, backoff_base: float = 0.1, backoff_max: float = 10.0) -> None:
        self.kind = kind
        self.cache = cache
        self.handler = handler or _ignore
        self.synced = asyncio.Event()
        self.reflector: Reflector[ItemT] = Reflector(
            lw, self._apply, key=key, known=known, on_list=self._apply_list, on_synced=self.synced.set,
            idle_timeout=idle_timeout, backoff=Backoff(backoff_base, backoff_max), name=f"{kind} informer")

    @property
    def lists(self) -> int:
        """How many lists succeeded (1 + relists)."""
        return self.reflector.lists

    @property
    def reopens(self) -> int:
        """How many silent streams were re-opened."""
        return self.reflector.reopens

    async def run(self) -> None:
        await self.reflector.run()

    def _store(self, type: EventType, item: ItemT, revision: int) -> bool:
        """Put a change into the cache; whether the handler should hear of it."""
        raise NotImplementedError

    def _apply(self, type: EventType, item: ItemT, revision: int) -> None:
        if self._store(type, item, revision):
            self._emit(type, item)

    def _apply_list(self, changes: Sequence[tuple[EventType, ItemT]], revision: int) -> None:
        # The whole list is in the cache before the handler hears of any of it: a handler may read the cache.
        for type, item in [(t, i) for t, i in changes if self._store(t, i, revision)]:
            self._emit(type, item)

    def _told(self, item: ItemT) -> Any:
        """What the handler hears of an item: the item itself, unless a subclass says otherwise."""
        return item

    def _emit(self, type: EventType, item: ItemT) -> None:
        try:
            self.handler(self.kind, type, self._told(item))
        except Exception:
            log.exception("%s informer: handler failed", self.kind)


class Informer(_Informer[AnyObject]):
    def __init__(self, store: InformerStore, kind: str, cache: Cache, handler: Handler | None = None, *,
                 idle_timeout: float = IDLE_TIMEOUT, backoff_base: float = 0.1, backoff_max: float = 10.0) -> None:
        cls = KINDS[kind]
        # the cache's copy stands for a change it already holds (an assumed write of this process)
        lw: ListerWatcher[AnyObject] = store.lister_watcher(cls, held=lambda name: cache.get(cls, name))
        super().__init__(kind, cache, handler, lw, object_name, lambda: cache.list(cls),
                         idle_timeout=idle_timeout, backoff_base=backoff_base, backoff_max=backoff_max)

    def _store(self, type: EventType, obj: AnyObject, revision: int) -> bool:
        changed, _ = self.cache.apply(self.kind, type, obj, revision)
        return changed


class HeartbeatInformer(_Informer[str]):
    """Keeps ``cache.heartbeats()`` = nodes with a live /llmgw/heartbeat/<node> key."""

    def __init__(self, store: InformerStore, cache: Cache, handler: Handler | None = None, *,
                 idle_timeout: float = IDLE_TIMEOUT, backoff_base: float = 0.1, backoff_max: float = 10.0) -> None:
        super().__init__("heartbeats", cache, handler, store.heartbeats.lister_watcher(), str, cache.heartbeats,
                         idle_timeout=idle_timeout, backoff_base=backoff_base, backoff_max=backoff_max)

    def _store(self, type: EventType, node: str, revision: int) -> bool:
        return self.cache.set_heartbeat(node, type != "DELETED")


class DemandInformer(_Informer[DemandReport]):
    """Keeps ``cache.demand()`` = the reports of the gateways with a live /llmgw/demand/<gateway> key;
    the handler hears the gateway's name."""

    def __init__(self, store: InformerStore, cache: Cache, handler: Handler | None = None, *,
                 idle_timeout: float = IDLE_TIMEOUT, backoff_base: float = 0.1, backoff_max: float = 10.0) -> None:
        super().__init__("demand", cache, handler, store.demand.lister_watcher(), _gateway, cache.demand,
                         idle_timeout=idle_timeout, backoff_base=backoff_base, backoff_max=backoff_max)

    def _store(self, type: EventType, report: DemandReport, revision: int) -> bool:
        return self.cache.set_demand(report, type != "DELETED")

    def _told(self, report: DemandReport) -> str:
        return report.gateway


def _gateway(report: DemandReport) -> str:
    return report.gateway
