"""The gateways' demand reports, under /llmgw/demand/<gateway>, and their API keys' usage, under
/llmgw/usage/<gateway>, both bound to the gateway's lease: a gateway that stops reporting has its
figures expire with the lease, as a node's heartbeat does; one that stops withdraws them at once
(`withdraw`)."""
from __future__ import annotations

import builtins

from llmgw.api.demand import DemandReport
from llmgw.api.usage import UsageReport
from llmgw.store import keys as K
from llmgw.store.kv import KV
from llmgw.store.leases import Leases
from llmgw.store.listwatch import KeyValues


def _parse(gateway: str, value: bytes | None) -> DemandReport:
    # A deleted or expired key has no value: the gateway then reports nothing.
    return DemandReport.model_validate_json(value) if value else DemandReport(gateway=gateway)


class Demand:
    def __init__(self, kv: KV, leases: Leases):
        self._kv, self._leases = kv, leases
        self._lease_ids: dict[str, int] = {}   # gateway -> the lease its report is bound to
        # (gateway, key) -> (lease, value) last written: a report that changed nothing refreshes the
        # lease and writes nothing, so usage sent beside the demand adds no write of the demand
        self._written: dict[tuple[str, str], tuple[int, bytes]] = {}

    async def report(self, report: DemandReport, ttl: int = 15, usage: UsageReport | None = None) -> None:
        """Write the gateway's report (and its keys' usage), and keep its lease alive (a new one
        once it expired)."""
        gateway = report.gateway
        lease_id = self._lease_ids.get(gateway)
        if lease_id is None or not await self._leases.refresh(lease_id):
            lease_id = self._lease_ids[gateway] = await self._leases.grant(ttl)
        await self._put(gateway, K.demand_key(gateway), report.model_dump_json().encode(), lease_id)
        if usage is not None:
            await self._put(gateway, K.usage_key(gateway), usage.model_dump_json().encode(), lease_id)

    async def withdraw(self, gateway: str) -> None:
        """Delete the gateway's report and its keys' usage now (a gateway that stops): revoke the lease
        they are bound to. Another server may have granted it and keep it alive: it then finds it gone
        at the next report of that name, and grants a new one and writes the report anew."""
        self._lease_ids.pop(gateway, None)
        keys = (K.demand_key(gateway), K.usage_key(gateway))
        for key in keys:
            self._written.pop((gateway, key), None)
        for lease_id in {await self._kv.lease(key) for key in keys} - {0}:
            await self._leases.revoke(lease_id)

    async def _put(self, gateway: str, key: str, value: bytes, lease_id: int) -> None:
        if self._written.get((gateway, key)) == (lease_id, value):
            return
        await self._kv.put(key, value, lease=lease_id)
        self._written[(gateway, key)] = (lease_id, value)

    async def list(self) -> list[DemandReport]:
        """The live gateways' reports."""
        items, _ = await self._kv.list(K.DEMAND)
        return [_parse(k[len(K.DEMAND):], v) for k, v, _ in items]

    async def usage(self) -> builtins.list[UsageReport]:
        """The live gateways' reports of their API keys' usage."""
        items, _ = await self._kv.list(K.USAGE)
        return [UsageReport.model_validate_json(v) for _, v, _ in items]

    def lister_watcher(self) -> KeyValues[DemandReport]:
        """The live reports, as a reflector's lister-watcher: a report written is ADDED, an expired
        one DELETED (an empty report of that gateway)."""
        return KeyValues(self._kv, K.DEMAND, _parse)
