"""The agent's version, as installed (the package metadata), else the source tree's."""
from __future__ import annotations

from importlib import metadata


def agent_version() -> str:
    try:
        return metadata.version("llmgw")
    except metadata.PackageNotFoundError:
        import llmgw
        return getattr(llmgw, "__version__", "unknown")
