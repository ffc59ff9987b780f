"""Leader election: one holder of /llmgw/leader/<component>, bound to its lease."""
from __future__ import annotations

import json
from typing import Any

from llmgw.store import keys as K
from llmgw.store.etcd import CREATE, Etcd, as_bytes, compare, put_op, txn_request
from llmgw.store.kv import KV
from llmgw.store.leases import Leases
from llmgw.version import version


class Leadership:
    """A held leader key, bound to a lease: held while ``store.leases.refresh(lease_id)`` is True.

    ``key`` and ``create_revision`` are what ``Store.fenced`` takes: writes made
    through that view fail once another holder took the key.
    """

    def __init__(self, leases: Leases, key: str, lease_id: int, create_revision: int, ttl: int):
        self._leases, self.key, self.lease_id = leases, key, lease_id
        self.create_revision, self.ttl = create_revision, ttl

    async def resign(self) -> None:
        try:
            await self._leases.revoke(self.lease_id)
        except Exception:  # noqa: BLE001 the lease expires by itself anyway
            pass


class Election:
    def __init__(self, etcd: Etcd, kv: KV, leases: Leases):
        self._etcd, self._kv, self._leases = etcd, kv, leases

    async def campaign(self, component: str, identity: str, ttl: int = 15) -> Leadership | None:
        """Try once to take the leader key; None when someone else holds it."""
        key = K.leader_key(component)
        lease_id = await self._leases.grant(ttl)
        resp = await self._etcd.send_txn(txn_request(
            [compare(as_bytes(key), CREATE, create_revision=0)],
            [put_op(key, json.dumps({"holder": identity, "version": version()}).encode(), lease_id)]))
        if not resp.succeeded:
            await self._leases.revoke(lease_id)
            return None
        return Leadership(self._leases, key, lease_id, resp.header.revision, ttl)

    async def vacated(self, component: str) -> None:
        """Return once the component's leader key is gone (its holder resigned, or its lease
        expired), at once when nobody holds it: a standby campaigns then, not at its next retry."""
        key = K.leader_key(component)
        read = await self._etcd.range(key)
        if not read.kvs:
            return
        # from the read on, not from the key's last write: etcd would otherwise send the watch
        # through the whole history since the holder took the key (a fleet's writes), at each
        # of these watches, before it reports anything
        async for ev in self._kv.watch(key, read.header.revision + 1):
            if ev.key == key and ev.type == "DELETE":
                return

    async def leader(self, component: str) -> dict[str, Any] | None:
        """What the holder of the component's leader key wrote ({"holder": identity, "version": its
        llmgw version}, the version absent from a 0.1.0 holder), or None."""
        got = await self._kv.get(K.leader_key(component))
        return json.loads(got[0]) if got else None
