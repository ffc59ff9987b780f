"""The gateways' demand reports, under /llmgw/demand/<gateway>, each bound to its gateway's lease:
a gateway that stops reporting has its figures expire with the lease, as a node's heartbeat does."""
from __future__ import annotations

from llmgw.api.demand import DemandReport
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

    async def report(self, report: DemandReport, ttl: int = 15) -> None:
        """Write the gateway's report, and keep its lease alive (a new one once it expired)."""
        gateway = report.gateway
        lease_id = self._lease_ids.get(gateway)
        if lease_id is None or not await self._leases.refresh(lease_id):
            lease_id = self._lease_ids[gateway] = await self._leases.grant(ttl)
        await self._kv.put(K.demand_key(gateway), report.model_dump_json().encode(), lease=lease_id)

    async def list(self) -> list[DemandReport]:
        """The live gateways' reports."""
        items, _ = await self._kv.list(K.DEMAND)
        return [_parse(k[len(K.DEMAND):], v) for k, v, _ in items]

    def lister_watcher(self) -> KeyValues[DemandReport]:
        """The live reports, as a reflector's lister-watcher: a report written is ADDED, an expired
        one DELETED (an empty report of that gateway)."""
        return KeyValues(self._kv, K.DEMAND, _parse)
