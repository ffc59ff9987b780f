"""`llmgw version`: this client's version, read from the installed package's metadata."""
from __future__ import annotations

from importlib import metadata

import click


def client_version() -> str:
    try:
        return metadata.version("llmgw")
    except metadata.PackageNotFoundError:
        import llmgw

        return getattr(llmgw, "__version__", "unknown")


@click.command()
def version() -> None:
    """Print the version of this llmgw client."""
    click.echo(f"llmgw {client_version()}")
