"""What the API checks a Profile against, asked of a registry the engines fill in.

A Profile names an engine, maybe a launch mode, a node count and args; llmgw.api
validates them against the engine's rules, read here from the registry that each
engine's ``register`` (engine.py) fills in: an ``Engine`` has these rules. This module imports
nothing of llmgw, so the API's arrow to it runs one way, while the engines import
the API's types (a Shard is what they render).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Rules(Protocol):
    """An engine as a Profile is checked against it."""

    @property
    def name(self) -> str: ...

    @property
    def launch_modes(self) -> tuple[str, ...]: ...

    @property
    def multi_node(self) -> bool: ...

    @property
    def lora(self) -> object | None: ...

    def reserved_flag(self, arg: str) -> tuple[str, str] | None: ...

    def context_floor(self, args: list[str]) -> int | None: ...


# The registered engines by name: llmgw.engines.engine's registry itself, which that module hands
# over as it loads (one registry: an engine registered, or removed, is so for the API too).
RULES: Mapping[str, Rules] = {}


def lookup(name: str) -> Rules:
    """The rules of the registered engine of that name; ValueError naming the known ones."""
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}: one of {', '.join(sorted(RULES))}") from None


def check_name(name: str) -> str:
    """`name` if an engine of that name is registered (a Profile's validator)."""
    return lookup(name).name


def check_launch_mode(mode: str) -> str:
    """`mode` if some registered engine has that launch mode (a Profile then checks it is its engine's)."""
    known = sorted({m for e in RULES.values() for m in e.launch_modes})
    if mode not in known:
        raise ValueError(f"unknown launch mode {mode!r}: one of {', '.join(known)}")
    return mode
