"""The set of revoked certificate serials, kept current by a watch on /llmgw/revoked/.

Requests are checked against it one by one; a long-lived request (a watch) registers with
`on_revoke` to be ended the moment its certificate is revoked.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from llmgw.api.client import EventType
from llmgw.backoff import Backoff
from llmgw.pki import CAError, CertificateAuthority
from llmgw.reflector import Reflector
from llmgw.store import Store
from llmgw.store.listwatch import after_store_error_never_raise

log = logging.getLogger("llmgw.server")


class Revocations:
    def __init__(self, store: Store, retry: float = 1.0, journal: CertificateAuthority | None = None):
        """retry: the longest wait after a failure; journal: the CA whose revocation journal is
        checked after each list (at start, and after etcd was restored under the server)."""
        self._store, self._retry, self._journal = store, retry, journal
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
        """Keep ``serials`` current (a reflector over the revoked keys); ``ready`` once listed."""
        # checking them never stops: any failure but a compaction is retried
        revoked = self._store.revocations.lister_watcher(after_store_error_never_raise)
        reflector = Reflector(revoked, self._change, key=str,
                              known=lambda: self.serials, on_synced=self._listed,
                              backoff=Backoff(min(0.1, self._retry), self._retry), name="revocation watch")
        await reflector.run()

    def _listed(self) -> None:
        self.ready.set()
        if self._journal is not None:
            self._check_journal(self._journal)

    def _check_journal(self, ca: CertificateAuthority) -> None:
        """A warning naming the serials of the CA's revocation journal that etcd's list lacks (etcd
        restored from a snapshot older than them). Where the server can read the journal: beside
        its --client-ca, when that is the CA directory's ca.crt."""
        try:
            journaled = ca.journaled()
        except (CAError, OSError) as err:
            log.warning("cannot read the revocation journal: %s", err)
            return
        missing = {e.serial: e.revokedAt for e in journaled if e.serial not in self.serials}
        if missing:
            log.warning("etcd's revocation list is older than the CA's journal %s: it lacks %d revocation(s), "
                        "the newest made %s (etcd restored from an older snapshot?); their certificates are "
                        "accepted until an admin runs `llmgw ca revoke --replay --dir %s`: %s", ca.journal_path,
                        len(missing), max(missing.values()), ca.dir, ", ".join(missing))

    def _change(self, type_: EventType, serial: str, revision: int) -> None:
        if type_ == "DELETED":
            self.serials.discard(serial)
        else:
            self._revoked({serial})

