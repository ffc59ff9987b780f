"""SGLang: `python -m sglang.launch_server`; every node runs the same line with its own --node-rank.

`--tp-size` is the total over all nodes. SGLang takes one served name: the
model's name (the first of servedModelNames); the gateway routes aliases to it.
LoRA adapters (a Model's spec.adapters) are loaded at runtime: `--enable-lora`,
`--max-loaded-loras N` (adapters held at once: the slots) and `--max-loras-per-batch N`;
`POST /load_lora_adapter {"lora_name", "lora_path"}` and `POST /unload_lora_adapter
{"lora_name"}` (400 with {"success": false, "error_message"} on failure), and `GET /v1/models`
lists them as cards with a parent, as vLLM does. A request names one as `BASE:ADAPTER` in its
model (SGLang reads a plain adapter name as a model name), which the gateway writes. Started
with no adapter, SGLang needs `--max-lora-rank` and `--lora-target-modules` in the Model's args.
`executables['sglang']` is the Python interpreter that has SGLang installed
(falling back to `executables['python']`, then `python3`). Rank 0 of a
precise-prefix replica publishes KV events with SGLang's --kv-events-config
(python/sglang/srt/disaggregation/kv_events.py's KVEventsConfig, 0.5.23: no
enable field; publisher "null" unless given): vLLM's wire layout, block hashes
of SGLang's own pages, which the gateway computes as SGLang does
(llmgw.routing.kvblocks.SGLangBlockHasher; docs/contracts.md, "KV events"). A
single-node such replica gets `--page-size 16` (SGLang's default page is one
token: the index would hold a key per token) unless the Model's args set it;
ranks past 0 of a multi-node one cannot tell, and every rank's page must match.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmgw.engines.base import (
    PROCESS_PROBE,
    Command,
    NodeFacts,
    RenderedShard,
    base_env,
    budget_flag,
    default_flag,
    health_probe,
    join_host_port,
    kv_events_args,
    weights,
)
from llmgw.engines.engine import (
    CONFIG,
    HOST,
    LORA,
    MODEL,
    MULTINODE,
    NAME,
    OPENAI,
    PARALLEL,
    PORT,
    Engine,
    Executable,
    HelpCommand,
    LoraApi,
    Syntax,
    register,
)
from llmgw.engines.helptext import used_flags

if TYPE_CHECKING:
    from llmgw.api import Shard


# The page a single-node precise-prefix replica is given (--page-size) unless its Model's args set one.
PRECISE_PAGE = 16


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
    if spec.adapters is not None and spec.rank == 0:
        slots = str(spec.adapters.maxLoaded)
        argv += ["--enable-lora", "--max-loaded-loras", slots, "--max-loras-per-batch", slots]
    if spec.worldSize > 1:
        argv += [
            "--nnodes", str(spec.worldSize),
            "--node-rank", str(spec.rank),
            "--dist-init-addr", join_host_port(spec.headAddress, spec.ports.distInit),
        ]
    if spec.kvCache is not None:
        # the KV pool's size in tokens (server_args.max_total_tokens: "the maximum number of tokens
        # in the memory pool"; without it SGLang sizes the pool from --mem-fraction-static)
        argv += budget_flag(shard, ("--max-total-tokens", "--mem-fraction-static"), str(spec.kvCache.tokens))
    if spec.rank == 0:
        argv += kv_events_args(shard)
    if spec.ports.kvEvents and spec.worldSize == 1:
        # pages of 16 tokens, not SGLang's default of one: the index holds a key per page (ranks
        # past 0 cannot tell a precise-prefix replica, and every rank's page must be the same)
        argv += default_flag(shard, ("--page-size",), str(PRECISE_PAGE))
    argv += spec.args
    serves = spec.rank == 0
    probe = health_probe(node, spec.ports.serve) if serves else PROCESS_PROBE
    return RenderedShard([Command("sglang", argv, base_env(shard, node), serves=serves)], probe)


def _lora_request(adapter: str, served: str, slot: int) -> dict[str, Any]:
    return {"model": f"{served}:{adapter}"}


def _help(command: Command) -> HelpCommand | None:
    if command.name != "sglang":   # python -m sglang.launch_server ...
        return None
    return HelpCommand("sglang", [*command.argv[:3], "--help"], flags=used_flags(command.argv[3:]))


ENGINE = register(Engine(
    name="sglang", render=render, help_of=_help,
    executables=(Executable("sglang", "sglang", distribution="sglang", on_path=False),),
    reserved={
        "--host": HOST, "--port": PORT,
        "--served-model-name": NAME,
        "--tp-size": PARALLEL, "--tensor-parallel-size": PARALLEL, "--tp": PARALLEL,
        "--pp-size": PARALLEL, "--pipeline-parallel-size": PARALLEL,
        "--dp-size": PARALLEL, "--data-parallel-size": PARALLEL,
        "--nnodes": MULTINODE, "--node-rank": MULTINODE,
        "--dist-init-addr": MULTINODE, "--nccl-init-addr": MULTINODE,
        "--model-path": MODEL, "--model": MODEL,
        "--config": CONFIG,
        "--enable-lora": LORA, "--max-loaded-loras": LORA, "--max-loras-per-batch": LORA, "--lora-paths": LORA,
    },
    syntax=Syntax(abbreviations=True),
    lora=LoraApi(load="/load_lora_adapter", unload="/unload_lora_adapter", request=_lora_request),
    # python/sglang/srt/entrypoints/http_server.py's routes
    serves=OPENAI | {"/v1/responses", "/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize", "/v1/score",
                     "/v1/rerank", "/v1/classify"},
    memory_overhead=(2 << 30, "assumed as vLLM's, not measured"), split="tp", kv_events=True,
    block_hashes="sha256_uint32",
    context_flags=("--context-length",),
))
