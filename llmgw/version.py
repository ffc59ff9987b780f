"""llmgw's version and its version skew policy (docs/contracts.md, "Version skew").

The version has one source, pyproject.toml's ``project.version``, read at run time from the
installed package's metadata. Every client sends it in the ``X-Llmgw-Version`` header; the server
refuses an agent, a gateway or a controller-manager outside the policy (``refusal``), naming both
versions. A release is a (major, minor) line: patch releases of one line always run together.
"""
from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import metadata

HEADER = "X-Llmgw-Version"

# What a component that sends no X-Llmgw-Version is taken for: 0.1.0, the last release that sent none.
HEADERLESS = "0.1.0"

# How many minor versions a component may be older than the servers; none may be newer.
OLDER = {"agent": 2, "gateway": 2, "controller-manager": 1}

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?")


@cache
def version() -> str:
    """This llmgw's version (the installed package's metadata), "unknown" outside a package."""
    try:
        return metadata.version("llmgw")
    except metadata.PackageNotFoundError:
        return "unknown"


def release(v: str) -> tuple[int, int] | None:
    """The (major, minor) of a version such as 0.2.0 or 0.2.1.dev3; None for one that is no release's."""
    m = _RELEASE.match(v)
    return (int(m[1]), int(m[2])) if m else None


@lru_cache(maxsize=256)   # asked on every request of a component (heartbeats), of a few versions
def refusal(component: str, theirs: str, servers: str) -> str | None:
    """Why a ``component`` (a key of OLDER) of version ``theirs`` may not run with servers of
    version ``servers``; None when it may. A version that is no release's is refused too."""
    mine, other = release(servers), release(theirs)
    if mine is None or other == mine:
        return None   # a server outside a package (its version unknown) enforces nothing
    if other is None:
        return _message(component, theirs, servers, "is no release's version")
    if other > mine:
        return _message(component, theirs, servers, "is newer than the server's: upgrade the servers first")
    if other[0] != mine[0] or mine[1] - other[1] > OLDER[component]:
        return _message(component, theirs, servers,
                        f"is more than {OLDER[component]} minor versions older than the server's: upgrade it")
    return None


def _message(component: str, theirs: str, servers: str, why: str) -> str:
    return (f"version skew: {component} version {theirs} {why} (server version {servers}; "
            "see docs/contracts.md, Version skew)")
