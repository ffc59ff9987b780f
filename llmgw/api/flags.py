"""Engine flags that llmgw sets itself and that a Model's `args` may not set.

A Model's args come after llmgw's own flags on the command line, so any
spelling the engine's parser accepts for a reserved flag would win over
llmgw's value. Each table lists every spelling the engine's help gives for the
flag (tests/test_reserved_flags.py checks that against captured help texts),
and `reserved_flag` reads an argument the way that engine's parser does:

- argparse (vLLM, SGLang, the sim): `--flag=value`; a unique prefix of a long
  option stands for it (`--served-model=x`); a one-letter short option takes
  its value attached (`-n2`).
- vLLM also reads `--a_b` as `--a-b`.
- llama-server matches spellings exactly.

Flags that load settings from a file (vLLM's and SGLang's `--config`) or pick
the model another way (llama-server's hub and URL downloads, router mode) are
reserved too: through them a Model could set any of the others.
"""
from __future__ import annotations

from dataclasses import dataclass

_HOST = "llmgw binds the engine to the node's address"
_PORT = "llmgw assigns the serve port from the node's port range"
_NAME = "llmgw passes the model's name and aliases so the gateway can route by them"
_PARALLEL = "llmgw derives parallel sizes from the profile's nodes and gpusPerNode"
_MULTINODE = "llmgw sets the multi-node rendezvous from the replica's placement"
_MODEL = "llmgw passes the model's weights path from spec.source"
_CONFIG = "a config file could set any of the flags llmgw sets; put the settings in args"


@dataclass(frozen=True)
class Syntax:
    """How an engine's parser reads a flag beyond its exact spellings."""

    abbreviations: bool = False  # argparse: a unique prefix of a long option names it
    underscores: bool = False    # `--a_b` means `--a-b`


SYNTAX: dict[str, Syntax] = {
    "vllm": Syntax(abbreviations=True, underscores=True),
    "sglang": Syntax(abbreviations=True),
    "llamacpp": Syntax(),
    "sim": Syntax(abbreviations=True),
}

RESERVED_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--host": _HOST, "--port": _PORT,
        "--served-model-name": _NAME,
        "--tensor-parallel-size": _PARALLEL, "-tp": _PARALLEL,
        "--pipeline-parallel-size": _PARALLEL, "-pp": _PARALLEL,
        "--data-parallel-size": _PARALLEL, "-dp": _PARALLEL,
        "--nnodes": _MULTINODE, "-n": _MULTINODE,
        "--node-rank": _MULTINODE, "-r": _MULTINODE,
        "--master-addr": _MULTINODE, "--master-port": _MULTINODE,
        "--headless": _MULTINODE, "--distributed-executor-backend": _MULTINODE,
        "--model": _MODEL,
        "--config": _CONFIG,
    },
    "sglang": {
        "--host": _HOST, "--port": _PORT,
        "--served-model-name": _NAME,
        "--tp-size": _PARALLEL, "--tensor-parallel-size": _PARALLEL, "--tp": _PARALLEL,
        "--pp-size": _PARALLEL, "--pipeline-parallel-size": _PARALLEL,
        "--dp-size": _PARALLEL, "--data-parallel-size": _PARALLEL,
        "--nnodes": _MULTINODE, "--node-rank": _MULTINODE,
        "--dist-init-addr": _MULTINODE, "--nccl-init-addr": _MULTINODE,
        "--model-path": _MODEL, "--model": _MODEL,
        "--config": _CONFIG,
    },
    "llamacpp": {
        "--host": _HOST, "--port": _PORT,
        "-a": _NAME, "--alias": _NAME,
        "-m": _MODEL, "--model": _MODEL,
        "-mu": _MODEL, "--model-url": _MODEL,
        "-hf": _MODEL, "-hfr": _MODEL, "--hf-repo": _MODEL,
        "-hff": _MODEL, "--hf-file": _MODEL,
        "-dr": _MODEL, "--docker-repo": _MODEL,
        "--models-dir": _MODEL, "--models-preset": _MODEL,
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
    """The reserved flag `arg` sets, as the engine's parser reads it, and why; None when it sets none."""
    table = RESERVED_FLAGS.get(engine, {})
    syntax = SYNTAX.get(engine, Syntax())
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None
    written = arg.split("=", 1)[0]
    flag = written.replace("_", "-") if syntax.underscores and written.startswith("--") else written
    if flag in table:
        return written, table[flag] if flag == written else f"{engine} reads it as {flag}; {table[flag]}"
    if syntax.abbreviations and flag.startswith("--") and len(flag) > 2:
        for full, why in table.items():
            if full.startswith(flag):
                return written, f"{engine} reads it as {full}; {why}"
    if syntax.abbreviations and not flag.startswith("--") and flag[:2] in table:
        # `-n2`: argparse's one-letter option with its value attached
        return written, f"{engine} reads it as {flag[:2]} {flag[2:]}; {table[flag[:2]]}"
    return None
