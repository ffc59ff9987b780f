"""The set of revoked certificate serials, kept current by a watch on /llmgw/revoked/."""
from __future__ import annotations

import asyncio
import logging

from llmgw.store import Store
from llmgw.store.keys import REVOKED

log = logging.getLogger("llmgw.server")


class Revocations:
    def __init__(self, store: Store, retry: float = 1.0):
        self._store, self._retry = store, retry
        self.serials: set[str] = set()
        self.ready = asyncio.Event()

    def __contains__(self, serial: str) -> bool:
        return serial.lower() in self.serials

    async def run(self) -> None:
        while True:
            try:
                items, rev = await self._store.list_raw(REVOKED)
                self.serials = {k[len(REVOKED):].lower() for k, _, _ in items}
                self.ready.set()
                async for ev in self._store.watch_raw(REVOKED, rev + 1):
                    serial = ev.key[len(REVOKED):].lower()
                    if ev.type == "PUT":
                        self.serials.add(serial)
                    else:
                        self.serials.discard(serial)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # etcd away or the stream dropped: relist after a pause
                log.warning("revocation watch interrupted (%s); relisting in %.0fs", err, self._retry)
                await asyncio.sleep(self._retry)
