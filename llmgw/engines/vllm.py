"""vLLM: `vllm serve`, multi-node by its own launcher (mp) or under Ray (ray).

Tensor parallel spans a node's GPUs, pipeline parallel spans the nodes.

mp (vLLM >= 0.11.1): every rank runs `vllm serve` with `--nnodes --node-rank
--master-addr --master-port`; ranks >= 1 add `--headless` and serve nothing.

ray: rank 0 runs `ray start --head` and then `vllm serve ...
--distributed-executor-backend ray`; the other ranks only join the Ray
cluster with `ray start --address=HEAD:PORT --block`. `vllm serve` starts
once the head listens, with RAY_ADDRESS naming this shard's head: without it
vLLM's ray.init() joins whichever Ray cluster on the machine started last.
`ray start --block` gets SIGTERM alone: it stops raylet before the GCS; a
signal to its whole group reaches the GCS first, and the head then waits 30 s
on its drain before it exits.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmgw.engines.base import (
    PROCESS_PROBE,
    Command,
    NodeFacts,
    RenderedShard,
    RenderError,
    base_env,
    budget_flag,
    health_probe,
    join_host_port,
    kv_events_args,
    lora_flags,
    program,
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
from llmgw.routing.kvblocks import HASH_ALGO

if TYPE_CHECKING:
    from llmgw.api import Shard


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    mode = shard.spec.launchMode or "mp"
    env = base_env(shard, node)
    env["VLLM_HOST_IP"] = node.address
    if shard.spec.adapters is not None:   # the agent loads and unloads them at runtime (load_lora_adapter)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if mode == "mp":
        return _render_mp(shard, node, executables, env)
    if mode == "ray":
        return _render_ray(shard, node, executables, env)
    raise RenderError(f"shard {shard.metadata.name}: unknown vLLM launchMode {mode!r} (use mp or ray)")


# vLLM's own share of a GPU (CacheConfig.gpu_memory_utilization's default): llmgw never asks for more.
DEFAULT_UTILIZATION = 0.9
# What vLLM's CUDA context takes of the free memory before vLLM compares it with its share at start
# (gpu_worker's startup check: free >= share x total, or it refuses to start).
CUDA_CONTEXT = 1 << 30


def _budget(shard: Shard) -> list[str]:
    """The share of each GPU vLLM may use (its weights, activations and KV cache): what its GPUs had
    free at placement (spec.kvCache) less its CUDA context, at most vLLM's default. vLLM then profiles
    its own activations and gives the KV cache the rest: the captured help of vLLM 0.11
    (tests/fixtures/data/help/vllm-0.11-all.txt) has no --kv-cache-memory-bytes to say it in bytes."""
    kv = shard.spec.kvCache
    if kv is None:
        return []
    share = min(DEFAULT_UTILIZATION, (kv.freeMiB * (1 << 20) - CUDA_CONTEXT) / (kv.gpuMiB * (1 << 20)))
    return budget_flag(shard, ("--gpu-memory-utilization", "--gpu_memory_utilization", "--kv-cache-memory-bytes",
                               "--kv_cache_memory_bytes"), f"{max(0.001, math.floor(share * 1000) / 1000):.3f}")


def _parallel(shard: Shard) -> list[str]:
    spec = shard.spec
    argv = ["--tensor-parallel-size", str(spec.gpusPerNode)]
    if spec.worldSize > 1:
        argv += ["--pipeline-parallel-size", str(spec.worldSize)]
    return argv


def _serving(shard: Shard, node: NodeFacts) -> list[str]:
    events = kv_events_args(shard, enable_kv_cache_events=True)
    return [
        "--host", node.address,
        "--port", str(shard.spec.ports.serve),
        "--served-model-name", *shard.spec.servedModelNames,
        *lora_flags(shard),
        # block keys the gateways can compute: sha256 of canonical CBOR (the default pickles)
        *([*events, "--prefix-caching-hash-algo", HASH_ALGO] if events else []),
    ]


def _render_mp(shard: Shard, node: NodeFacts, executables: dict[str, str], env: dict[str, str]) -> RenderedShard:
    spec = shard.spec
    argv = [program(executables, "vllm"), "serve", weights(shard)]
    if spec.rank == 0:
        argv += _serving(shard, node)
    argv += _parallel(shard) + _budget(shard)
    if spec.worldSize > 1:
        argv += [
            "--nnodes", str(spec.worldSize),
            "--node-rank", str(spec.rank),
            "--master-addr", spec.headAddress,
            "--master-port", str(spec.ports.distInit),
        ]
    if spec.rank > 0:
        argv.append("--headless")
    argv += spec.args
    if spec.rank == 0:
        return RenderedShard([Command("vllm", argv, env, serves=True)], health_probe(node, spec.ports.serve))
    return RenderedShard([Command("vllm", argv, env, serves=False)], PROCESS_PROBE)


def _ray_start(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> list[str]:
    spec = shard.spec
    argv = [program(executables, "ray"), "start"]
    if spec.rank == 0:
        argv += ["--head", f"--port={spec.ports.distInit}"]
    else:
        argv.append(f"--address={join_host_port(spec.headAddress, spec.ports.distInit)}")
    return argv + [f"--node-ip-address={node.address}", f"--num-gpus={spec.gpusPerNode}", "--block"]


def _render_ray(shard: Shard, node: NodeFacts, executables: dict[str, str], env: dict[str, str]) -> RenderedShard:
    spec = shard.spec
    head = (node.address, spec.ports.distInit) if spec.rank == 0 else None
    ray = Command("ray-head" if spec.rank == 0 else "ray-worker", _ray_start(shard, node, executables),
                  env, serves=False, listens=head, term_leader=True)
    if spec.rank > 0:
        return RenderedShard([ray], PROCESS_PROBE)
    serve_env = {**env, "RAY_ADDRESS": join_host_port(node.address, spec.ports.distInit)}
    serve = [
        program(executables, "vllm"), "serve", weights(shard),
        *_serving(shard, node), *_parallel(shard), *_budget(shard),
        "--distributed-executor-backend", "ray",
        *spec.args,
    ]
    return RenderedShard([ray, Command("vllm", serve, serve_env, serves=True)], health_probe(node, spec.ports.serve))


def _help(command: Command) -> HelpCommand | None:
    argv = command.argv
    if command.name in ("ray-head", "ray-worker"):   # ray start ...
        return HelpCommand("ray", [argv[0], "start", "--help"], flags=used_flags(argv[2:]))
    if command.name == "vllm":  # vllm serve MODEL ...
        return HelpCommand("vllm", [argv[0], "serve", "--help=all"], {"VLLM_TARGET_DEVICE": "cpu"},
                           used_flags(argv[3:]), fallback_help_argv=[argv[0], "serve", "--help"])
    return None


def _needs(launch_mode: str | None) -> frozenset[str]:
    # vLLM under Ray runs `ray start` then `vllm serve`, and vLLM no longer ships Ray: both must be there.
    return frozenset({"vllm", "ray"}) if launch_mode == "ray" else frozenset({"vllm"})


ENGINE = register(Engine(
    name="vllm", render=render, help_of=_help,
    executables=(Executable("vllm", "vllm", distribution="vllm"), Executable("ray", "ray", distribution="ray")),
    reserved={
        "--host": HOST, "--port": PORT,
        "--served-model-name": NAME,
        "--tensor-parallel-size": PARALLEL, "-tp": PARALLEL,
        "--pipeline-parallel-size": PARALLEL, "-pp": PARALLEL,
        "--data-parallel-size": PARALLEL, "-dp": PARALLEL,
        "--nnodes": MULTINODE, "-n": MULTINODE,
        "--node-rank": MULTINODE, "-r": MULTINODE,
        "--master-addr": MULTINODE, "--master-port": MULTINODE,
        "--headless": MULTINODE, "--distributed-executor-backend": MULTINODE,
        "--model": MODEL,
        "--enable-lora": LORA, "--no-enable-lora": LORA, "--max-loras": LORA,
        "--config": CONFIG,
    },
    syntax=Syntax(abbreviations=True, underscores=True),
    launch_modes=("mp", "ray"), needs=_needs, lora=LoraApi(), kv_events=True,
    context_flags=("--max-model-len",),
    memory_overhead=(2 << 30, "assumed, not yet measured against a real vLLM's log: it profiles activations "
                              "and captures CUDA graphs at start, besides the CUDA context"),
    # vllm/entrypoints: openai/responses, serve/tokenize, pooling/score's api_router.py; pooling/pooling's
    # and pooling/classify's, speech_to_text/transcription's and translation's (docs/gateway.md cites commits)
    serves=OPENAI | {"/v1/responses", "/tokenize", "/detokenize", "/score", "/v1/score",
                     "/rerank", "/v1/rerank", "/v2/rerank", "/pooling", "/classify",
                     "/v1/audio/transcriptions", "/v1/audio/translations"},
))
