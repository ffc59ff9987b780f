"""What a replica asks of the nodes it lands on."""
from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.api import Replica


@dataclass(frozen=True)
class Request:
    name: str                      # replica name
    model: str
    nodes: int = 1                 # ranks, one per node
    gpus: int = 1                  # GPUs per node
    engines: frozenset[str] = frozenset({"sim"})
    selector: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def engines_needed(engine: str, launch_mode: str | None) -> frozenset[str]:
    """Engine programs a node must report in status.engines.

    vLLM under Ray runs `ray start` then `vllm serve`, and vLLM no longer ships
    Ray, so both must be installed.
    """
    if engine == "vllm" and launch_mode == "ray":
        return frozenset({"vllm", "ray"})
    return frozenset({engine})


def request_for(replica: Replica) -> Request:
    p = replica.spec.profile
    return Request(
        name=replica.metadata.name,
        model=replica.spec.model,
        nodes=p.nodes,
        gpus=p.gpusPerNode,
        engines=engines_needed(p.engine, p.launch_mode),
        selector=tuple(sorted(replica.spec.nodeSelector.items())),
    )
