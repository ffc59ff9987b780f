"""Informers: keep a Cache of one kind (or of heartbeats) in step with the store.

Each is a reflector (llmgw.reflector) over the store: list, report what changed
since the cache's contents (a DELETED for each object that vanished), watch from
the list's revision + 1. ``Compacted`` relists; ``StoreUnavailable`` (a dropped
stream, etcd down) backs off (llmgw.backoff) and watches again from the last
revision seen; a stream silent for ``idle_timeout`` is re-opened where it left off.

Every change that reaches the cache calls ``handler(kind, type, obj)`` with type
ADDED / MODIFIED / DELETED; for heartbeats obj is the node name. ``synced`` is set
after the first successful list.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from llmgw.api.client import EventType
from llmgw.api.types import AnyObject
from llmgw.backoff import Backoff
from llmgw.reflector import Reflector, object_name
from llmgw.runtime.cache import Cache
from llmgw.runtime.listwatch import KeyNames, StoreObjects
from llmgw.store import keys
from llmgw.store.store import Store

log = logging.getLogger("llmgw.informer")

Handler = Callable[[str, EventType, Any], None]   # (kind, type, the object or, for heartbeats, the node)


def _ignore(kind: str, type: EventType, obj: Any) -> None:
    pass



class Informer:
    def __init__(self, store: Store, kind: str, cache: Cache, handler: Handler | None = None, *,
                 idle_timeout: float = 120.0, backoff_base: float = 0.1, backoff_max: float = 10.0) -> None:
        self.kind = kind
        self.cache = cache
        self.handler = handler or _ignore
        self.synced = asyncio.Event()
        self.reflector = self._reflector(
            store, on_synced=self.synced.set, idle_timeout=idle_timeout,
            backoff=Backoff(backoff_base, backoff_max), name=f"{kind} informer")

    def _reflector(self, store: Store, **kw: Any) -> Reflector[AnyObject] | Reflector[str]:
        return Reflector(StoreObjects(store, self.kind), self._apply, key=object_name,
                         known=lambda: self.cache.list(self.kind), **kw)

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

    def _apply(self, type: EventType, obj: AnyObject, revision: int) -> None:
        changed, _ = self.cache.apply(self.kind, type, obj, revision)
        if changed:
            self._emit(type, obj)

    def _emit(self, type: EventType, obj: Any) -> None:
        try:
            self.handler(self.kind, type, obj)
        except Exception:
            log.exception("%s informer: handler failed", self.kind)


class HeartbeatInformer(Informer):
    """Keeps ``cache.heartbeats()`` = nodes with a live /llmgw/heartbeat/<node> key."""

    def __init__(self, store: Store, cache: Cache, handler: Handler | None = None, **kw: Any) -> None:
        super().__init__(store, "heartbeats", cache, handler, **kw)

    def _reflector(self, store: Store, **kw: Any) -> Reflector[AnyObject] | Reflector[str]:
        return Reflector(KeyNames(store, keys.HEARTBEAT), self._beat, key=str, known=self.cache.heartbeats, **kw)

    def _beat(self, type: EventType, node: str, revision: int) -> None:
        if self.cache.set_heartbeat(node, type != "DELETED"):
            self._emit(type, node)
