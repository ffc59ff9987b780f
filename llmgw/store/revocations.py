"""Revoked certificate serials, under /llmgw/revoked/<serial>: the server refuses their holders.
And the certificates the server renewed, under /llmgw/renewed/<serial> (the serial each renewed):
a revoked certificate's renewals are revoked with it (`descendants`)."""
from __future__ import annotations

import json
from typing import Any

from llmgw.store import keys as K
from llmgw.store.kv import KV
from llmgw.store.listwatch import AfterErrorPolicy, KeyNames, after_store_error


class Revocations:
    def __init__(self, kv: KV):
        self._kv = kv

    async def add(self, serial: str | int, info: dict[str, Any] | None = None) -> None:
        """Record the serial as revoked, with what is known of it (role, name, when)."""
        await self._kv.put(K.revoked_key(str(serial)), json.dumps(info or {}).encode())

    async def list(self) -> dict[str, dict[str, Any]]:
        """Every revoked serial, with its info."""
        items, _ = await self._kv.list(K.REVOKED)
        return {k[len(K.REVOKED):]: json.loads(v) for k, v, _ in items}

    def lister_watcher(self, after_error: AfterErrorPolicy = after_store_error) -> KeyNames:
        """The revoked serials (lower case, as certificates' serials are compared), as a
        reflector's lister-watcher."""
        return KeyNames(self._kv, K.REVOKED, str.lower, after_error)

    async def is_revoked(self, serial: str) -> bool:
        return await self._kv.get(K.revoked_key(serial.lower())) is not None

    async def renewed(self, serial: str, renewed_from: str, info: dict[str, Any]) -> None:
        """Record that certificate `serial` renews `renewed_from` (with its role, name, notAfter)."""
        await self._kv.put(K.renewed_key(serial), json.dumps({"from": renewed_from, **info}).encode())

    async def renewals(self) -> dict[str, dict[str, Any]]:
        """Every certificate the server renewed: {serial: what was recorded (from, role, name, notAfter)}."""
        items, _ = await self._kv.list(K.RENEWED)
        return {k[len(K.RENEWED):]: json.loads(v) for k, v, _ in items}

    async def descendants(self, serial: str) -> dict[str, dict[str, Any]]:
        """The renewals of `serial`, of those renewals, and so on: {serial: what was recorded}."""
        records = await self.renewals()
        found: dict[str, dict[str, Any]] = {}
        parents = {serial}
        while parents:
            children = {s: r for s, r in records.items() if r.get("from") in parents and s not in found}
            found.update(children)
            parents = set(children)
        return found
