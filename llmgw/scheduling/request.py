"""What a replica asks of the nodes it lands on."""
from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.api import MemoryEstimate, Replica, ShardPorts
from llmgw.engines.engine import lookup

MiB = 1 << 20


@dataclass(frozen=True)
class Request:
    name: str                      # replica name
    model: str
    nodes: int = 1                 # ranks, one per node
    gpus: int = 1                  # GPUs per node
    engines: frozenset[str] = frozenset()   # what its nodes must report (its engine's `required`)
    selector: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    digest: str | None = None      # its weights' content digest, when pinned (nodes holding it are preferred)
    estimate: MemoryEstimate | None = None   # its spec.memory, when estimated
    kv_events: bool = False        # its rank 0 publishes KV events: two ports more (ShardPorts.needed)

    @property
    def memory(self) -> int | None:
        """MiB each of its GPUs must have free (rounded up), when estimated."""
        return None if self.estimate is None else -(-self.estimate.neededBytes // MiB)

    @property
    def ports(self) -> int:
        """The ports a node must have free for a rank of it (rank 0's, the most a rank takes)."""
        return ShardPorts.needed(0, self.kv_events)


def request_for(replica: Replica) -> Request:
    p = replica.spec.profile
    return Request(
        name=replica.metadata.name,
        model=replica.spec.model,
        nodes=p.nodes,
        gpus=p.gpusPerNode,
        engines=lookup(p.engine).required(p.launch_mode),
        selector=tuple(sorted(replica.spec.nodeSelector.items())),
        digest=replica.spec.digest,
        estimate=replica.spec.memory,
        kv_events=replica.spec.kvEvents,
    )
