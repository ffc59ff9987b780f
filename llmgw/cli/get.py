"""`llmgw get`: a table of objects (or yaml, json, names), once or followed (-w)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from llmgw.api import AnyObject, ApiKey
from llmgw.api.kinds import kind_named
from llmgw.api.selectors import Selector, parse_selector
from llmgw.api.usage import KeyUsage
from llmgw.cli.completion import complete_kind, complete_name
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.printers.kinds import Beside, KindPrinter, by_name, printer_of
from llmgw.printers.objects import format_event, format_objects
from llmgw.printers.table import WatchTable, print_table

if TYPE_CHECKING:
    from llmgw.client import Client

F = TypeVar("F", bound=Callable[..., object])
Kind = type[AnyObject]
# What the watch's producers hand the printing loop: (kind, event type, object), with
# "SYNCED" (object None) after each list, "TICK" to redraw, "ERROR" carrying the exception.
Item = tuple[Kind, str, "AnyObject | BaseException | None"]


def kind_arg(word: str) -> Kind:
    """The kind a person typed, as its class: the CLI's edge, past which no kind is a word."""
    try:
        return kind_named(word)
    except ValueError as err:
        raise usage_error(str(err)) from None


def selector_arg(text: str | None) -> Selector:
    try:
        return parse_selector(text)
    except ValueError as err:
        raise usage_error(str(err)) from None


async def key_usage(c: Client) -> dict[str, KeyUsage]:
    return {k: KeyUsage.model_validate(u) for k, u in (await c.apikey_usage())["keys"].items()}


async def warn_unless_keys_enforced(c: Client) -> None:
    """One line on stderr when no live gateway enforces the ApiKeys: only a gateway run with
    --watch-api-keys reports their usage (llmgw/api/usage.py), and the server counts those reports."""
    if not (await c.apikey_usage())["gateways"]:
        click.echo("warning: no live gateway enforces API keys (none runs with --watch-api-keys): requests pass "
                   "without a key and beyond its limits", err=True)


async def read_beside(c: Client, printer: KindPrinter[AnyObject]) -> Beside:
    """What the kind's table reads beside its objects: every object of the kinds it follows, the keys' usage."""
    followed = {k: (await c.list(k))[0] for k in printer.follows}
    return Beside(followed, await key_usage(c) if printer.reads_usage else {})


async def fetch(c: Client, kind: Kind, name: str | None, sel: Selector) -> tuple[list[AnyObject], Beside]:
    """The objects to show, and what their table shows beside them."""
    if name:
        objects = [await c.get(kind, name)]
    else:
        items, _ = await c.list(kind, selector=str(sel) or None)
        objects = by_name(o for o in items if sel.matches(o.metadata.labels))
    return objects, await read_beside(c, printer_of(kind))


def show(kind: Kind, objects: list[AnyObject], beside: Beside, output: str | None, single: bool) -> None:
    if output in ("yaml", "json", "name"):
        if objects or single:
            click.echo(format_objects(objects, output, single))
        return
    if not objects:
        click.echo("No resources found.", err=True)
        return
    print_table(*printer_of(kind).table(objects, beside, wide=output == "wide"))


async def _get(conn: Connection, kind: Kind, name: str | None, output: str | None, sel: Selector) -> None:
    async with conn.client() as c:
        objects, beside = await fetch(c, kind, name, sel)
        if kind is ApiKey:
            await warn_unless_keys_enforced(c)
    show(kind, objects, beside, output, single=bool(name))


async def _watch(conn: Connection, kind: Kind, name: str | None, output: str | None, sel: Selector) -> None:
    """List, then follow changes: the table redrawn on a terminal, changed rows or objects into a pipe."""
    printer = printer_of(kind)
    kinds = [kind, *(printer.follows if output in (None, "wide") else ())]
    queue: asyncio.Queue[Item] = asyncio.Queue()
    async with conn.client() as c:
        if kind is ApiKey:
            await warn_unless_keys_enforced(c)
        async def follow(k: Kind) -> None:
            try:
                async for type_, obj in c.list_and_watch(k, selector=(str(sel) or None) if k is kind else None,
                                                         synced=True):
                    await queue.put((k, type_, obj))
            except Exception as err:  # noqa: BLE001 - surfaced by the main loop
                await queue.put((k, "ERROR", err))

        tasks = [asyncio.create_task(follow(k)) for k in kinds]
        try:
            await _render_loop(queue, printer, kinds, name, output, sel,
                               (lambda: key_usage(c)) if printer.reads_usage else None)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _wanted(obj: AnyObject, name: str | None, sel: Selector) -> bool:
    return (name is None or obj.name == name) and sel.matches(obj.metadata.labels)


async def _render_loop(queue: asyncio.Queue[Item], printer: KindPrinter[AnyObject], kinds: list[Kind],
                       name: str | None, output: str | None, sel: Selector,
                       read_usage: Callable[[], Awaitable[dict[str, KeyUsage]]] | None = None) -> None:
    """`kinds`: the kind shown, then those its table follows. `read_usage`: the keys' usage
    (LAST-USE), read again at each change of the keys, not at each redraw (a terminal's once a
    second), which only moves the ages."""
    kind, followed = kinds[0], kinds[1:]
    cache: dict[Kind, dict[str, AnyObject]] = {k: {} for k in kinds}
    usage: dict[str, KeyUsage] = {}
    synced: set[Kind] = set()
    tabular = output in (None, "wide")
    with WatchTable() as view:
        while True:
            if not view.redraws:
                k, type_, obj = await queue.get()
            else:  # a terminal: redraw every second so AGE moves
                try:
                    k, type_, obj = await asyncio.wait_for(queue.get(), timeout=1.0)
                except asyncio.TimeoutError:
                    k, type_, obj = kind, "TICK", None
            if isinstance(obj, BaseException):
                raise obj
            if obj is not None:
                if type_ == "DELETED":
                    cache[k].pop(obj.name, None)
                else:
                    cache[k][obj.name] = obj
            elif type_ == "SYNCED":
                synced.add(k)
            if not tabular:
                if k is kind and obj is not None and _wanted(obj, name, sel):
                    click.echo(format_event(obj, output or "yaml"))
                continue
            if synced != set(kinds):
                continue
            if read_usage is not None and type_ != "TICK":
                usage = await read_usage()
            objects = by_name(o for o in cache[kind].values() if _wanted(o, name, sel))
            view.show(*printer.table(objects, Beside({k: cache[k].values() for k in followed}, usage),
                                     wide=output == "wide"))


def get_options(f: F) -> F:
    f = click.option("-w", "--watch", is_flag=True, help="After listing, follow changes.")(f)
    f = click.option("-l", "--selector", metavar="SELECTOR",
                     help="Label selector: k=v, k!=v, k, !k, comma-joined.")(f)
    f = click.option("-o", "--output", type=click.Choice(["wide", "yaml", "json", "name"]),
                     help="Output format (default: a table).")(f)
    return f


def run_get(conn: Connection, kind: Kind, name: str | None, output: str | None, selector: str | None,
            watch: bool) -> None:
    sel = selector_arg(selector)
    if watch:
        run(_watch(conn, kind, name, output, sel))
    else:
        run(_get(conn, kind, name, output, sel))


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("kind", shell_complete=complete_kind)
@click.argument("name", required=False, shell_complete=complete_name)
@get_options
@connection_options
def get(kind: str, name: str | None, output: str | None, selector: str | None, watch: bool,
        conn: Connection) -> None:
    """Show objects of KIND (node, model, replica, shard; singular, plural or short) as a table;
    KIND,KIND,... lists each kind, a table after another."""
    kinds = [kind_arg(word) for word in kind.split(",")]
    if len(kinds) > 1 and (name or watch):
        raise usage_error("several kinds (KIND,KIND) are listed once: without NAME or -w")
    for i, k in enumerate(kinds):
        if i:
            click.echo()
        run_get(conn, k, name, output, selector, watch)
