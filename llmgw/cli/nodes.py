"""`llmgw cordon`, `uncordon` and `drain`: change a Node's spec; `drain --wait` follows status.drain."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from llmgw.api import Node
from llmgw.api.errors import AlreadyExists, Conflict, Expired
from llmgw.api.kinds import all_of_kind, of_kind
from llmgw.cli import errors as ec
from llmgw.cli.completion import complete_node
from llmgw.cli.connect import Connection, connection_options, run
from llmgw.cli.errors import EXIT_CODES_HELP, CliError

if TYPE_CHECKING:
    from llmgw.client import Client

_TRIES = 5


async def set_node_spec(c: Client, name: str, **changes: bool) -> tuple[Node, Node | None]:
    """Read-modify-write of spec fields; retried on a conflict (the fields are ours to set).

    Returns (node before, node after) with after None when nothing needed changing.
    """
    for attempt in range(_TRIES):
        node = of_kind(Node, await c.get(Node, name))
        if all(getattr(node.spec, k) == v for k, v in changes.items()):
            return node, None
        new = node.model_copy(deep=True)
        new.spec = node.spec.model_copy(update=changes)
        try:
            return node, of_kind(Node, await c.update(new))
        except Conflict as err:
            if isinstance(err, AlreadyExists) or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


async def _cordon(conn: Connection, name: str, on: bool) -> str:
    async with conn.client() as c:
        if on:
            _, after = await set_node_spec(c, name, unschedulable=True)
            return f"node/{name} {'cordoned' if after else 'already cordoned'}"
        before, after = await set_node_spec(c, name, unschedulable=False, drain=False)
        if after is None:
            return f"node/{name} already uncordoned"
        return f"node/{name} uncordoned" + (" (drain cancelled)" if before.spec.drain else "")


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("node", shell_complete=complete_node)
@connection_options
def cordon(node: str, conn: Connection) -> None:
    """Mark NODE unschedulable: no new replicas are placed on it; running ones stay."""
    click.echo(run(_cordon(conn, node, True)))


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("node", shell_complete=complete_node)
@connection_options
def uncordon(node: str, conn: Connection) -> None:
    """Mark NODE schedulable again; this also cancels a requested drain."""
    click.echo(run(_cordon(conn, node, False)))


def progress(node: Node) -> str:
    d = node.status.drain
    if d is None:
        return f"node/{node.name} drain requested, waiting for the drain controller"
    line = f"node/{node.name} {d.phase}: {d.remaining} replica(s) remaining"
    if d.current:
        line += f", moving {d.current}"
    if d.message:
        line += f": {d.message}"
    return line


def _verdict(node: Node, name: str) -> bool:
    """True when drained; CliError when stuck or cancelled; False to keep waiting."""
    if not node.spec.drain:
        raise CliError(f"the drain of node {name} was cancelled (spec.drain is false)", ec.ERROR)
    d = node.status.drain
    if d is not None and d.phase == "Drained":
        return True
    if d is not None and d.phase == "Stuck":
        raise CliError(
            f"the drain of node {name} is stuck: {d.message or 'no reason given'} "
            f"({d.remaining} replica(s) remaining); the controller keeps trying, "
            f"`llmgw drain {name} --wait` follows it again", ec.ERROR)
    return False


async def wait_drained(c: Client, name: str, node: Node, rev: int, judge_first: bool) -> None:
    """Print progress until status.drain says Drained (return) or Stuck (CliError).

    `judge_first`: whether `node` (the state at `rev`) may already end the wait. It may not
    when this command just requested the drain: a Drained left over from an earlier drain
    says nothing about this one; only what the controller writes after `rev` counts.
    """
    if judge_first:
        last = progress(node)
        click.echo(last)
        if _verdict(node, name):
            click.echo(f"node/{name} drained")
            return
    else:
        last = f"node/{name} drain requested, waiting for the drain controller"
        click.echo(last)
    while True:
        try:
            async for ev in c.watch(Node, resource_version=rev):
                rev = max(rev, ev.revision)
                if ev.object.name != name:
                    continue
                node = of_kind(Node, ev.object)
                if ev.type == "DELETED":
                    raise CliError(f"node {name} was deleted while draining", ec.ERROR)
                line = progress(node)
                if line != last:
                    click.echo(line)
                    last = line
                if _verdict(node, name):
                    click.echo(f"node/{name} drained")
                    return
        except Expired:  # our revision was compacted: judge the current state, watch from there
            items, rev = await c.list(Node)
            current = next((n for n in all_of_kind(Node, items) if n.name == name), None)
            if current is None:
                raise CliError(f"node {name} was deleted while draining", ec.ERROR) from None
            if _verdict(current, name):
                click.echo(f"node/{name} drained")
                return


async def _drain(conn: Connection, name: str, wait: bool) -> None:
    async with conn.client() as c:
        before, after = await set_node_spec(c, name, unschedulable=True, drain=True)
        if after is None:
            click.echo(f"node/{name} drain already requested")
        else:
            click.echo(f"node/{name} cordoned, drain requested")
        if not wait:
            return
        if after is not None:
            await wait_drained(c, name, after, after.metadata.resourceVersion or 0, judge_first=False)
        else:
            items, rev = await c.list(Node)
            current = next((n for n in all_of_kind(Node, items) if n.name == name), before)
            await wait_drained(c, name, current, rev, judge_first=True)


def drain_command(name: str = "drain") -> click.Command:
    @click.command(name, epilog=EXIT_CODES_HELP)
    @click.argument("node", shell_complete=complete_node)
    @click.option("--wait", is_flag=True,
                  help="Follow the drain's progress; exit 0 when Drained, 1 as soon as it is Stuck.")
    @connection_options
    def _cmd(node: str, wait: bool, conn: Connection) -> None:
        """Cordon NODE and request a drain (spec.drain=true).

        The drain controller moves the node's replicas one at a time, each replacement
        Ready before its original stops, and reports progress in status.drain
        (Draining, Drained or Stuck). `llmgw uncordon NODE` cancels the drain.
        """
        run(_drain(conn, node, wait))

    return _cmd


drain = drain_command()
