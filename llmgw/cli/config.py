"""`llmgw config get-contexts|current-context|use-context`: the client config's contexts, as kubectl's."""
from __future__ import annotations

import click

from llmgw.cli.connect import checked, complete_context, config_option
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.printers.table import print_table


@click.group(epilog=EXIT_CODES_HELP)
def config() -> None:
    """The client config's contexts: one cluster each (server, CA, credentials).

    \b
    A config file with contexts:
      current-context: prod
      contexts:
      - {name: prod, server: https://10.0.0.1:7443, ca: prod/ca.crt, cert: prod/admin.crt, key: prod/admin.key}
      - {name: lab, server: https://10.9.0.1:7443, ca: lab/ca.crt, cert: lab/admin.crt, key: lab/admin.key}
    Every command takes --context NAME; `llmgw ca issue admin NAME --write-config --context CTX` adds one.
    """


@config.command("get-contexts")
@config_option
@click.option("-o", "--output", type=click.Choice(["name"]), help="name: the contexts' names alone, one a line.")
def get_contexts(config: str | None, output: str | None) -> None:
    """List the config's contexts; CURRENT marks the current one."""
    from llmgw.client.config import list_contexts

    contexts = checked(lambda: list_contexts(config))
    if output == "name":
        for c in contexts:
            click.echo(c.name)
        return
    print_table(["CURRENT", "NAME", "SERVER"], [["*" if c.current else "", c.name, c.server] for c in contexts])


@config.command("current-context")
@config_option
def current_context(config: str | None) -> None:
    """Print the current context's name."""
    from llmgw.client import ConfigError
    from llmgw.client.config import config_path, list_contexts

    def current() -> str:
        names = [c.name for c in list_contexts(config) if c.current]
        if not names:
            raise ConfigError(f"{config_path(config)}: current-context: not set "
                              "(a file of one cluster, or one whose contexts none is current)")
        return names[0]

    click.echo(checked(current))


@config.command("use-context")
@click.argument("name", shell_complete=complete_context)
@config_option
def use_context(name: str, config: str | None) -> None:
    """Make NAME the current context: the one every command uses without --context."""
    from llmgw.client.config import use_context as use

    path = checked(lambda: use(name, config))
    click.echo(f"Switched to context {name!r} ({path}).")
