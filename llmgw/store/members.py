"""Servers and controller-managers announcing themselves (llmgw/api/members.py) under
/llmgw/members/<component>/<name>, each bound to a lease of its own, kept alive while it runs."""
from __future__ import annotations

import asyncio
import builtins
import logging

from llmgw.api.members import Component, Member
from llmgw.store import keys as K
from llmgw.store.errors import StoreError
from llmgw.store.kv import KV
from llmgw.store.leases import Leases

log = logging.getLogger("llmgw.members")


class Members:
    def __init__(self, kv: KV, leases: Leases):
        self._kv, self._leases = kv, leases

    async def list(self, component: Component) -> builtins.list[Member]:
        """The live members of a component, by name."""
        items, _ = await self._kv.list(K.members_prefix(component))
        return [Member.model_validate_json(v) for _, v, _ in items]

    async def announce(self, component: Component, member: Member, ttl: int = 15) -> None:
        """Write the member under a lease of its own and keep it alive until cancelled (then the
        lease is revoked: the member is gone at once); a lease that expired meanwhile (etcd
        unreachable for longer than ttl) is granted and written again."""
        key, value = K.member_key(component, member.name), member.model_dump_json(exclude_none=True).encode()
        lease_id = 0
        try:
            while True:
                try:
                    if not lease_id or not await self._leases.refresh(lease_id):
                        lease_id = await self._leases.grant(ttl)
                        await self._kv.put(key, value, lease=lease_id)
                except StoreError as err:
                    log.warning("announcing %s %s: %s; trying again", component, member.name, err)
                await asyncio.sleep(ttl / 3)
        finally:
            if lease_id:
                try:
                    await asyncio.shield(self._leases.revoke(lease_id))
                except (StoreError, asyncio.CancelledError):
                    pass   # it expires by itself
