"""`llmgw reconcile|suspend|resume gitsource NAME`: ask a GitSource to sync now, or stop and restart its syncs."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TypeVar

import click

from llmgw.api import GitSource
from llmgw.api.errors import AlreadyExists, Conflict
from llmgw.api.kinds import kind_named, of_kind
from llmgw.api.meta import get_condition
from llmgw.api.wellknown import RECONCILE_REQUESTED_AT
from llmgw.cli import errors as ec
from llmgw.cli.completion import complete_name
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.errors import EXIT_CODES_HELP, CliError

if TYPE_CHECKING:
    from llmgw.client import Client

R = TypeVar("R")

_TRIES = 5
_POLL_SECONDS = 0.5


def _gitsource_args(f: Callable[..., R]) -> Callable[..., R]:
    """`gitsource NAME`, the arguments of every verb here."""
    return click.argument("kind", metavar="gitsource")(click.argument("name", shell_complete=complete_name)(f))


def _kind(word: str) -> None:
    """The KIND argument: a GitSource's, spelled as any verb spells it (gitsource, gitsources, gs)."""
    try:
        named = kind_named(word)
    except ValueError:   # no kind at all: refused as another kind is
        named = None
    if named is not GitSource:
        raise usage_error(f"{word!r}: only a gitsource can be asked for this (llmgw {{reconcile|suspend|resume}} "
                          "gitsource NAME)")


async def _change(c: Client, name: str, suspend: bool | None = None, requested: str | None = None) -> bool:
    """Set spec.suspend or the reconcile request; retried on a conflict. False when nothing needed changing."""
    for attempt in range(_TRIES):
        src = of_kind(GitSource, await c.get(GitSource, name))
        new = src.model_copy(deep=True)
        if suspend is not None:
            new.spec = src.spec.model_copy(update={"suspend": suspend})
        if requested is not None:
            new.metadata.annotations[RECONCILE_REQUESTED_AT] = requested
        if (new.spec, new.metadata.annotations) == (src.spec, src.metadata.annotations):
            return False
        try:
            await c.update(new)
            return True
        except Conflict as err:
            if isinstance(err, AlreadyExists) or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


async def _reconcile(conn: Connection, name: str, timeout: float) -> str:
    requested = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    async with conn.client() as c:
        await _change(c, name, requested=requested)
        deadline = time.monotonic() + timeout
        while True:
            src = of_kind(GitSource, await c.get(GitSource, name))
            if src.status.lastHandledReconcileAt == requested:
                break
            if time.monotonic() > deadline:
                raise CliError(f"gitsource/{name}: the controller-manager did not handle the request within "
                               f"{timeout:g} s (is it running?)", ec.ERROR)
            await asyncio.sleep(_POLL_SECONDS)
    if src.spec.suspend:
        return f"gitsource/{name} is suspended: nothing applied (llmgw resume gitsource {name})"
    ready = get_condition(src.status.conditions, "Ready")
    line = f"gitsource/{name} reconciled at revision {(src.status.lastAppliedRevision or '<none>')[:12]}"
    if ready is not None and ready.status != "True":
        line += f"; not Ready: {ready.reason}: {ready.message}"
    return line


@click.command(epilog=EXIT_CODES_HELP)
@_gitsource_args
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the controller-manager to sync it.")
@connection_options
def reconcile(kind: str, name: str, timeout: float, conn: Connection) -> None:
    """Sync a GitSource now (fetch, apply, prune), not at its next interval, and wait for it."""
    _kind(kind)
    click.echo(run(_reconcile(conn, name, timeout)))


async def _suspend(conn: Connection, name: str, on: bool) -> str:
    async with conn.client() as c:
        changed = await _change(c, name, suspend=on)
    word = "suspended" if on else "resumed"
    return f"gitsource/{name} {word}" if changed else f"gitsource/{name} already {word}"


@click.command(epilog=EXIT_CODES_HELP)
@_gitsource_args
@connection_options
def suspend(kind: str, name: str, conn: Connection) -> None:
    """Stop a GitSource's syncs (spec.suspend): nothing is applied, pruned or reverted until it is resumed."""
    _kind(kind)
    click.echo(run(_suspend(conn, name, True)))


@click.command(epilog=EXIT_CODES_HELP)
@_gitsource_args
@connection_options
def resume(kind: str, name: str, conn: Connection) -> None:
    """Restart a suspended GitSource's syncs; it syncs at once."""
    _kind(kind)
    click.echo(run(_suspend(conn, name, False)))
