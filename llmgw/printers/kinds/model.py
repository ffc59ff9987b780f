"""A Model's table (`llmgw get models`) and what `describe` shows beside it: its replicas."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import SCALED, Model, Replica
from llmgw.api.meta import get_condition
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, by_name, register
from llmgw.printers.table import NONE, human_age, join, section, unique


def autoscale(m: Model) -> str:
    """`MIN-MAX` and the autoscaler's last reason (its condition Scaled), or none without autoscaling."""
    scaling = m.spec.autoscaling
    if scaling is None:
        return NONE
    scaled = get_condition(m.status.conditions, SCALED)
    return f"{scaling.minReplicas}-{scaling.maxReplicas}" + (f" {scaled.reason}" if scaled is not None else "")


@register(Model)
class ModelPrinter(KindPrinter[Model]):
    # READY is Ready/desired: spec.replicas, or the autoscaler's count (AUTOSCALE says why it moved).
    headers = ["NAME", "READY", "UP-TO-DATE", "AUTOSCALE", "ENGINE", "ALIASES", "AGE"]
    # GPU-MEM: what each GPU of a replica needs free, per profile (status.fit; ? where not estimated)
    wide_headers = ["SOURCE", "TEMPLATE", "NODE-SELECTOR", "GPU-MEM"]

    def rows(self, objects: Sequence[Model], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[m.name, f"{m.status.readyReplicas}/{m.wanted_replicas}", str(m.status.updatedReplicas),
                 autoscale(m), join(unique(p.engine for p in m.spec.profiles)), join(m.spec.aliases),
                 human_age(m.metadata.creationTimestamp, now)] for m in objects]

    def wide(self, m: Model) -> list[str]:
        return [m.spec.source or NONE, m.status.templateHash or NONE,
                join(f"{k}={v}" for k, v in sorted(m.spec.nodeSelector.items())),
                join(f"{f.estimate.neededBytes / (1 << 30):.1f}Gi" if f.estimate else "?" for f in m.status.fit)]

    async def related(self, reader: Reader, obj: Model) -> list[str]:
        replicas, _ = await reader.list(Replica)
        mine = [r for r in replicas if r.spec.model == obj.name]
        return section("Replicas", ["NAME", "PHASE", "NODES", "TEMPLATE"], [
            [r.name, r.status.phase, ",".join(dict.fromkeys(p.node for p in r.spec.placement)) or NONE,
             r.spec.templateHash] for r in by_name(mine)])
