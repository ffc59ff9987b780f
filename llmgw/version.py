"""llmgw's version: one source, pyproject.toml's ``project.version``, read at run time from the
installed package's metadata."""
from __future__ import annotations

from functools import cache
from importlib import metadata


@cache
def version() -> str:
    """This llmgw's version (the installed package's metadata), "unknown" outside a package."""
    try:
        return metadata.version("llmgw")
    except metadata.PackageNotFoundError:
        return "unknown"
