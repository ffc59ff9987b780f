"""`llmgw version`: this client's version, read from the installed package's metadata."""
from __future__ import annotations

import click

from llmgw.version import version as llmgw_version


@click.command()
def version() -> None:
    """Print the version of this llmgw client."""
    click.echo(f"llmgw {llmgw_version()}")
