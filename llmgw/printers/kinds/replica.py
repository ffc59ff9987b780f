"""A Replica's table (`llmgw get replicas`) and what `describe` shows beside it: its shards,
and the last lines of its failed shards' engine logs."""
from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from llmgw.api import Replica, Shard
from llmgw.api.meta import get_condition
from llmgw.api.wellknown import shard_name
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.kinds.shard import engine_log
from llmgw.printers.table import NONE, human_age, join, section, unique


def _failed_ranks(r: Replica, shards: list[Shard]) -> list[int]:
    """The ranks of a replica's failed shards: those in phase Failed, and while the replica is
    Failed, the one its message names (the controller deletes the failed shard within seconds;
    its log stays on the node, which the placement still names)."""
    ranks = {s.spec.rank for s in shards if s.status.phase == "Failed"}
    if r.status.phase == "Failed":
        ranks |= {p.rank for p in r.spec.placement
                  if re.search(rf"\bshard {re.escape(shard_name(r.name, p.rank))}\b", r.status.message)}
    return sorted(ranks)


@register(Replica)
class ReplicaPrinter(KindPrinter[Replica]):
    headers = ["NAME", "MODEL", "PHASE", "NODES", "ENDPOINT", "RESTARTS", "AGE"]
    wide_headers = ["ENGINE", "GPUS", "MESSAGE"]

    def rows(self, objects: Sequence[Replica], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[r.name, r.spec.model, "Terminating" if r.metadata.deletionTimestamp is not None else r.status.phase,
                 join(unique(p.node for p in sorted(r.spec.placement, key=lambda p: p.rank))),
                 r.status.endpoint or NONE, str(r.status.restarts), human_age(r.metadata.creationTimestamp, now)]
                for r in objects]

    def wide(self, r: Replica) -> list[str]:
        why = r.status.message
        sched = get_condition(r.status.conditions, "Scheduled")
        if not why and sched is not None and sched.status == "False":
            why = sched.message
        return [r.spec.profile.engine, str(sum(len(p.gpus) for p in r.spec.placement)), why or NONE]

    async def related(self, reader: Reader, obj: Replica) -> list[str]:
        shards, _ = await reader.list(Shard)
        ranks = sorted((s for s in shards if s.spec.replica == obj.name), key=lambda s: s.spec.rank)
        lines = section("Shards", ["NAME", "NODE", "RANK", "PHASE"],
                        [[s.name, s.spec.node, str(s.spec.rank), s.status.phase] for s in ranks])
        for rank in _failed_ranks(obj, ranks):
            lines += await engine_log(reader, Replica, obj.name, rank)
        return lines
