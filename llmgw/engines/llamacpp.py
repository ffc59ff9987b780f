"""llama.cpp's `llama-server`: single node.

`--parallel` and `--n-gpu-layers` get defaults (4 slots, every layer on the
GPUs); a model's args come last, so they can override both. `--kv-unified`
keeps one KV cache shared by the slots, so one request can use the whole
`--ctx-size`: llama-server turns it on by itself only when it picks the slot
count, and with a slot count given it splits the context between the slots
(4 slots of an 8192-token context would take 2048-token requests at most).
`--alias` takes a comma-separated list: every name in servedModelNames.
`--ctx-size` is the replica's KV budget in tokens (spec.kvCache) where it has one, at most the
model's own context for each of the slots.

LoRA adapters (a Model's spec.adapters) are given at start only: `--lora` lists their
weights (the agent's NodeFacts.loras: the Model's Adapters in `engine.start_order`, at most
maxLoaded), `--lora-init-without-apply` leaves each at scale 0, and a request picks one by
its id, the position in that list: the gateway adds `"lora": [{"id": N, "scale": 1.0}]`, and
`"lora": [], "cache_prompt": false` to a request for the base: llama-server (build 11434)
reuses a prompt it cached under an adapter for a request with none, and so answers the base
from the adapter's KV (seen in tests/engines/test_real_llamacpp.py; an adapter after an
adapter or the base is computed anew). `GET /lora-adapters` lists them ({"id", "path"}).
There is no runtime load: an Adapter created after the engine started is loaded at its next
start.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmgw.engines import base, engine
from llmgw.engines.base import Command, NodeFacts, RenderedShard, RenderError, base_env, health_probe, program, weights
from llmgw.engines.engine import HOST, MODEL, MULTINODE, NAME, OPENAI, PORT, Engine, Executable, HelpCommand, register
from llmgw.engines.helptext import used_flags

if TYPE_CHECKING:
    from llmgw.api import KVBudget, Shard

DEFAULT_PARALLEL = 4
ALL_LAYERS = 999


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    spec = shard.spec
    if spec.worldSize != 1:
        raise RenderError(f"shard {shard.metadata.name}: llama-server is single-node, "
                          f"but worldSize is {spec.worldSize}")
    argv = [
        program(executables, "llama-server"),
        "--model", weights(shard),
        "--host", node.address,
        "--port", str(spec.ports.serve),
        "--metrics",
        "--alias", ",".join(spec.servedModelNames),
        "--parallel", str(DEFAULT_PARALLEL),
        "--kv-unified",
        "--n-gpu-layers", str(ALL_LAYERS),
        # the KV cache its GPUs hold (spec.kvCache), shared by the slots (--kv-unified)
        *(base.budget_flag(shard, ("--ctx-size", "-c"), str(_context(spec.kvCache))) if spec.kvCache else []),
        *_lora_args(shard, node),
        *spec.args,
    ]
    return RenderedShard(
        [Command("llama-server", argv, base_env(shard, node), serves=True)],
        health_probe(node, spec.ports.serve),
    )


def _context(kv: KVBudget) -> int:
    """The tokens its GPUs hold, at most the model's own context for each slot: past that a slot
    gains nothing, and llama.cpp would still allocate it (a small model on a large GPU)."""
    return kv.tokens if kv.modelContext is None else min(kv.tokens, kv.modelContext * DEFAULT_PARALLEL)


def _lora_args(shard: Shard, node: NodeFacts) -> list[str]:
    if shard.spec.adapters is None:
        return []
    return ["--lora-init-without-apply", *(["--lora", ",".join(node.loras)] if node.loras else [])]


def _lora_request(adapter: str, served: str, slot: int) -> dict[str, Any]:
    return {"lora": [{"id": slot, "scale": 1.0}]}


def _help(command: Command) -> HelpCommand | None:
    if command.name != "llama-server":
        return None
    return HelpCommand("llama-server", [command.argv[0], "--help"], flags=used_flags(command.argv[1:]))


ENGINE = register(Engine(
    name="llamacpp", render=render, help_of=_help,
    executables=(Executable("llama-server", "llamacpp", version_argv=("--version",)),),
    reserved={
        "--host": HOST, "--port": PORT,
        "-a": NAME, "--alias": NAME,
        "-m": MODEL, "--model": MODEL,
        "-mu": MODEL, "--model-url": MODEL,
        "-hf": MODEL, "-hfr": MODEL, "--hf-repo": MODEL,
        "-hff": MODEL, "--hf-file": MODEL,
        "-dr": MODEL, "--docker-repo": MODEL,
        "--models-dir": MODEL, "--models-preset": MODEL,
        "--rpc": MULTINODE,
        "--lora": engine.LORA, "--lora-scaled": engine.LORA, "--lora-init-without-apply": engine.LORA,
    },
    multi_node=False,
    lora=engine.LoraApi(load=None, unload=None, listed="/lora-adapters", request=_lora_request,
                 base=(("lora", []), ("cache_prompt", False))),
    # tools/server/server.cpp's routes
    serves=OPENAI | {"/tokenize", "/detokenize", "/rerank", "/v1/rerank", "/reranking", "/v1/reranking"},
    memory_overhead=(512 << 20, "assumed, not measured: the CUDA context and compute buffers at default batch size"),
    split="layers", context_flags=("-c", "--ctx-size"),
))
