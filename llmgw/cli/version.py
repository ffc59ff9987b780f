"""`llmgw version`: this client's version, read from the installed package's metadata; with
--cluster, each server's of the context too, each live gateway's and the leading controller-manager's
(the agents' are `llmgw get nodes`' VERSION)."""
from __future__ import annotations

from typing import Any

import click

from llmgw.cli.connect import Connection, connection_options, run
from llmgw.version import version as llmgw_version


@click.command()
@click.option("--cluster", is_flag=True, help="Also ask each server of the context for its version.")
@connection_options
def version(conn: Connection, cluster: bool) -> None:
    """Print the version of this llmgw client (and, with --cluster, of each server)."""
    click.echo(f"llmgw {llmgw_version()}")
    if cluster:
        async def ask() -> tuple[dict[str, str], dict[str, Any]]:
            async with conn.client() as c:
                return await c.server_versions(), await c.cluster_versions()

        servers, others = run(ask())
        for url, theirs in servers.items():
            click.echo(f"server {url}: {theirs}")
        for name, theirs in others["gateways"].items():
            click.echo(f"gateway {name}: {theirs or 'unknown (it sends no version)'}")
        if manager := others["controllerManager"]:
            click.echo(f"controller-manager {manager['holder']}: {manager['version'] or 'unknown (it wrote none)'}")
