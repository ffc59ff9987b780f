"""Engine renderers: a Shard, the node's facts and the executables' paths in; commands and a probe out.

    from llmgw.engines import render, RenderedShard, Command, Probe, NodeFacts
    rendered = render(shard, NodeFacts("10.0.0.10", [("mlx5_2", 1)]), {"vllm": "/opt/vllm/bin/vllm"})
"""
from __future__ import annotations

from llmgw.api import Shard
from llmgw.engines import llamacpp, sglang, sim, vllm
from llmgw.engines.base import Command, NodeFacts, Probe, RenderedShard, RenderError

RENDERERS = {
    "vllm": vllm.render,
    "sglang": sglang.render,
    "llamacpp": llamacpp.render,
    "sim": sim.render,
}

__all__ = ["render", "RenderedShard", "Command", "Probe", "NodeFacts", "RenderError", "RENDERERS"]


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    """The commands (in start order) and readiness probe of one shard on its node."""
    try:
        renderer = RENDERERS[shard.spec.engine]
    except KeyError:
        raise RenderError(f"shard {shard.metadata.name}: no renderer for engine {shard.spec.engine!r}") from None
    return renderer(shard, node, executables)
