"""Feeding the routing table (and the API keys, keyring.py): from the server's watches, or from a static file."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from llmgw.api import AnyObject, ApiKey, LoraAdapter, Model, Replica
from llmgw.api.client import EventType
from llmgw.api.manifests import load_path
from llmgw.backoff import Backoff
from llmgw.client import Client
from llmgw.gateway.keyring import KeyRing
from llmgw.gateway.table import RoutingTable
from llmgw.reflector import Reflector, object_name

log = logging.getLogger(__name__)

KINDS: tuple[type[AnyObject], ...] = (Model, Replica, LoraAdapter)


class ServerSource:
    """Keeps a table in step with the server: a reflector (llmgw.reflector) per kind
    over the client's lister-watcher.

    It relists after a 410 and re-watches after a drop, and reports a DELETED
    for every object that vanished across a relist, so a replica deleted while
    the watch was down does not stay routable. `synced` turns True once every
    kind has been listed. With `keys`, ApiKeys are watched too, into that ring
    (a key deleted while the watch was down is refused after the relist).
    """

    def __init__(self, client: Client, table: RoutingTable,
                 on_change: Callable[[str, str, AnyObject], None] | None = None,
                 on_synced: Callable[[], None] | None = None, keys: KeyRing | None = None) -> None:
        self.client = client
        self.table = table
        self.keys = keys
        self.kinds: tuple[type[AnyObject], ...] = KINDS if keys is None else (*KINDS, ApiKey)
        self.on_change = on_change  # (kind, type, obj) after each event that changed routing
        self.on_synced = on_synced  # () once both kinds have been listed
        self._synced: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def synced(self) -> bool:
        return self._synced.issuperset(k.kind_plural for k in self.kinds)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(kind), name=f"gateway-watch-{kind.kind_plural}")
                       for kind in self.kinds]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, cls: type[AnyObject]) -> None:
        kind = cls.kind_plural
        backoff = Backoff(1.0, 30.0)

        def apply(type_: EventType, obj: AnyObject, revision: int) -> None:
            changed = self.keys.apply(type_, obj) if type(obj) is ApiKey and self.keys is not None else \
                self.table.apply(kind, type_, obj)
            if changed and self.on_change:
                self.on_change(kind, type_, obj)

        def listed() -> None:
            if kind not in self._synced:
                log.info("routing table: %s listed", kind)
            self._synced.add(kind)
            if self.synced and self.on_synced:
                self.on_synced()
            backoff.reset()

        # One reflector for the life of the source: after a refusal it goes on from what it reported.
        reflector = Reflector(self.client.lister_watcher(cls), apply, key=object_name, on_synced=listed,
                              backoff=Backoff(0.1, 5.0), name=f"routing table's watch of {kind}")
        while True:
            try:
                await reflector.run()
            except Exception as err:  # noqa: BLE001 Forbidden, a bad object...: keep serving what we have
                delay = backoff.next()
                log.error("watching %s failed: %s; retrying in %.0f s", kind, err, delay)
                await asyncio.sleep(delay)



def load_static(path: str | Path, table: RoutingTable) -> int:
    """Load Model, Replica and Adapter manifests (with status) from a file or folder; returns objects loaded."""
    objs = [o for _, o in load_path(path)]
    loaded = 0
    for kind in KINDS:
        these = [o for o in objs if type(o) is kind]
        table.replace(kind.kind_plural, these)
        loaded += len(these)
    return loaded
