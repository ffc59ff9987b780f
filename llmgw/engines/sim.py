"""The simulated engine (`llmgw sim`, see llmgw.sim): every rank runs the same line with its own --rank.

Run as `executables['llmgw'] sim ...` when an llmgw executable is configured,
else as `<this Python> -m llmgw.sim ...`.
"""
from __future__ import annotations

import sys

from llmgw.api import Shard
from llmgw.engines.base import PROCESS_PROBE, Command, NodeFacts, RenderedShard, base_env, health_probe, join_host_port


def sim_program(executables: dict[str, str]) -> list[str]:
    if executables.get("llmgw"):
        return [executables["llmgw"], "sim"]
    return [sys.executable, "-m", "llmgw.sim"]


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    spec = shard.spec
    argv = [
        *sim_program(executables),
        "--host", node.address,
        "--port", str(spec.ports.serve),
        "--served-model-name", *spec.servedModelNames,
        "--rank", str(spec.rank),
        "--world-size", str(spec.worldSize),
        "--dist-init-addr", join_host_port(spec.headAddress, spec.ports.distInit),
        *spec.args,
    ]
    serves = spec.rank == 0
    probe = health_probe(node, spec.ports.serve) if serves else PROCESS_PROBE
    return RenderedShard([Command("sim", argv, base_env(shard, node), serves=serves)], probe)
