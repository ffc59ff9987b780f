"""Feeding the routing table: from the server's watches, or from a static file."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from llmgw.api import Model, Replica, load_path
from llmgw.gateway.table import RoutingTable

log = logging.getLogger(__name__)

KINDS = ("models", "replicas")


class ServerSource:
    """Keeps a table in step with the server through `Client.list_and_watch`.

    The client relists after a 410 and re-watches after a drop, and emits a
    DELETED for every object that vanished across a relist, so a replica
    deleted while the watch was down does not stay routable. `synced` turns
    True once both kinds have been listed.
    """

    def __init__(self, client, table: RoutingTable, on_change=None, on_synced=None):
        self.client = client
        self.table = table
        self.on_change = on_change  # (kind, type, obj) after each event that changed routing
        self.on_synced = on_synced  # () once both kinds have been listed
        self._synced: set[str] = set()
        self._tasks: list[asyncio.Task] = []

    @property
    def synced(self) -> bool:
        return self._synced.issuperset(KINDS)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(kind), name=f"gateway-watch-{kind}") for kind in KINDS]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, kind: str) -> None:
        delay = 1.0
        while True:
            try:
                async for type_, obj in self.client.list_and_watch(kind, synced=True):
                    if type_ == "SYNCED":
                        if kind not in self._synced:
                            log.info("routing table: %s listed", kind)
                        self._synced.add(kind)
                        if self.synced and self.on_synced:
                            self.on_synced()
                        delay = 1.0
                        continue
                    if self.table.apply(kind, type_, obj) and self.on_change:
                        self.on_change(kind, type_, obj)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 Forbidden, a bad object...: keep serving what we have
                log.error("watching %s failed: %s; retrying in %.0f s", kind, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


def load_static(path: str | Path, table: RoutingTable) -> int:
    """Load Model and Replica manifests (with status) from a file or folder; returns objects loaded."""
    objs = [o for _, o in load_path(path)]
    models = [o for o in objs if isinstance(o, Model)]
    replicas = [o for o in objs if isinstance(o, Replica)]
    table.replace("models", models)
    table.replace("replicas", replicas)
    return len(models) + len(replicas)
