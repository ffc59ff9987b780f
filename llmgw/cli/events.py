"""`llmgw events`: what happened to every object (or to one), newest last, once or followed (-w)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import click

from llmgw.api import AnyObject
from llmgw.api.events import EVENT_TYPES
from llmgw.cli.completion import complete_kind_slash_name
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.cli.get import kind_arg
from llmgw.printers.events import HEADERS, WIDE_HEADERS, event_row, format_event, format_events
from llmgw.printers.table import RowPrinter, print_table

Event = dict[str, Any]


def _for(text: str | None) -> tuple[type[AnyObject] | None, str | None]:
    """--for KIND or KIND/NAME: (the kind, the name), each None when not given."""
    if text is None:
        return None, None
    word, sep, name = text.partition("/")
    if sep and not name:
        raise usage_error(f"--for {text!r}: give KIND or KIND/NAME (replica/llama-x, node/gpu-1, models)")
    return kind_arg(word), name or None


def _rows(events: Sequence[Event], wide: bool) -> list[list[str]]:
    now = datetime.now(timezone.utc)
    return [event_row(e, now, wide) for e in events]


async def _list(conn: Connection, kind: type[AnyObject] | None, name: str | None, type_: str | None,
                output: str | None) -> None:
    async with conn.client() as c:
        items, _ = await c.list_events(kind, name)
    events = [e for e in items if type_ is None or e.get("type") == type_]
    if output in ("yaml", "json"):
        click.echo(format_events(events, output))
    elif not events:
        click.echo("No events found.", err=True)
    else:
        print_table(WIDE_HEADERS if output == "wide" else HEADERS, _rows(events, output == "wide"))


async def _watch(conn: Connection, kind: type[AnyObject] | None, name: str | None, type_: str | None,
                 output: str | None) -> None:
    """The events there are, then each one as it is recorded (an expiry is not shown); after a
    relist, those recorded meanwhile."""
    wide = output == "wide"
    rows = RowPrinter(WIDE_HEADERS if wide else HEADERS)
    listed: list[Event] | None = []   # the first list's events, until it is complete; then None

    def show(events: Sequence[Event]) -> None:
        events = [e for e in events if type_ is None or e.get("type") == type_]
        if output in ("yaml", "json"):
            for e in events:
                click.echo(format_event(e, output))
        elif events:
            rows.append(_rows(events, wide))

    async with conn.client() as c:
        async for type_seen, event in c.list_and_watch_events(kind, name, synced=True):
            if type_seen == "SYNCED" and listed is not None:
                show(listed)
                listed = None
            elif type_seen == "ADDED" and event is not None:
                if listed is not None:
                    listed.append(event)
                else:
                    show([event])


@click.command(epilog=EXIT_CODES_HELP)
@click.option("-w", "--watch", is_flag=True, help="After listing, print each new event as it is recorded.")
@click.option("--for", "for_", metavar="KIND[/NAME]", shell_complete=complete_kind_slash_name,
              help="Only the events of this object (replica/llama-x, node/gpu-1), or of every object of a kind.")
@click.option("--type", "type_", type=click.Choice(EVENT_TYPES), help="Only events of this type.")
@click.option("-o", "--output", type=click.Choice(["wide", "yaml", "json"]),
              help="Output format (default: a table; wide adds the time and the whole message).")
@connection_options
def events(watch: bool, for_: str | None, type_: str | None, output: str | None, conn: Connection) -> None:
    """Show the events of every object, newest last, as `kubectl get events` does.

    Controllers and agents record them (a replica rebuilt, a node lost, a shard that failed);
    each expires an hour after it was recorded.
    """
    kind, name = _for(for_)
    run((_watch if watch else _list)(conn, kind, name, type_, output))
