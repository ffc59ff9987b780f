"""`llmgw describe`: one object, the objects a person looks at next, its recent events, for a
failed shard (of a replica) the last lines of its engine log, for an API key its recent usage, and for
a GitSource its last error."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import click

from llmgw.api.errors import StatusError
from llmgw.api.kinds import all_of_kind
from llmgw.api.logs import LogQuery
from llmgw.api.meta import get_condition
from llmgw.api.types import GITSOURCE_WAITING, KINDS, AnyObject, ApiKey, GitSource, Model, Node, Replica, Shard
from llmgw.api.usage import KeyUsage
from llmgw.api.wellknown import shard_name
from llmgw.cli.completion import complete_kind, complete_name
from llmgw.cli.connect import Connection, connection_options, run
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.cli.get import by_name, kind_arg
from llmgw.printers.columns import gpus_used
from llmgw.printers.describe import describe as describe_text
from llmgw.printers.table import NONE, section
from llmgw.printers.usage import usage_lines

if TYPE_CHECKING:
    from llmgw.client import Client

ENGINE_LOG_LINES = 10   # of a failed shard's engine log


async def _related(c: Client, obj: AnyObject) -> list[str]:
    """A node's replicas, a model's replicas, a replica's shards, an API key's usage."""
    lines: list[str] = []
    if isinstance(obj, Node):
        replicas = all_of_kind(Replica, (await c.list(Replica))[0])
        mine = [r for r in replicas if any(p.node == obj.name for p in r.spec.placement)]
        used = len(gpus_used(replicas).get(obj.name, ()))
        lines.append(f"Allocated GPUs: {used}/{len(obj.status.gpus)}")
        lines += section("Replicas", ["NAME", "MODEL", "PHASE", "GPUS"], [
            [r.name, r.spec.model, r.status.phase,
             ",".join(str(g) for p in r.spec.placement if p.node == obj.name for g in p.gpus) or NONE]
            for r in by_name(mine)])
    elif isinstance(obj, Model):
        replicas = all_of_kind(Replica, (await c.list(Replica))[0])
        mine = [r for r in replicas if r.spec.model == obj.name]
        lines += section("Replicas", ["NAME", "PHASE", "NODES", "TEMPLATE"], [
            [r.name, r.status.phase, ",".join(dict.fromkeys(p.node for p in r.spec.placement)) or NONE,
             r.spec.templateHash] for r in by_name(mine)])
    elif isinstance(obj, Replica):
        shards = all_of_kind(Shard, (await c.list(Shard))[0])
        ranks = sorted((s for s in shards if s.spec.replica == obj.name), key=lambda s: s.spec.rank)
        lines += section("Shards", ["NAME", "NODE", "RANK", "PHASE"],
                         [[s.name, s.spec.node, str(s.spec.rank), s.status.phase] for s in ranks])
        for rank in _failed_ranks(obj, ranks):
            lines += await _engine_log(c, Replica, obj.name, rank)
    elif isinstance(obj, ApiKey):
        got = await c.apikey_usage(obj.name)
        lines += usage_lines(KeyUsage.model_validate(got["usage"]), got["gateways"])
    elif isinstance(obj, Shard) and obj.status.phase == "Failed":
        lines += await _engine_log(c, Shard, obj.name, None)
    elif isinstance(obj, GitSource):
        lines.append(f"Last error:   {_last_error(obj)}")
    return lines


def _last_error(src: GitSource) -> str:
    """Why a GitSource cannot apply its commit (Stalled), or why its last try failed (Ready's reason)."""
    stalled = get_condition(src.status.conditions, "Stalled")
    if stalled is not None and stalled.status == "True":
        return f"{stalled.reason}: {stalled.message}"
    ready = get_condition(src.status.conditions, "Ready")
    if ready is not None and ready.status == "False" and ready.reason not in GITSOURCE_WAITING:
        return f"{ready.reason}: {ready.message}"
    return NONE


def _failed_ranks(r: Replica, shards: list[Shard]) -> list[int]:
    """The ranks of a replica's failed shards: those in phase Failed, and while the replica is
    Failed, the one its message names (the controller deletes the failed shard within seconds;
    its log stays on the node, which the placement still names)."""
    ranks = {s.spec.rank for s in shards if s.status.phase == "Failed"}
    if r.status.phase == "Failed":
        ranks |= {p.rank for p in r.spec.placement
                  if re.search(rf"\bshard {re.escape(shard_name(r.name, p.rank))}\b", r.status.message)}
    return sorted(ranks)


async def _engine_log(c: Client, kind: type[Replica] | type[Shard], name: str, rank: int | None) -> list[str]:
    """The last lines of the engine log of a shard (a replica's of `rank`), read through the API
    server as `llmgw logs` reads it; one line saying why when it cannot be read (a caller who may
    not read logs, an agent that serves none)."""
    what = f"shard {name}" if rank is None else f"shard {shard_name(name, rank)}"
    try:
        text = b"".join([chunk async for chunk in c.log(kind, name, LogQuery(tail=ENGINE_LOG_LINES), rank=rank)])
    except StatusError as err:
        return [f"Engine log ({what}): not shown: {err}"]
    log = text.decode(errors="replace").splitlines()
    return [f"Engine log ({what}, last {ENGINE_LOG_LINES} lines):", *(f"  {line}" for line in log or [NONE])]


async def _describe(conn: Connection, kind: str, name: str) -> str:
    async with conn.client() as c:
        obj = await c.get(KINDS[kind], name)
        events = await c.events(KINDS[kind], name)
        extra = await _related(c, obj)
    return describe_text(obj, events, extra)


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("kind", shell_complete=complete_kind)
@click.argument("name", shell_complete=complete_name)
@connection_options
def describe(kind: str, name: str, conn: Connection) -> None:
    """Show one object: metadata, spec, status, conditions, related objects (an API key's usage over
    the live gateways) and recent events."""
    click.echo(run(_describe(conn, kind_arg(kind), name)))
