"""Choose nodes and GPUs for one replica, or say why none fit.

Filters (per node, first failing one is the node's reason):
  not ready · cordoned (spec.unschedulable, or a drain requested) · node
  selector mismatch · missing engine <name> · no fabric (an island: only
  single-node replicas) · insufficient GPUs · insufficient GPU memory (a
  replica with an estimate, spec.memory: fewer free GPUs with its neededBytes
  free than it needs; a GPU that reports no memory counts as enough) ·
  no free ports (fewer than a rank of the replica takes: ShardPorts.needed).
A multi-node replica also needs `nodes` fitting nodes on one fabric, one rank
per node.

Scoring, lowest wins:
  1. spread: fewest ranks of the same model already on the node, so losing a
     node costs a model as few replicas as possible;
  2. pack (best fit): fewest free GPUs that still fit, keeping whole nodes free
     for wide replicas (a two-node, eight-GPU replica needs two empty nodes on
     one fabric, and scattering small replicas would leave none);
  3. order of arrival in the free-GPU bucket (deterministic for a given
     sequence of events).
Weights: a replica whose weights' digest is pinned goes, among the nodes
equal by 1., first to those whose cache holds it (Node status.weights), then
by 2. and 3.: a preference, never a filter, so a node without them still
takes the replica when none with them fits.
For a multi-node replica each fabric offers its best `nodes` nodes; the fabric
with the lowest (sum of 1., sum of 2., name) wins.

A placed replica with an estimate gets its KV budget (`budget`): the least free memory of
the GPUs chosen, less its weights and overhead, in bytes and in tokens, which its engines
are told (llmgw/engines/).

Cost: the walk starts at the tightest bucket that fits and stops at the first
node (or the first `nodes` nodes of a fabric) holding no rank of the model,
which for a model spread thin is the first fitting node. Only when nothing
fits does it scan every node, to explain.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from llmgw.api import KVBudget, MemoryEstimate, Placement
from llmgw.scheduling.ledger import Ledger, NodeInfo
from llmgw.scheduling.request import MiB, Request

GiB = 1 << 30


@dataclass(frozen=True)
class Slot:
    rank: int
    node: str
    gpus: tuple[int, ...]
    fabric: str | None


@dataclass(frozen=True)
class Fit:
    slots: tuple[Slot, ...]
    fabric: str | None

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.slots]


def describe(slots: Iterable[Slot | Placement]) -> str:
    """"rank 0 on n1 GPUs 0,1, rank 1 on n2 GPUs 0,1 over fabric fab-a" for Slots or Placements."""
    ranked = sorted(slots, key=lambda s: s.rank)
    where = ", ".join(f"rank {s.rank} on {s.node} GPUs {','.join(map(str, s.gpus))}" for s in ranked)
    fabric = ranked[0].fabric if ranked else None
    return where + (f" over fabric {fabric}" if fabric else "")


@dataclass(frozen=True)
class Unfit:
    message: str                   # "0/12 nodes: 6 insufficient GPUs, 4 no fabric, 2 cordoned"
    reasons: dict[str, int]


def static_reason(info: NodeInfo, req: Request) -> str | None:
    """Why a node can never take this request as it is now (GPU use aside)."""
    if not info.ready:
        return "not ready"
    if info.cordoned:
        return "cordoned"
    labels = info.labels
    for k, v in req.selector:
        if labels.get(k) != v:
            return "node selector mismatch"
    if not req.engines <= info.engines:
        return "missing engine " + ",".join(sorted(req.engines - info.engines))
    if req.nodes > 1 and not info.fabrics:
        return "no fabric"
    return None


def node_reason(ledger: Ledger, info: NodeInfo, req: Request) -> str | None:
    why = static_reason(info, req)
    if why:
        return why
    if ledger.free_count(info.name) < req.gpus:
        return "insufficient GPUs"
    if not _roomy(ledger, info, req):
        return MEMORY_REASON
    if ledger.free_ports(info.name) < req.ports:
        return "no free ports"
    return None


def _fits(ledger: Ledger, info: NodeInfo, req: Request) -> bool:
    return (static_reason(info, req) is None
            and ledger.free_ports(info.name) >= req.ports and _roomy(ledger, info, req))


MEMORY_REASON = "insufficient GPU memory"


def _gpus_for(ledger: Ledger, info: NodeInfo, req: Request) -> list[int]:
    """The node's free GPUs with the memory the request needs free, lowest index first."""
    need = req.memory
    return [g for g in ledger.free_gpus(info.name)
            if need is None or (mib := info.memory.get(g)) is None or mib >= need]


def _roomy(ledger: Ledger, info: NodeInfo, req: Request) -> bool:
    return req.memory is None or len(_gpus_for(ledger, info, req)) >= req.gpus


def _best(ledger: Ledger, buckets: dict[int, dict[str, None]], req: Request, want: int
          ) -> list[tuple[int, int, str]]:
    """The `want` best (model ranks, free GPUs, name) fitting nodes among buckets."""
    counts = ledger.model_ranks.get(req.model, {})
    nodes = ledger.nodes
    spread: list[tuple[int, int, str]] = []     # nodes without the model, best first
    others: list[tuple[int, int, str]] = []
    holders = ledger.holders.get(req.digest, ()) if req.digest else ()
    if holders:
        # the nodes holding the weights come first among the spread ones (a few: checked directly)
        held = sorted((free, name) for name in holders if (free := ledger.free_count(name)) >= req.gpus
                      and name in _members(buckets, free) and _fits(ledger, nodes[name], req)
                      and counts.get(name, 0) == 0)
        spread = [(0, free, name) for free, name in held[:want]]
        if len(spread) == want:
            return spread
    taken = {name for _, _, name in spread}
    for free in sorted(b for b in buckets if b >= req.gpus):
        for name in buckets[free]:
            if name in taken or not _fits(ledger, nodes[name], req):
                continue
            c = counts.get(name, 0)
            if c == 0:
                spread.append((0, free, name))
                if len(spread) == want:
                    return spread
            else:
                others.append((c, free, name))
    if len(spread) + len(others) < want:
        return []
    # stable sort: arrival order breaks ties
    return sorted(spread + others, key=lambda t: (t[0], t[1]))[:want]


def _members(buckets: dict[int, dict[str, None]], free: int) -> dict[str, None]:
    """The nodes of `buckets` (all nodes, or one fabric's) with `free` free GPUs."""
    return buckets.get(free, {})


def place(ledger: Ledger, req: Request) -> Fit | Unfit:
    if req.nodes == 1:
        best = _best(ledger, ledger.by_free, req, 1)
        if best:
            _, _, name = best[0]
            gpus = tuple(_gpus_for(ledger, ledger.nodes[name], req)[:req.gpus])
            return Fit((Slot(0, name, gpus, None),), None)
        return explain(ledger, req)
    choice: tuple[tuple[int, int, str], list[tuple[int, int, str]]] | None = None
    for fabric in sorted(ledger.by_fabric_free):
        best = _best(ledger, ledger.by_fabric_free[fabric], req, req.nodes)
        if not best:
            continue
        score = (sum(b[0] for b in best), sum(b[1] for b in best), fabric)
        if choice is None or score < choice[0]:
            choice = (score, best)
    if choice is None:
        return explain(ledger, req)
    fabric = choice[0][2]
    slots = tuple(
        Slot(rank, name, tuple(_gpus_for(ledger, ledger.nodes[name], req)[:req.gpus]), fabric)
        for rank, (_, _, name) in enumerate(choice[1])
    )
    return Fit(slots, fabric)


def explain(ledger: Ledger, req: Request) -> Unfit:
    """Count, over every node, the first reason it cannot take the request."""
    reasons: Counter[str] = Counter()
    fitting: Counter[str] = Counter()     # fabric -> nodes that fit on their own
    fitting_nodes: list[NodeInfo] = []
    for info in ledger.nodes.values():
        why = node_reason(ledger, info, req)
        if why:
            reasons[why] += 1
        else:
            fitting_nodes.append(info)
            fitting.update(info.fabrics)
    total = len(ledger.nodes)
    if req.nodes > 1 and fitting_nodes:
        # Every fitting node is on a fabric with fewer than `nodes` fitting nodes.
        reasons["too few fitting nodes on their fabric"] += len(fitting_nodes)
    parts = [f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))]
    msg = f"0/{total} nodes: " + (", ".join(parts) if parts else "no nodes registered")
    if req.nodes > 1:
        top = ", ".join(f"{f} {n}" for f, n in sorted(fitting.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
        msg += (f"; needs {req.nodes} nodes with {req.gpus} free GPUs each on one fabric"
                + (f" (fitting per fabric: {top})" if top else ""))
    est = req.estimate
    if MEMORY_REASON in reasons and est is not None:
        largest = max((info.memory.get(g, 0) for info in ledger.nodes.values() for g in ledger.free_gpus(info.name)),
                      default=0)
        at = f"tp={est.tp}" + (f" pp={est.pp}" if est.pp > 1 else "")
        msg += (f"; needs {est.neededBytes / GiB:.1f} GiB per GPU at {at}, largest free {largest / 1024:.1f} GiB "
                f"(weights {est.weightsBytes / GiB:.1f} GiB, overhead {est.overheadBytes / GiB:.1f} GiB, "
                f"KV {est.kvBytesPerToken * est.minContext / GiB:.1f} GiB for {est.minContext} tokens)")
    return Unfit(msg, dict(reasons))


def budget(ledger: Ledger, fit: Fit, est: MemoryEstimate | None) -> KVBudget | None:
    """The KV cache its engines may use, per GPU, on the GPUs `fit` chose: the least free of them
    less the weights and the overhead; None without an estimate or where a GPU reports no memory."""
    if est is None:
        return None
    free, total = [], []
    for slot in fit.slots:
        info = ledger.nodes[slot.node]
        for g in slot.gpus:
            if g not in info.memory:
                return None
            free.append(info.memory[g])
            total.append(info.total.get(g, info.memory[g]))
    kv = min(free) * MiB - est.weightsBytes - est.overheadBytes
    if kv <= 0:
        return None
    return KVBudget(gpuMiB=min(total), freeMiB=min(free), bytes=kv, tokens=kv // max(1, est.kvBytesPerToken),
                    modelContext=est.maxContext)
