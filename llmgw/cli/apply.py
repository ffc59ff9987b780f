"""`llmgw apply`, `llmgw diff` and `llmgw delete`."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from llmgw.api import AnyObject, manifests
from llmgw.api.applied import applied, check_not_owned
from llmgw.api.errors import NotFound
from llmgw.api.manifests import manifest_files
from llmgw.api.selectors import Selector
from llmgw.api.wellknown import GITSOURCE_LABEL
from llmgw.cli import errors as ec
from llmgw.cli.completion import complete_kind, complete_name
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.diff import applied_view, unified_diff
from llmgw.cli.errors import EXIT_CODES_HELP, CliError
from llmgw.cli.get import Kind, kind_arg, selector_arg
from llmgw.printers.objects import ref

R = TypeVar("R")

if TYPE_CHECKING:
    from llmgw.client import Client


def load_manifests(files: tuple[str, ...], recursive: bool) -> list[AnyObject]:
    """Every object of every file (ManifestError names file, document and field; duplicates too)."""
    for f in files:
        if Path(f).is_dir() and not manifest_files(f, recursive):
            raise usage_error(f"{f}: no .yaml, .yml or .json files"
                              + ("" if recursive else " (use -R for subdirectories)"))
    return [obj for _, obj in manifests.load_manifests(files, recursive)]


async def _get_or_none(c: Client, kind: Kind, name: str) -> AnyObject | None:
    try:
        return await c.get(kind, name)
    except NotFound:
        return None


async def _apply_one(c: Client, obj: AnyObject, dry_run: bool) -> str:
    """created | configured | unchanged.

    A manifest that carries metadata.resourceVersion (e.g. edited output of `get -o yaml`)
    is applied only onto that version: when the object changed since, the server answers
    409 and nothing is written.
    """
    rv = obj.metadata.resourceVersion
    if not dry_run and rv is None:
        result, _ = await c.apply(obj)
        return result
    live = await _get_or_none(c, type(obj), obj.name)
    if live is None:
        return "created" if dry_run else (await c.apply(obj))[0]
    unchanged = applied_view(live) == applied_view(obj, onto=live) and rv in (None, live.metadata.resourceVersion)
    if unchanged:
        return "unchanged"
    check_not_owned(live, obj)     # the server refuses it too; a dry run says so
    if dry_run:
        return "configured"
    desired = applied(live, obj)
    desired.metadata.resourceVersion = rv
    await c.update(desired)
    return "configured"


async def _apply(conn: Connection, objects: list[AnyObject], prune: bool, sel: Selector, dry_run: bool) -> None:
    suffix = " (dry run)" if dry_run else ""
    async with conn.client() as c:
        for obj in objects:
            click.echo(f"{ref(obj)} {await _apply_one(c, obj, dry_run)}{suffix}")
        if not prune:
            return
        wanted = {(type(o), o.name) for o in objects}
        for kind in dict.fromkeys(type(o) for o in objects):
            items, _ = await c.list(kind, selector=str(sel))
            for live in sorted(items, key=lambda o: o.name):
                if ((kind, live.name) in wanted or not sel.matches(live.metadata.labels)
                        or live.metadata.ownerReferences or live.metadata.deletionTimestamp is not None
                        or GITSOURCE_LABEL in live.metadata.labels):    # a GitSource prunes its own
                    continue
                if not dry_run:
                    await _delete_quietly(c, kind, live.name)
                click.echo(f"{ref(live)} pruned{suffix}")


async def _delete_quietly(c: Client, kind: Kind, name: str) -> None:
    try:
        await c.delete(kind, name)
    except NotFound:  # someone else was faster: the result is the same
        pass


def file_options(f: Callable[..., R]) -> Callable[..., R]:
    f = click.option("-R", "--recursive", is_flag=True, help="Also read the subdirectories of a directory.")(f)
    f = click.option("-f", "--filename", "files", multiple=True, required=True, metavar="FILE|DIR",
                     help="Manifest file or directory (.yaml, .yml, .json); repeatable.")(f)
    return f


def _load(files: tuple[str, ...], recursive: bool) -> list[AnyObject]:
    try:
        return load_manifests(files, recursive)
    except CliError:
        raise
    except Exception as err:
        from llmgw.cli.connect import explain

        cli_err = explain(err)
        if cli_err is None:
            raise
        raise cli_err from None


@click.command(epilog=EXIT_CODES_HELP)
@file_options
@click.option("--prune", is_flag=True,
              help="After applying, delete objects of the applied kinds that match --selector and are "
                   "not in the manifests (objects owned by another object, or applied by a GitSource, are "
                   "never pruned).")
@click.option("-l", "--selector", metavar="SELECTOR",
              help="With --prune (and required by it, not blank): which live objects may be pruned.")
@click.option("--dry-run", is_flag=True, help="Print what would be created/configured/unchanged/pruned; write nothing.")
@connection_options
def apply(files: tuple[str, ...], recursive: bool, prune: bool, selector: str | None, dry_run: bool,
          conn: Connection) -> None:
    """Create or update the objects of manifest files, printing created, configured or unchanged for each."""
    if prune and selector is None:
        raise usage_error("--prune needs --selector: it limits what may be deleted")
    if selector is not None and not prune:
        raise usage_error("--selector is only used with --prune")
    sel = selector_arg(selector)
    if prune and not sel:  # a blank selector parses to match-all: never let it choose what to delete
        raise usage_error(f"--selector {selector!r} selects every object; --prune needs one that limits "
                          "what may be deleted")
    objects = _load(files, recursive)
    run(_apply(conn, objects, prune, sel, dry_run))


async def _diff(conn: Connection, objects: list[AnyObject]) -> bool:
    found = False
    async with conn.client() as c:
        for obj in objects:
            text = unified_diff(await _get_or_none(c, type(obj), obj.name), obj)
            if text:
                found = True
                click.echo(text, nl=False)
    return found


@click.command(epilog=EXIT_CODES_HELP)
@file_options
@connection_options
def diff(files: tuple[str, ...], recursive: bool, conn: Connection) -> None:
    """Unified diff of labels, annotations and spec, live -> manifest. Exit 1 when they differ."""
    objects = _load(files, recursive)
    if run(_diff(conn, objects)):
        raise click.exceptions.Exit(ec.ERROR)


async def _delete(conn: Connection, targets: list[tuple[Kind, str]], ignore_not_found: bool) -> None:
    async with conn.client() as c:
        for kind, name in targets:
            try:
                obj = await c.delete(kind, name)
            except NotFound:
                if ignore_not_found:
                    continue
                raise
            click.echo(f"{ref(obj)} deleted")


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("kind", required=False, shell_complete=complete_kind)
@click.argument("names", nargs=-1, shell_complete=complete_name)
@click.option("-f", "--filename", "files", multiple=True, metavar="FILE|DIR",
              help="Delete the objects of these manifests instead.")
@click.option("-R", "--recursive", is_flag=True, help="With -f: also read subdirectories.")
@click.option("--ignore-not-found", is_flag=True, help="An object that does not exist is not an error.")
@connection_options
def delete(kind: str | None, names: tuple[str, ...], files: tuple[str, ...], recursive: bool,
           ignore_not_found: bool, conn: Connection) -> None:
    """Delete KIND NAME... or the objects of manifests (-f)."""
    if files and kind:
        raise usage_error("give either KIND NAME... or -f FILE, not both")
    if files:
        targets = [(type(o), o.name) for o in reversed(_load(files, recursive))]
    elif kind and names:
        cls = kind_arg(kind)
        targets = [(cls, n) for n in names]
    else:
        raise usage_error("give KIND NAME... or -f FILE")
    run(_delete(conn, targets, ignore_not_found))
