"""The engines: one module each (vllm, sglang, llamacpp, sim), registered in llmgw.engines.engine.

    from llmgw.engines import render, RenderedShard, Command, Probe, NodeFacts
    rendered = render(shard, NodeFacts("10.0.0.10", [("mlx5_2", 1)]), {"vllm": "/opt/vllm/bin/vllm"})

Importing this package registers the built-in engines; a new one is a module beside
them, imported here (docs/architecture.md, "Adding an engine").
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.engines import llamacpp, sglang, sim, vllm  # noqa: F401 - they register
from llmgw.engines.base import Command, NodeFacts, Probe, RenderedShard, RenderError
from llmgw.engines.engine import ENGINES, Engine, lookup

if TYPE_CHECKING:
    from llmgw.api import Shard

__all__ = ["render", "RenderedShard", "Command", "Probe", "NodeFacts", "RenderError", "ENGINES", "Engine", "lookup"]


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    """The commands (in start order) and readiness probe of one shard on its node."""
    found = ENGINES.get(shard.spec.engine)
    if found is None:
        raise RenderError(f"shard {shard.metadata.name}: no renderer for engine {shard.spec.engine!r}")
    return found.render(shard, node, executables)
