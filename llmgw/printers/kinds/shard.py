"""A Shard's table (`llmgw get shards`) and what `describe` shows beside a failed one: the
last lines of its engine log (a replica's failed shards' too, llmgw/printers/kinds/replica.py)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import Replica, Shard
from llmgw.api.errors import StatusError
from llmgw.api.logs import LogQuery
from llmgw.api.wellknown import shard_name
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.table import NONE, human_age, join

ENGINE_LOG_LINES = 10   # of a failed shard's engine log


def _phase(s: Shard) -> str:
    """The phase, with a pull's share done ("Pulling 40%")."""
    pull = s.status.pull
    if s.status.phase == "Pulling" and pull is not None and pull.bytesTotal:
        return f"Pulling {100 * pull.bytesDone // pull.bytesTotal}%"
    return s.status.phase


async def engine_log(reader: Reader, kind: type[Replica] | type[Shard], name: str, rank: int | None) -> list[str]:
    """The last lines of the engine log of a shard (a replica's of `rank`), read through the API
    server as `llmgw logs` reads it; one line saying why when it cannot be read (a caller who may
    not read logs, an agent that serves none)."""
    what = f"shard {name}" if rank is None else f"shard {shard_name(name, rank)}"
    try:
        text = b"".join([chunk async for chunk in reader.log(kind, name, LogQuery(tail=ENGINE_LOG_LINES), rank=rank)])
    except StatusError as err:
        return [f"Engine log ({what}): not shown: {err}"]
    log = text.decode(errors="replace").splitlines()
    return [f"Engine log ({what}, last {ENGINE_LOG_LINES} lines):", *(f"  {line}" for line in log or [NONE])]


@register(Shard)
class ShardPrinter(KindPrinter[Shard]):
    headers = ["NAME", "NODE", "RANK", "PHASE", "GPUS", "PORT", "AGE"]
    wide_headers = ["REPLICA", "ENGINE", "PID", "EXIT"]

    def rows(self, objects: Sequence[Shard], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[s.name, s.spec.node, f"{s.spec.rank}/{s.spec.worldSize}", _phase(s),
                 join(str(g) for g in s.spec.gpus), str(s.spec.ports.serve),
                 human_age(s.metadata.creationTimestamp, now)] for s in objects]

    def wide(self, s: Shard) -> list[str]:
        return [s.spec.replica, s.spec.engine, str(s.status.pid) if s.status.pid is not None else NONE,
                str(s.status.exitCode) if s.status.exitCode is not None else NONE]

    async def related(self, reader: Reader, obj: Shard) -> list[str]:
        return await engine_log(reader, Shard, obj.name, None) if obj.status.phase == "Failed" else []
