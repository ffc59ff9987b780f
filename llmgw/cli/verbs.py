"""The kubectl-like verbs; each lives in its own module (see llmgw.cli.main.COMMANDS)."""
from __future__ import annotations

from importlib import metadata

import click

from llmgw.cli.apply import apply, delete, diff  # noqa: F401
from llmgw.cli.describe import describe  # noqa: F401
from llmgw.cli.get import get  # noqa: F401
from llmgw.cli.nodes import cordon, drain, uncordon  # noqa: F401


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
