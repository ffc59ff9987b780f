"""`llmgw logs`: an engine's log, read through the API server from the agent of its node."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from llmgw.api import Replica, Shard
from llmgw.api.logs import MAX_LOG_TAIL, MAX_RANK, LogQuery
from llmgw.cli.completion import complete_log_target
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.errors import EXIT_CODES_HELP

if TYPE_CHECKING:
    from llmgw.client import Client

LogKind = type[Replica] | type[Shard]
KIND_WORDS: dict[str, LogKind] = {"replica": Replica, "replicas": Replica, "rep": Replica,
                                  "shard": Shard, "shards": Shard}


def _target(word: str) -> tuple[LogKind | None, str]:
    """REPLICA, SHARD, replica/NAME or shard/NAME: (the kind, None when the name alone says it; name)."""
    kind, sep, name = word.partition("/")
    if not sep:
        return None, word
    if kind not in KIND_WORDS or not name:
        raise usage_error(f"{word!r}: give a replica or a shard: NAME, replica/NAME or shard/NAME")
    return KIND_WORDS[kind], name


async def _which(c: Client, name: str) -> LogKind:
    """A bare name is a replica's if one has it, else a shard's."""
    from llmgw.api.errors import NotFound

    try:
        await c.get(Replica, name)
    except NotFound:
        return Shard
    return Replica


async def _logs(conn: Connection, target: str, query: LogQuery, rank: int | None) -> None:
    kind, name = _target(target)
    out = sys.stdout.buffer
    async with conn.client() as c:
        kind = kind or await _which(c, name)
        if kind is Shard and rank is not None:
            raise usage_error("--rank picks a replica's shard; a shard has one rank")
        async for chunk in c.log(kind, name, query, rank=rank if kind is Replica else None):
            out.write(chunk)
            out.flush()


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("target", metavar="REPLICA|SHARD", shell_complete=complete_log_target)
@click.option("--rank", type=click.IntRange(0, MAX_RANK), help="A replica's shard of this rank (default 0).")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming what the engine writes until it stops.")
@click.option("--tail", type=click.IntRange(0, MAX_LOG_TAIL), metavar="N",
              help="Only the last N lines (default: the log's end, at most 1 MiB).")
@click.option("-p", "--previous", is_flag=True,
              help="The run before the latest on the node (the crashed engine's, once it is rebuilt there).")
@click.option("-c", "--command", "command", metavar="NAME",
              help="Which program of the shard (ray-head, vllm, ...), when it runs several.")
@connection_options
def logs(target: str, rank: int | None, follow: bool, tail: int | None, previous: bool, command: str | None,
         conn: Connection) -> None:
    """Print an engine's log: a replica's shard (--rank, default 0) or a shard by name.

    TARGET is NAME (a replica, else a shard), replica/NAME or shard/NAME. The API server reads
    the log from the agent of the shard's node; admins may read any, a node its own shards'.
    A crashed engine's log stays readable until its replica is rebuilt twice on that node
    (--previous after one rebuild).
    """
    try:
        query = LogQuery.parse(LogQuery(tail=tail, follow=follow, previous=previous, command=command).params())
    except ValueError as err:
        raise usage_error(str(err)) from None
    run(_logs(conn, target, query, rank))
