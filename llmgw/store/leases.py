"""Leases, and the heartbeats bound to them: a key that vanishes when its writer goes silent."""
from __future__ import annotations

import json
from typing import Any

from llmgw.api.meta import now
from llmgw.store import keys as K
from llmgw.store.etcd import Etcd
from llmgw.store.kv import KV
from llmgw.store.listwatch import KeyNames


class Leases:
    def __init__(self, etcd: Etcd):
        self._conn = etcd.conn

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        lease = await self._conn.call(lambda c: c.lease(ttl))
        lease_id: int = lease.id
        return lease_id

    async def refresh(self, lease_id: int) -> bool:
        """True while the lease lives; False once it expired."""
        reply = await self._conn.call(lambda c: c.refresh_lease(lease_id))
        return reply is not None and reply.TTL > 0

    async def revoke(self, lease_id: int) -> None:
        """End the lease now: the keys bound to it go."""
        await self._conn.call(lambda c: c.revoke_lease(lease_id))


class Heartbeats:
    """/llmgw/heartbeat/<node>, bound to a lease: its expiry is how a node's silence shows."""

    def __init__(self, kv: KV, leases: Leases, lease_ids: dict[str, int]):
        self._kv, self._leases = kv, leases
        self._lease_ids = lease_ids       # node -> its heartbeat's lease, shared with the fenced views

    async def beat(self, node: str, ttl: int = 15, info: dict[str, Any] | None = None) -> None:
        """Keep the node's heartbeat alive: refresh its lease, or write it anew on a new one."""
        lease_id = self._lease_ids.get(node)
        if lease_id is not None and await self._leases.refresh(lease_id):
            return
        lease_id = await self._leases.grant(ttl)
        self._lease_ids[node] = lease_id
        value = json.dumps({"node": node, "since": now().isoformat(), **(info or {})}).encode()
        await self._kv.put(K.heartbeat_key(node), value, lease=lease_id)

    async def list(self) -> dict[str, dict[str, Any]]:
        """The nodes with a live heartbeat, and what each wrote in it."""
        items, _ = await self._kv.list(K.HEARTBEAT)
        return {k[len(K.HEARTBEAT):]: json.loads(v) for k, v, _ in items}

    def lister_watcher(self) -> KeyNames:
        """The nodes with a live heartbeat, as a reflector's lister-watcher: a beat written anew
        is ADDED, an expired one DELETED (a refresh of its lease is no event)."""
        return KeyNames(self._kv, K.HEARTBEAT)
