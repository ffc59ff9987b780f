"""`llmgw describe`: one object, the objects a person looks at next (its kind's printer,
llmgw/printers/kinds/: for a failed shard (of a replica) the last lines of its engine log, for an
API key its recent usage, for a GitSource its last error), and its recent events."""
from __future__ import annotations

import click

from llmgw.cli.completion import complete_kind, complete_name
from llmgw.cli.connect import Connection, connection_options, run
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.cli.get import Kind, kind_arg
from llmgw.printers.describe import describe as describe_text
from llmgw.printers.kinds import printer_of


async def _describe(conn: Connection, kind: Kind, name: str) -> str:
    async with conn.client() as c:
        obj = await c.get(kind, name)
        events = await c.events(kind, name)
        extra = await printer_of(kind).related(c, obj)
    return describe_text(obj, events, extra)


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("kind", shell_complete=complete_kind)
@click.argument("name", shell_complete=complete_name)
@connection_options
def describe(kind: str, name: str, conn: Connection) -> None:
    """Show one object: metadata, spec, status, conditions, related objects (an API key's usage over
    the live gateways) and recent events."""
    click.echo(run(_describe(conn, kind_arg(kind), name)))
