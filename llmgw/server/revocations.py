"""The set of revoked certificate serials, kept current by a watch on /llmgw/revoked/.

Requests are checked against it one by one; a long-lived request (a watch) registers with
`on_revoke` to be ended the moment its certificate is revoked.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from llmgw.store import Store
from llmgw.store.keys import REVOKED

log = logging.getLogger("llmgw.server")


class Revocations:
    def __init__(self, store: Store, retry: float = 1.0):
        self._store, self._retry = store, retry
        self.serials: set[str] = set()
        self.ready = asyncio.Event()
        self._listeners: dict[str, set[Callable[[], None]]] = {}

    def __contains__(self, serial: str) -> bool:
        return serial.lower() in self.serials

    def on_revoke(self, serial: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` once `serial` is revoked (at once if it is already); returns the undo."""
        serial = serial.lower()
        if serial in self.serials:
            callback()
            return lambda: None
        self._listeners.setdefault(serial, set()).add(callback)

        def undo() -> None:
            listeners = self._listeners.get(serial)
            if listeners is not None:
                listeners.discard(callback)
                if not listeners:
                    del self._listeners[serial]
        return undo

    def _revoked(self, serials: set[str]) -> None:
        self.serials |= serials
        for serial in serials:
            for callback in self._listeners.pop(serial, ()):
                callback()

    async def run(self) -> None:
        while True:
            try:
                items, rev = await self._store.kv.list(REVOKED)
                listed = {k[len(REVOKED):].lower() for k, _, _ in items}
                self.serials &= listed
                self._revoked(listed)
                self.ready.set()
                async for ev in self._store.kv.watch(REVOKED, rev + 1):
                    serial = ev.key[len(REVOKED):].lower()
                    if ev.type == "PUT":
                        self._revoked({serial})
                    else:
                        self.serials.discard(serial)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 etcd away or the stream dropped: relist after a pause
                log.warning("revocation watch interrupted (%s); relisting in %.0fs", err, self._retry)
                await asyncio.sleep(self._retry)
