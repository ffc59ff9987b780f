"""`llmgw version`: this client's version, read from the installed package's metadata; with
--cluster, each server's of the context too, then each live server's the context does not name and
each live gateway's and controller-manager's, from what they announce under their leases (the agents'
are `llmgw get nodes`' VERSION)."""
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
        for name, theirs in others.get("servers", {}).items():   # those the context does not name
            if f"https://{name}" not in servers:
                click.echo(f"server {name}: {theirs or 'unknown (it announced none)'}")
        for name, theirs in others["gateways"].items():
            click.echo(f"gateway {name}: {theirs or 'unknown (it sends no version)'}")
        leader = (others["controllerManager"] or {}).get("holder")
        managers = others.get("controllerManagers", {})
        if leader is not None and leader not in managers:   # a leader older than announcements
            managers = {leader: others["controllerManager"]["version"], **managers}
        for name, theirs in managers.items():
            click.echo(f"controller-manager {name}{' (leader)' if name == leader else ''}: "
                       f"{theirs or 'unknown (it wrote none)'}")
