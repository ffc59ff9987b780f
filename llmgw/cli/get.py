"""`llmgw get` and `llmgw describe`."""
from __future__ import annotations

import asyncio
import json

import click

from llmgw.api import Object, resolve_kind
from llmgw.api.selectors import Selector, parse_selector
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.cli.output import RowPrinter, is_terminal, print_table, rich_table
from llmgw.cli.render import describe as describe_text
from llmgw.cli.render import format_objects, to_dict
from llmgw.cli.tables import format_table, gpus_used, table


def kind_arg(word: str) -> str:
    try:
        return resolve_kind(word)
    except ValueError as err:
        raise usage_error(str(err)) from None


def selector_arg(text: str | None) -> Selector:
    try:
        return parse_selector(text)
    except ValueError as err:
        raise usage_error(str(err)) from None


def _by_name(objects) -> list:
    return sorted(objects, key=lambda o: o.name)


async def fetch(c, kind: str, name: str | None, sel: Selector) -> tuple[list[Object], list]:
    """The objects to show and, for nodes, every replica (GPUS and REPLICAS columns)."""
    if name:
        objects = [await c.get(kind, name)]
    else:
        items, _ = await c.list(kind, selector=str(sel) or None)
        objects = _by_name(o for o in items if sel.matches(o.metadata.labels))
    replicas = (await c.list("replicas"))[0] if kind == "nodes" else []
    return objects, replicas


def show(kind: str, objects, replicas, output: str | None, single: bool) -> None:
    if output in ("yaml", "json", "name"):
        if objects or single:
            click.echo(format_objects(objects, output, single))
        return
    if not objects:
        click.echo("No resources found.", err=True)
        return
    headers, rows = table(kind, objects, wide=output == "wide", replicas=replicas)
    print_table(headers, rows)


async def _get(conn: Connection, kind: str, name: str | None, output: str | None, sel: Selector) -> None:
    async with conn.client() as c:
        objects, replicas = await fetch(c, kind, name, sel)
    show(kind, objects, replicas, output, single=bool(name))


async def _watch(conn: Connection, kind: str, name: str | None, output: str | None, sel: Selector) -> None:
    """List, then follow changes: the table redrawn on a terminal, changed rows or objects into a pipe."""
    kinds = [kind] + (["replicas"] if kind == "nodes" and output in (None, "wide") else [])
    queue: asyncio.Queue = asyncio.Queue()
    async with conn.client() as c:
        async def follow(k: str) -> None:
            try:
                async for type_, obj in c.list_and_watch(k, selector=(str(sel) or None) if k == kind else None,
                                                         synced=True):
                    await queue.put((k, type_, obj))
            except Exception as err:  # noqa: BLE001 - surfaced by the main loop
                await queue.put((k, "ERROR", err))

        tasks = [asyncio.create_task(follow(k)) for k in kinds]
        try:
            await _render_loop(queue, kind, kinds, name, output, sel)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _wanted(obj: Object, name: str | None, sel: Selector) -> bool:
    return (name is None or obj.name == name) and sel.matches(obj.metadata.labels)


async def _render_loop(queue, kind, kinds, name, output, sel) -> None:
    cache: dict[str, dict[str, Object]] = {k: {} for k in kinds}
    synced: set[str] = set()
    tabular = output in (None, "wide")
    printer, live = None, None
    try:
        while True:
            if live is None:
                k, type_, obj = await queue.get()
            else:  # a terminal: redraw every second so AGE moves
                try:
                    k, type_, obj = await asyncio.wait_for(queue.get(), timeout=1.0)
                except asyncio.TimeoutError:
                    k, type_, obj = kind, "TICK", None
            if type_ == "ERROR":
                raise obj
            if type_ == "TICK":
                pass
            elif type_ == "SYNCED":
                synced.add(k)
            elif type_ == "DELETED":
                cache[k].pop(obj.name, None)
            else:
                cache[k][obj.name] = obj
            if not tabular:
                if k == kind and type_ != "SYNCED" and _wanted(obj, name, sel):
                    _print_event(type_, obj, output)
                continue
            if synced != set(kinds):
                continue
            objects = _by_name(o for o in cache[kind].values() if _wanted(o, name, sel))
            headers, rows = table(kind, objects, wide=output == "wide",
                                  replicas=list(cache.get("replicas", {}).values()))
            if is_terminal():
                if live is None:
                    from rich.live import Live
                    live = Live(rich_table(headers, rows), auto_refresh=False)
                    live.start()
                live.update(rich_table(headers, rows), refresh=True)
            else:
                printer = printer or RowPrinter(headers)
                printer.show(rows)
    finally:
        if live is not None:
            live.stop()


def _print_event(type_: str, obj: Object, output: str) -> None:
    if output == "name":
        click.echo(f"{obj.kind.lower()}/{obj.name}")
    elif output == "json":
        click.echo(json.dumps(to_dict(obj)))
    else:
        click.echo("---\n" + format_objects([obj], "yaml", single=True))


def get_options(f):
    f = click.option("-w", "--watch", is_flag=True, help="After listing, follow changes.")(f)
    f = click.option("-l", "--selector", metavar="SELECTOR",
                     help="Label selector: k=v, k!=v, k, !k, comma-joined.")(f)
    f = click.option("-o", "--output", type=click.Choice(["wide", "yaml", "json", "name"]),
                     help="Output format (default: a table).")(f)
    return f


def run_get(conn: Connection, kind: str, name: str | None, output: str | None, selector: str | None,
            watch: bool) -> None:
    kind = kind_arg(kind)
    sel = selector_arg(selector)
    if watch:
        run(_watch(conn, kind, name, output, sel))
    else:
        run(_get(conn, kind, name, output, sel))


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("kind")
@click.argument("name", required=False)
@get_options
@connection_options
def get(kind: str, name: str | None, output: str | None, selector: str | None, watch: bool,
        conn: Connection) -> None:
    """Show objects of KIND (node, model, replica, shard; singular, plural or short) as a table."""
    run_get(conn, kind, name, output, selector, watch)


# ------------------------------------------------------------------- describe

async def _related(c, obj: Object) -> list[str]:
    """The objects a person looks at next: a node's replicas, a model's replicas, a replica's shards."""
    lines: list[str] = []
    if obj.kind == "Node":
        replicas, _ = await c.list("replicas")
        mine = _by_name(r for r in replicas if any(p.node == obj.name for p in r.spec.placement))
        used = len(gpus_used(replicas).get(obj.name, ()))
        lines.append(f"Allocated GPUs: {used}/{len(obj.status.gpus)}")
        rows = [[r.name, r.spec.model, r.status.phase,
                 ",".join(str(g) for p in r.spec.placement if p.node == obj.name for g in p.gpus) or "<none>"]
                for r in mine]
        lines += _subtable("Replicas", ["NAME", "MODEL", "PHASE", "GPUS"], rows)
    elif obj.kind == "Model":
        replicas, _ = await c.list("replicas")
        mine = _by_name(r for r in replicas if r.spec.model == obj.name)
        rows = [[r.name, r.status.phase, ",".join(dict.fromkeys(p.node for p in r.spec.placement)) or "<none>",
                 r.spec.templateHash] for r in mine]
        lines += _subtable("Replicas", ["NAME", "PHASE", "NODES", "TEMPLATE"], rows)
    elif obj.kind == "Replica":
        shards, _ = await c.list("shards")
        mine = sorted((s for s in shards if s.spec.replica == obj.name), key=lambda s: s.spec.rank)
        rows = [[s.name, s.spec.node, str(s.spec.rank), s.status.phase] for s in mine]
        lines += _subtable("Shards", ["NAME", "NODE", "RANK", "PHASE"], rows)
    return lines


def _subtable(title: str, headers, rows) -> list[str]:
    if not rows:
        return [f"{title}:", "  <none>"]
    return [f"{title}:", *("  " + line for line in format_table(headers, rows).splitlines())]


async def _describe(conn: Connection, kind: str, name: str) -> str:
    async with conn.client() as c:
        obj = await c.get(kind, name)
        events = await c.events(kind, name)
        extra = await _related(c, obj)
    return describe_text(obj, events, extra)


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("kind")
@click.argument("name")
@connection_options
def describe(kind: str, name: str, conn: Connection) -> None:
    """Show one object: metadata, spec, status, conditions, related objects and recent events."""
    click.echo(run(_describe(conn, kind_arg(kind), name)))
