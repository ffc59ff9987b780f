"""Engine flags that llmgw sets itself and that a Model's `args` may not set.

Each entry maps a flag (every spelling an engine accepts) to why llmgw owns it.
"""
from __future__ import annotations

_HOST = "llmgw binds the engine to the node's address"
_PORT = "llmgw assigns the serve port from the node's port range"
_NAME = "llmgw passes the model's name and aliases so the gateway can route by them"
_PARALLEL = "llmgw derives parallel sizes from the profile's nodes and gpusPerNode"
_MULTINODE = "llmgw sets the multi-node rendezvous from the replica's placement"
_MODEL = "llmgw passes the model's weights path from spec.source"

RESERVED_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--host": _HOST, "--port": _PORT,
        "--served-model-name": _NAME,
        "--tensor-parallel-size": _PARALLEL, "-tp": _PARALLEL,
        "--pipeline-parallel-size": _PARALLEL, "-pp": _PARALLEL,
        "--data-parallel-size": _PARALLEL, "-dp": _PARALLEL,
        "--nnodes": _MULTINODE, "--node-rank": _MULTINODE,
        "--master-addr": _MULTINODE, "--master-port": _MULTINODE,
        "--headless": _MULTINODE, "--distributed-executor-backend": _MULTINODE,
        "--model": _MODEL,
    },
    "sglang": {
        "--host": _HOST, "--port": _PORT,
        "--served-model-name": _NAME,
        "--tp-size": _PARALLEL, "--tensor-parallel-size": _PARALLEL, "--tp": _PARALLEL,
        "--pp-size": _PARALLEL, "--pipeline-parallel-size": _PARALLEL,
        "--dp-size": _PARALLEL, "--data-parallel-size": _PARALLEL,
        "--nnodes": _MULTINODE, "--node-rank": _MULTINODE,
        "--dist-init-addr": _MULTINODE,
        "--model-path": _MODEL, "--model": _MODEL,
    },
    "llamacpp": {
        "--host": _HOST, "--port": _PORT,
        "-a": _NAME, "--alias": _NAME,
        "-m": _MODEL, "--model": _MODEL,
        "--rpc": _MULTINODE,
    },
    "sim": {
        "--host": _HOST, "--port": _PORT,
        "--served-model-name": _NAME,
        "--rank": _MULTINODE, "--world-size": _MULTINODE,
        "--dist-init-addr": _MULTINODE,
    },
}


def reserved_flag(engine: str, arg: str) -> tuple[str, str] | None:
    """The reserved flag `arg` sets (in `--flag=value` form too) and why, or None."""
    flag = arg.split("=", 1)[0]
    reason = RESERVED_FLAGS.get(engine, {}).get(flag)
    return (flag, reason) if reason else None
