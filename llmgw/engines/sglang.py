"""SGLang: `python -m sglang.launch_server`; every node runs the same line with its own --node-rank.

`--tp-size` is the total over all nodes. SGLang takes one served name: the
model's name (the first of servedModelNames); the gateway routes aliases to it.
`executables['sglang']` is the Python interpreter that has SGLang installed
(falling back to `executables['python']`, then `python3`).
"""
from __future__ import annotations

from llmgw.api import Shard
from llmgw.engines.base import (
    PROCESS_PROBE,
    Command,
    NodeFacts,
    RenderedShard,
    base_env,
    health_probe,
    join_host_port,
    weights,
)


def python_for_sglang(executables: dict[str, str]) -> str:
    return executables.get("sglang") or executables.get("python") or "python3"


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    spec = shard.spec
    argv = [
        python_for_sglang(executables), "-m", "sglang.launch_server",
        "--model-path", weights(shard),
        "--host", node.address,
        "--port", str(spec.ports.serve),
        "--served-model-name", spec.servedModelNames[0],
        "--tp-size", str(spec.gpusPerNode * spec.worldSize),
        "--enable-metrics",
    ]
    if spec.worldSize > 1:
        argv += [
            "--nnodes", str(spec.worldSize),
            "--node-rank", str(spec.rank),
            "--dist-init-addr", join_host_port(spec.headAddress, spec.ports.distInit),
        ]
    argv += spec.args
    serves = spec.rank == 0
    probe = health_probe(node, spec.ports.serve) if serves else PROCESS_PROBE
    return RenderedShard([Command("sglang", argv, base_env(shard, node), serves=serves)], probe)
