"""The simulated engine (`llmgw sim`, see llmgw.sim): every rank runs the same line with its own --rank.

Run as `executables['llmgw'] sim ...` when an llmgw executable is configured,
else as `<this Python> -m llmgw.sim ...`.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from llmgw.engines import base
from llmgw.engines.base import PROCESS_PROBE, Command, NodeFacts, RenderedShard, base_env, health_probe, join_host_port
from llmgw.engines.engine import (
    HOST,
    LORA,
    MODEL,
    MULTINODE,
    NAME,
    PORT,
    Engine,
    HelpCommand,
    LoraApi,
    Syntax,
    register,
)
from llmgw.engines.helptext import used_flags

if TYPE_CHECKING:
    from llmgw.api import Shard


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
        *(["--model", spec.source] if spec.source else []),
        *(base.lora_flags(shard) if spec.rank == 0 else []),
        *base.kv_events_args(shard, enable_kv_cache_events=True),
        *spec.args,
    ]
    serves = spec.rank == 0
    probe = health_probe(node, spec.ports.serve) if serves else PROCESS_PROBE
    return RenderedShard([Command("sim", argv, base_env(shard, node), serves=serves)], probe)


def _help(command: Command) -> HelpCommand | None:
    if command.name != "sim":   # llmgw sim ... | python -m llmgw.sim ...
        return None
    argv = command.argv
    start = next(i for i, a in enumerate(argv) if a in ("sim", "llmgw.sim")) + 1
    return HelpCommand("sim", [*argv[:start], "--help"], flags=used_flags(argv[start:]))


# No executables: the sim is llmgw itself, on every node (the agent reports it always). It loads
# no weights and uses no GPU, so the agent's preflight checks neither; given spec.source, it checks
# itself that the path is there (--model), as an engine loading it would fail.
ENGINE = register(Engine(
    name="sim", render=render, help_of=_help,
    reserved={
        "--host": HOST, "--port": PORT,
        "--served-model-name": NAME,
        "--rank": MULTINODE, "--world-size": MULTINODE,
        "--dist-init-addr": MULTINODE, "--model": MODEL,
        "--enable-lora": LORA, "--max-loras": LORA,
    },
    syntax=Syntax(abbreviations=True),
    loads_weights=False, uses_gpus=False, lora=LoraApi(), kv_events=True,
    serves=frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize",
                      "/rerank", "/v1/rerank", "/pooling", "/classify", "/v1/audio/transcriptions",
                      "/v1/audio/translations"}),
))
