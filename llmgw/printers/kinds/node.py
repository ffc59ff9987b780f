"""A Node's table (`llmgw get nodes`, `llmgw-onboard-node`'s row) and what `describe` shows
beside it: its replicas and the GPUs they hold."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from llmgw.api import EVICTING, Node, Replica
from llmgw.api.meta import get_condition
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, by_name, register
from llmgw.printers.table import NONE, binary_size, human_age, join, section, unique


def node_status(node: Node) -> str:
    """kubectl-style combined status: Ready | NotReady, then the flags that apply."""
    ready = get_condition(node.status.conditions, "Ready")
    parts = ["Ready" if ready is not None and ready.status == "True" else "NotReady", _eviction(node)]
    gpu = get_condition(node.status.conditions, "GPUDiscovery")
    if gpu is not None and gpu.status == "False":
        parts.append("GPUDiscoveryFailed")
    if node.spec.unschedulable:
        parts.append("SchedulingDisabled")
    if node.spec.drain:
        phase = node.status.drain.phase if node.status.drain else "Draining"
        parts.append({"Stuck": "DrainStuck"}.get(phase, phase))
    if node.metadata.deletionTimestamp is not None:
        parts.append("Terminating")
    return ",".join(p for p in parts if p)


def _eviction(node: Node) -> str:
    """The node lifecycle controller's verdict (condition Evicting): Lost, EvictionHeld(REASON)
    while a silent node's judgement is held back, nothing once the node is back (HeartbeatResumed)."""
    verdict = get_condition(node.status.conditions, EVICTING)
    if verdict is None or verdict.reason == "HeartbeatResumed":
        return ""
    return "Lost" if verdict.status == "True" else f"EvictionHeld({verdict.reason})"


def gpus_used(replicas: Iterable[Replica]) -> dict[str, set[int]]:
    """node name -> GPU indices held by the placements of replicas on it."""
    used: dict[str, set[int]] = {}
    for r in replicas:
        for p in r.spec.placement:
            used.setdefault(p.node, set()).update(p.gpus)
    return used


def weights(node: Node) -> str:
    """The node's weights cache: `2 models, 120Gi free` (none: its agent keeps no cache)."""
    cache = node.status.weights
    if cache is None:
        return NONE
    n = len(cache.models)
    return f"{n} model{'' if n == 1 else 's'}, {binary_size(cache.freeBytes)} free"


def gpu_memory(node: Node) -> str:
    """`79Gi/79Gi`: the least free of its GPUs / the most total, as discovery read them (none: not reported)."""
    free = [g.memoryFreeMiB for g in node.status.gpus if g.memoryFreeMiB is not None]
    total = [g.memoryMiB for g in node.status.gpus if g.memoryMiB is not None]
    if not total:
        return NONE
    return f"{binary_size(min(free) << 20) if free else NONE}/{binary_size(max(total) << 20)}"


def replicas_per_node(replicas: Iterable[Replica]) -> dict[str, int]:
    count: dict[str, int] = {}
    for r in replicas:
        for node in {p.node for p in r.spec.placement}:
            count[node] = count.get(node, 0) + 1
    return count


@register(Node)
class NodePrinter(KindPrinter[Node]):
    headers = ["NAME", "STATUS", "GPUS", "FABRICS", "ENGINES", "REPLICAS", "AGE"]
    wide_headers = ["GPU-MEM", "WEIGHTS", "ADDRESS", "GPU-MODEL", "AGENT"]
    follows = (Replica,)   # GPUS and REPLICAS count every replica's placement

    def rows(self, objects: Sequence[Node], beside: Beside, now: datetime | None) -> list[list[str]]:
        replicas = beside.of(Replica)
        used, count = gpus_used(replicas), replicas_per_node(replicas)
        return [[n.name, node_status(n), f"{len(used.get(n.name, ()))}/{len(n.status.gpus)}",
                 join(f.name for f in n.status.fabrics), join(unique(e.name for e in n.status.engines)),
                 str(count.get(n.name, 0)), human_age(n.metadata.creationTimestamp, now)] for n in objects]

    def wide(self, n: Node) -> list[str]:
        return [gpu_memory(n), weights(n), n.status.addresses[0] if n.status.addresses else NONE,
                join(unique(g.name or "" for g in n.status.gpus)), n.status.agentVersion or NONE]

    async def related(self, reader: Reader, obj: Node) -> list[str]:
        """The GPUs its replicas' placements hold, and those replicas."""
        replicas, _ = await reader.list(Replica)
        mine = [r for r in replicas if any(p.node == obj.name for p in r.spec.placement)]
        used = len(gpus_used(replicas).get(obj.name, ()))
        return [f"Allocated GPUs: {used}/{len(obj.status.gpus)}", *section(
            "Replicas", ["NAME", "MODEL", "PHASE", "GPUS"], [
                [r.name, r.spec.model, r.status.phase,
                 ",".join(str(g) for p in r.spec.placement if p.node == obj.name for g in p.gpus) or NONE]
                for r in by_name(mine)])]
