"""An Adapter's table (`llmgw get adapters`: its base, where it is resident of minReplicas, and why
not where it was asked) and what `describe` shows beside it: each replica asked to hold it, resident
or not and why."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import ADAPTER_READY, LoraAdapter
from llmgw.api.meta import get_condition
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.table import NONE, human_age, join, section


def _reason(a: LoraAdapter) -> str:
    ready = get_condition(a.status.conditions, ADAPTER_READY)
    return ready.reason if ready is not None and ready.reason else NONE


@register(LoraAdapter)
class AdapterPrinter(KindPrinter[LoraAdapter]):
    # RESIDENT is resident replicas/minReplicas; REASON is its Ready condition's (Resident when it holds).
    headers = ["NAME", "BASE", "RESIDENT", "REASON", "REPLICAS", "AGE"]
    wide_headers = ["SOURCE", "PINNED"]

    def rows(self, objects: Sequence[LoraAdapter], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[a.name, a.spec.baseModel, f"{len(a.status.resident)}/{a.spec.minReplicas}", _reason(a),
                 join(a.status.resident), human_age(a.metadata.creationTimestamp, now)] for a in objects]

    def wide(self, a: LoraAdapter) -> list[str]:
        return [a.spec.source, "yes" if a.spec.pinned else "no"]

    async def related(self, reader: Reader, obj: LoraAdapter) -> list[str]:
        pending = {p.replica: p for p in obj.status.pending}
        rows = []
        for replica in obj.status.placement:
            p = pending.get(replica)
            resident = replica in obj.status.resident
            rows.append([replica, "yes" if resident else "no", p.reason if p else NONE,
                         p.message if p and p.message else NONE])
        return section("Placement", ["REPLICA", "RESIDENT", "REASON", "MESSAGE"], rows)
