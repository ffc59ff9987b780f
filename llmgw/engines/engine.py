"""What llmgw knows of an engine, declared in the engine's own module, and the registry of them.

Each engine is one module of this package (vllm.py, sglang.py, llamacpp.py, sim.py)
that renders a Shard into commands and declares an ``Engine``: its name (a
Profile's ``engine``), the programs it runs (what the agent discovers and reports
in Node status, so that the scheduler places a shard only where they are), the
flags llmgw sets itself and how the engine's parser reads them (a Model's args
may not set them), its launch modes, whether it spans nodes, and how
engine-check asks each of its programs for its --help. ``register`` makes it
known; every other package reads the registry (docs/architecture.md, "Adding an
engine").

The API validates a Profile against the engines' rules through rules.py, which
reads this registry and imports nothing of llmgw: the API imports that, not this
module, and the engines import the API's types one way.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmgw.engines import rules

if TYPE_CHECKING:
    from llmgw.api import Shard
    from llmgw.engines.base import Command, NodeFacts, RenderedShard

# The model-addressed JSON endpoints (POST, the model in the body) every engine serves; an engine
# declares what else it serves in `serves`, read from its own route table (docs/gateway.md).
OPENAI = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})

# Why llmgw reserves a flag, shared by the engines' tables.
HOST = "llmgw binds the engine to the node's address"
PORT = "llmgw assigns the serve port from the node's port range"
NAME = "llmgw passes the model's name and aliases so the gateway can route by them"
PARALLEL = "llmgw derives parallel sizes from the profile's nodes and gpusPerNode"
MULTINODE = "llmgw sets the multi-node rendezvous from the replica's placement"
MODEL = "llmgw passes the model's weights path from spec.source"
LORA = "llmgw sets the LoRA adapter slots from the Model's spec.adapters"
CONFIG = "a config file could set any of the flags llmgw sets; put the settings in args"


@dataclass(frozen=True)
class Syntax:
    """How an engine's parser reads a flag beyond its exact spellings."""

    abbreviations: bool = False  # argparse: a unique prefix of a long option names it
    underscores: bool = False    # `--a_b` means `--a-b`


@dataclass(frozen=True)
class Executable:
    """A program an engine runs: the agent's `--engine NAME=PATH` names it, and the agent
    reports it in Node status.engines under `reports` when it can run."""

    name: str                        # "vllm", "ray", "sglang" (the Python that has it), "llama-server"
    reports: str                     # its name in status.engines (llama-server: "llamacpp")
    distribution: str | None = None  # a Python distribution whose dist-info next to it gives its version
    version_argv: tuple[str, ...] = ()  # else: run it with these arguments and read "version: X"
    on_path: bool = True             # `llmgw dev up --engine NAME` may look for it on PATH


@dataclass
class HelpCommand:
    """One program that receives rendered commands: how to ask its help, which flags it gets."""

    name: str
    help_argv: list[str]
    help_env: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    fallback_help_argv: list[str] | None = None  # tried when help_argv fails (vLLM before --help=all)


Renderer = Callable[["Shard", "NodeFacts", dict[str, str]], "RenderedShard"]


@dataclass(frozen=True)
class LoraApi:
    """How an engine takes LoRA adapters (a Model's spec.adapters): how the agent loads, unloads and
    lists them (llmgw/agent/adapters.py), and how a request the gateway sends it names one."""

    # POST {"lora_name", "lora_path"} loads one at runtime, and {"lora_name"} unloads it; None: it
    # takes adapters only at start (llama-server's --lora), in the order of `start_order`.
    load: str | None = "/v1/load_lora_adapter"
    unload: str | None = "/v1/unload_lora_adapter"
    # GET: what it holds. "/v1/models": the cards with a parent (vLLM, SGLang); else llama-server's
    # /lora-adapters, a list of {"id", "path"}.
    listed: str = "/v1/models"
    # The body fields of a request for `adapter` of the base the engine serves as `served`, the
    # adapter's id where it was given at start (-1 otherwise); {} keeps the body as it is.
    request: Callable[[str, str, int], dict[str, Any]] = lambda adapter, served, slot: {}
    # The body fields of a request for the base model itself.
    base: tuple[tuple[str, Any], ...] = ()

    @property
    def at_start(self) -> bool:
        return self.load is None


def start_order(adapters: Iterable[tuple[int, str]]) -> list[str]:
    """The adapters of one Model, (created, name), in the order an engine that takes them at start
    is given them and so numbers them: the oldest first, so that an Adapter created later does not
    renumber those before it (the agent gives the first maxLoaded; the gateway names one by its place)."""
    return [name for _, name in sorted(adapters)]


@dataclass(frozen=True)
class Engine:
    name: str
    render: Renderer
    # How engine-check asks a rendered command's program for its help (None: not a program of this engine).
    help_of: Callable[[Command], HelpCommand | None]
    # The first is the main program. () for an engine llmgw itself runs (the sim): every node has
    # it, and the agent reports it with its own path and version.
    executables: tuple[Executable, ...] = ()
    reserved: Mapping[str, str] = field(default_factory=dict)   # flag spelling -> why llmgw sets it
    syntax: Syntax = Syntax()
    launch_modes: tuple[str, ...] = ()   # Profile.launchMode's values; the first is the default
    multi_node: bool = True
    # Takes LoRA adapters (a Model's spec.adapters), and how; None: it takes none.
    lora: LoraApi | None = None
    # What the agent's preflight checks before the first command starts: the weights at the
    # shard's spec.source are on the node, and the node has the shard's GPUs (the sim uses neither).
    loads_weights: bool = True
    uses_gpus: bool = True
    # It publishes KV events in vLLM's wire layout (--kv-events-config: vLLM, SGLang, the sim): a
    # Model routed with precise-prefix gets their ports on rank 0 (ReplicaSpec.kvEvents,
    # base.kv_events_args).
    kv_events: bool = False
    # How its events key blocks (llmgw.routing.kvblocks.HASHERS): vLLM's "sha256_cbor", SGLang's "sha256_uint32".
    block_hashes: str = "sha256_cbor"
    # GPU memory it holds besides the weights and the KV cache (the CUDA context, one forward pass's
    # activations, CUDA graphs, the sampler), in bytes, and where that figure comes from: llmgw/fit.py.
    memory_overhead: tuple[int, str] = (2 << 30, "assumed, not measured: an engine with no figure of its own")
    # How its renderer splits a replica's GPUs (llmgw/fit.py): "tp-pp" tensor-parallel within a node
    # and pipeline-parallel across nodes, "tp" tensor-parallel over all, "layers" layers over its GPUs.
    split: Literal["tp-pp", "tp", "layers"] = "tp-pp"
    # The flags of a Model's args that set the context one request may reach (vLLM's --max-model-len):
    # placement asks room for the KV of that many tokens at least (llmgw/estimates.py).
    context_flags: tuple[str, ...] = ()
    # status.engines a node must report, by launch mode (default: the engine's own name)
    needs: Callable[[str | None], frozenset[str]] | None = None
    # The model-addressed JSON endpoints its server answers (the gateway routes them: a path
    # none of a model's engines serves is a 404 there).
    serves: frozenset[str] = OPENAI

    def required(self, launch_mode: str | None) -> frozenset[str]:
        """What a node must report in status.engines to run this engine in `launch_mode`."""
        return self.needs(launch_mode) if self.needs is not None else frozenset({self.name})

    def context_floor(self, args: list[str]) -> int | None:
        """The context the last of `args`' context flags sets (`--flag N` or `--flag=N`), in
        tokens; None when they set none, or a value that is not a whole number (the engine says why)."""
        found = None
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if flag in self.context_flags:
                found = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        return int(found) if found is not None and found.isdigit() and int(found) > 0 else None

    def reserved_flag(self, arg: str) -> tuple[str, str] | None:
        """The reserved flag `arg` sets, as this engine's parser reads it, and why; None when it sets none.

        argparse (vLLM, SGLang, the sim) reads `--flag=value`, a unique prefix of a long option
        (`--served-model=x`) and a one-letter short option with its value attached (`-n2`); vLLM
        also reads `--a_b` as `--a-b`; llama-server matches spellings exactly."""
        table, syntax = self.reserved, self.syntax
        if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
            return None
        written = arg.split("=", 1)[0]
        flag = written.replace("_", "-") if syntax.underscores and written.startswith("--") else written
        if flag in table:
            return written, table[flag] if flag == written else f"{self.name} reads it as {flag}; {table[flag]}"
        if syntax.abbreviations and flag.startswith("--") and len(flag) > 2:
            for full, why in table.items():
                if full.startswith(flag):
                    return written, f"{self.name} reads it as {full}; {why}"
        if syntax.abbreviations and not flag.startswith("--") and flag[:2] in table:
            # `-n2`: argparse's one-letter option with its value attached
            return written, f"{self.name} reads it as {flag[:2]} {flag[2:]}; {table[flag[:2]]}"
        return None


ENGINES: dict[str, Engine] = {}
rules.RULES = ENGINES   # what the API validates a Profile against


def register(engine: Engine) -> Engine:
    """Make an engine known by its name (to the API's validation too: rules.py)."""
    if engine.name in ENGINES and ENGINES[engine.name] != engine:
        raise ValueError(f"engine {engine.name!r} is registered twice")
    ENGINES[engine.name] = engine
    return engine


def lookup(name: str) -> Engine:
    """The registered engine of that name; ValueError naming the known ones."""
    rules.lookup(name)
    return ENGINES[name]


def builtin() -> list[Engine]:
    """The engines llmgw itself runs (no programs of their own): every node has them."""
    return [e for e in ENGINES.values() if not e.executables]


def executables() -> dict[str, Executable]:
    """Every registered engine's programs by name (the agent's `--engine NAME=PATH`)."""
    return {x.name: x for e in ENGINES.values() for x in e.executables}


def executable_name(word: str) -> str:
    """The program `word` names: a program's own name, or an engine's (llamacpp: llama-server)."""
    known = executables()
    if word in known:
        return word
    if word in ENGINES and ENGINES[word].executables:
        return ENGINES[word].executables[0].name
    raise ValueError(f"unknown engine executable {word!r}: use {', '.join(known)}")
