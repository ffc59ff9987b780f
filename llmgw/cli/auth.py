"""`llmgw auth`: who the server takes this certificate for (`whoami`), and whether it may do
something (`can-i`), answered by the server's own authorizer (llmgw/server/handlers/access.py)."""
from __future__ import annotations

import click

from llmgw.api import EVENTS, RULE_VERBS, resolve_kind
from llmgw.cli.connect import Connection, connection_options, run
from llmgw.cli.errors import EXIT_CODES_HELP


@click.group()
def auth() -> None:
    """Who am I to the server, and may I."""


@auth.command()
@connection_options
def whoami(conn: Connection) -> None:
    """This certificate's name, role, groups and the RoleBindings that name it."""
    async def ask() -> dict[str, object]:
        async with conn.client() as c:
            return await c.whoami()

    me = run(ask())
    for key in ("name", "role", "groups", "bindings", "serial", "notAfter"):
        value = me.get(key)
        click.echo(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")


@auth.command("can-i", epilog="Exit status: 0 yes, 1 no (as kubectl's); otherwise as llmgw's:\n\n" + EXIT_CODES_HELP)
@click.argument("verb", type=click.Choice(RULE_VERBS))
@click.argument("what", metavar="KIND[/NAME]")
@click.option("--as", "as_user", metavar="USER", help="Ask for this user instead (admins only).")
@click.option("--as-group", "as_groups", multiple=True, metavar="G", help="With --as: a group of the user; repeat it.")
@click.option("--label", "labels", multiple=True, metavar="K=V",
              help="The labels of the object asked about, when it is not stored yet (a create); repeat it.")
@connection_options
def can_i(verb: str, what: str, as_user: str | None, as_groups: tuple[str, ...], labels: tuple[str, ...],
          conn: Connection) -> None:
    """Whether the server lets this certificate VERB the KIND (or its object NAME)."""
    if as_groups and as_user is None:
        raise click.UsageError("--as-group goes with --as USER")
    if not all("=" in kv for kv in labels):
        raise click.UsageError("--label takes KEY=VALUE")
    asked = dict(kv.split("=", 1) for kv in labels) if labels else None
    word, _, name = what.partition("/")
    try:
        kind = EVENTS if word == EVENTS else resolve_kind(word)
    except ValueError as err:
        raise click.UsageError(str(err)) from None

    async def ask() -> dict[str, object]:
        async with conn.client() as c:
            return await c.can_i(verb, kind, name or None, as_user, list(as_groups), asked)

    answer = run(ask())
    click.echo("yes" if answer["allowed"] else f"no: {answer['reason']}")
    if not answer["allowed"]:
        raise click.exceptions.Exit(1)
