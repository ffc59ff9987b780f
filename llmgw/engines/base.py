"""What a renderer returns, and the facts every renderer shares.

A renderer turns one Shard (one rank of a replica on one node) into the
programs to run there, their environment, and how to tell that the shard is
up. It never starts anything: the agent runs the commands, `engine-check`
checks their flags.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from llmgw.routing.kvblocks import HASH_SEED

if TYPE_CHECKING:
    from llmgw.api import Shard


class RenderError(ValueError):
    """A Shard that cannot be turned into a command line (says which field is wrong)."""


@dataclass(frozen=True)
class NodeFacts:
    """What a renderer needs to know about the node that runs the shard."""

    address: str
    # (adapter, port) of the shard's fabric, e.g. [("mlx5_2", 1)]; [] on an island.
    fabric_adapters: list[tuple[str, int]] = field(default_factory=list)
    # The weights on the node of the LoRA adapters an engine that takes them only at start is
    # given (llama-server's --lora), in the order of their ids (the agent's start_adapters).
    loras: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Command:
    """One program to start. A shard's commands start in list order and stop in reverse order."""

    name: str
    argv: list[str]
    env: dict[str, str]
    serves: bool  # True for the program that answers the shard's serve port
    # (host, port) the program listens on before the next command may start.
    listens: tuple[str, int] | None = None
    # SIGTERM to the program alone, which stops its own children in order, instead
    # of to its whole process group at once (the group follows once it has exited).
    term_leader: bool = False


@dataclass(frozen=True)
class Probe:
    """How to tell the shard is up: an HTTP health URL (rank 0) or 'the process is alive'."""

    kind: Literal["http", "process"]
    url: str | None = None


@dataclass(frozen=True)
class RenderedShard:
    commands: list[Command]
    probe: Probe


def base_env(shard: Shard, node: NodeFacts) -> dict[str, str]:
    """The profile's env, then what the placement dictates (the placement wins)."""
    env = dict(shard.spec.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in shard.spec.gpus)
    if shard.spec.ports.kvEvents:  # the seed of its block hashes, which the gateways hash with too
        env["PYTHONHASHSEED"] = HASH_SEED
    if node.fabric_adapters:
        env["NCCL_IB_HCA"] = nccl_ib_hca(node.fabric_adapters)
    return env


def lora_flags(shard: Shard) -> list[str]:
    """vLLM's flags (the sim's too) for a shard whose Model takes LoRA adapters (spec.adapters):
    loaded at runtime, at most maxLoaded at once; none otherwise."""
    slots = shard.spec.adapters
    return [] if slots is None else ["--enable-lora", "--max-loras", str(slots.maxLoaded)]


def kv_events_args(shard: Shard, **fields: object) -> list[str]:
    """--kv-events-config (vLLM's and SGLang's flag) where the shard publishes KV events
    (docs/contracts.md, "KV events"): the engine's own `fields` first, then its PUB and replay ROUTER
    bound on every address (an endpoint with `*` is bound, any other connected to), the default topic."""
    ports = shard.spec.ports
    if not ports.kvEvents:
        return []
    config = {**fields, "publisher": "zmq", "endpoint": f"tcp://*:{ports.kvEvents}",
              "replay_endpoint": f"tcp://*:{ports.kvReplay}"}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def default_flag(shard: Shard, flags: tuple[str, ...], value: str) -> list[str]:
    """`[flags[0], value]`, unless the Model's args set one of `flags` themselves (theirs is the only
    one given)."""
    return [] if any(a.split("=", 1)[0] in flags for a in shard.spec.args) else [flags[0], value]


def budget_flag(shard: Shard, flags: tuple[str, ...], value: str) -> list[str]:
    """The KV budget (spec.kvCache) as the engine's flag (default_flag); none when the shard has none."""
    return [] if shard.spec.kvCache is None else default_flag(shard, flags, value)


def nccl_ib_hca(adapters: list[tuple[str, int]]) -> str:
    """NCCL_IB_HCA naming exactly these adapter ports ('=' prefix: exact match, not prefix)."""
    return "=" + ",".join(f"{name}:{port}" for name, port in adapters)


def url_host(address: str) -> str:
    """The host part of a URL that reaches a server bound to `address`."""
    if address in ("", "0.0.0.0"):
        return "127.0.0.1"
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def health_probe(node: NodeFacts, port: int, path: str = "/health") -> Probe:
    return Probe(kind="http", url=f"http://{url_host(node.address)}:{port}{path}")


PROCESS_PROBE = Probe(kind="process")


def weights(shard: Shard) -> str:
    if not shard.spec.source:
        raise RenderError(
            f"shard {shard.metadata.name}: engine {shard.spec.engine} needs the path of the model's "
            f"weights on the node: set spec.source on model {shard.spec.model}"
        )
    return shard.spec.source


def program(executables: dict[str, str], key: str, default: str | None = None) -> str:
    """The configured path of a program, or its bare name (found on PATH when run)."""
    return executables.get(key) or default or key
