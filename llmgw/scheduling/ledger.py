"""The scheduler's incremental view of the cluster.

Every replica that still exists (deleting or not) holds the GPUs and ports of
its placement until its object is gone; so does a placement the scheduler has
*assumed* but whose write it has not yet seen come back; and so does every
Shard that exists, terminating ones included, whatever became of its replica's
placement or object: a shard is released only once its agent confirmed its
engine gone (or its Node was deleted), and until then the engine may hold
them. A replica's booking is its placement plus the slots of its shards
that the placement does not cover. Ports in the node's ``status.foreignPorts``
(held by other processes) are not counted as the node's. The ledger keeps, per
node, the used GPU indices, the ports its shards take (ShardPorts.needed: serve and
dist-init on rank 0, two more where the replica publishes KV events, serve alone
on the others; a shard outside its placement, the ports it has), and per model
the ranks on each node. Nodes are
bucketed by their number of free GPUs, globally and per fabric, so that a
placement walks from the tightest fitting bucket up instead of scanning every
replica or node (see placer.py).

Pure data structure: no etcd, no asyncio. Fed by the scheduler controller from
its cache (observe_node / observe_replica / observe_shard / forget_*).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from llmgw.api import Node, Replica, Shard, ShardPorts, condition_true


@dataclass(frozen=True)
class NodeInfo:
    """The scheduling facts of one Node, frozen at the time it was observed."""

    name: str
    ready: bool = True
    cordoned: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    engines: frozenset[str] = frozenset()   # the names in its status.engines
    fabrics: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    ports: int = 2768
    weights: frozenset[str] = frozenset()   # the digests in its weights cache (status.weights)
    # GPU index -> MiB free (memory.free, else memory.total) for the GPUs that report it
    memory: dict[int, int] = field(default_factory=dict)
    total: dict[int, int] = field(default_factory=dict)     # GPU index -> MiB in all (memory.total)

    @classmethod
    def from_node(cls, node: Node) -> "NodeInfo":
        st = node.status
        rng = st.portRange
        foreign = {p for p in st.foreignPorts if rng.first <= p <= rng.last}
        return cls(
            name=node.metadata.name,
            ready=condition_true(st.conditions, "Ready"),
            cordoned=node.spec.unschedulable or node.spec.drain,
            labels=dict(node.metadata.labels),
            engines=frozenset(e.name for e in st.engines),
            fabrics=tuple(f.name for f in st.fabrics),
            gpus=tuple(sorted({g.index for g in st.gpus})),
            ports=max(0, rng.last - rng.first + 1 - len(foreign)),
            weights=frozenset(m.digest for m in st.weights.models) if st.weights else frozenset(),
            memory={g.index: mib for g in st.gpus
                    if (mib := g.memoryFreeMiB if g.memoryFreeMiB is not None else g.memoryMiB) is not None},
            total={g.index: g.memoryMiB for g in st.gpus if g.memoryMiB is not None},
        )


# A placement as the ledger stores it: ((node, (gpu, ...)), ...) in rank order.
Slots = tuple[tuple[str, tuple[int, ...]], ...]


def slots_of(replica: Replica) -> Slots:
    ranks = sorted(replica.spec.placement, key=lambda p: p.rank)
    return tuple((p.node, tuple(p.gpus)) for p in ranks)


class Ledger:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.holders: dict[str, set[str]] = {}     # weights digest -> the nodes whose cache has it
        # node -> GPU index -> holders (more than one only if placements written
        # elsewhere overlap; a count keeps one release from freeing the other)
        self.used: dict[str, dict[int, int]] = {}
        self.ports: dict[str, int] = {}              # node -> ports its booked shards take
        self.kv_events: set[str] = set()             # replicas whose rank 0 publishes KV events
        self.model_ranks: dict[str, dict[str, int]] = {}   # model -> node -> ranks
        self.replicas: dict[str, tuple[str, Slots]] = {}   # replica -> (model, slots) booked
        self.booked_ports: dict[str, tuple[int, ...]] = {}  # replica -> ports of each of its booked slots
        self.placements: dict[str, tuple[str, Slots]] = {}  # replica -> (model, its placement)
        # replica -> shard -> (model, node, gpus, ports it has) of every shard that exists
        self.shards: dict[str, dict[str, tuple[str, str, tuple[int, ...], int]]] = {}
        self.assumed: set[str] = set()
        # free-GPU buckets: free count -> ordered set of node names
        self.by_free: dict[int, dict[str, None]] = {}
        self.by_fabric_free: dict[str, dict[int, dict[str, None]]] = {}
        self._bucket: dict[str, int] = {}            # node -> its current free count

    # ------------------------------------------------------------ queries
    def free_gpus(self, node: str) -> list[int]:
        info = self.nodes.get(node)
        if info is None:
            return []
        used = self.used.get(node, ())
        return [i for i in info.gpus if i not in used]

    def free_count(self, node: str) -> int:
        return self._bucket.get(node, 0)

    def free_ports(self, node: str) -> int:
        info = self.nodes.get(node)
        return 0 if info is None else info.ports - self.ports.get(node, 0)

    # -------------------------------------------------------------- nodes
    def observe_node(self, node: Node | NodeInfo) -> bool:
        """Account a node as it is now; whether its scheduling facts changed."""
        info = node if isinstance(node, NodeInfo) else NodeInfo.from_node(node)
        old = self.nodes.get(info.name)
        if old == info:
            return False
        self._unbucket(info.name)
        self._unhold(old)
        self.nodes[info.name] = info
        self._rebucket(info.name)
        for digest in info.weights:
            self.holders.setdefault(digest, set()).add(info.name)
        return True

    def forget_node(self, name: str) -> None:
        self._unbucket(name)
        self._unhold(self.nodes.pop(name, None))

    def _unhold(self, info: NodeInfo | None) -> None:
        if info is None:
            return
        for digest in info.weights:
            held = self.holders.get(digest)
            if held is not None:
                held.discard(info.name)
                if not held:
                    del self.holders[digest]

    # ----------------------------------------------------------- replicas
    def observe_replica(self, replica: Replica) -> None:
        """Account a replica as the cache has it now."""
        name = replica.metadata.name
        slots = slots_of(replica)
        if not slots and name in self.assumed:
            # An older view of a replica we have just placed: keep our placement
            # until the write comes back or is refused (unassume).
            return
        self.assumed.discard(name)
        self._kv(name, replica.spec.kvEvents)
        self._place(name, replica.spec.model, slots)

    def forget_replica(self, name: str) -> None:
        """The replica object is gone: its GPUs and ports are free again, but for its shards."""
        self.assumed.discard(name)
        self._place(name, "", ())
        self.kv_events.discard(name)

    def assume(self, name: str, model: str, slots: Slots, kv_events: bool = False) -> None:
        """Book a placement before its write is confirmed (`kv_events`: its rank 0 publishes them)."""
        self.assumed.add(name)
        self._kv(name, kv_events)
        self._place(name, model, slots)

    def unassume(self, name: str) -> None:
        """The write of an assumed placement failed: release it."""
        if name in self.assumed:
            self.assumed.discard(name)
            self._place(name, "", ())

    # ------------------------------------------------------------- shards
    def observe_shard(self, shard: Shard) -> bool:
        """Account a shard that exists; True when that changed a booking."""
        spec = shard.spec
        held = (spec.model, spec.node, tuple(spec.gpus), len(spec.ports.own(spec.rank)))
        per = self.shards.setdefault(spec.replica, {})
        if per.get(shard.metadata.name) == held:
            return False
        per[shard.metadata.name] = held
        return self._book(spec.replica)

    def forget_shard(self, name: str, replica: str) -> bool:
        """The shard object is gone; True when that freed anything."""
        per = self.shards.get(replica, {})
        if per.pop(name, None) is None:
            return False
        if not per:
            del self.shards[replica]
        return self._book(replica)

    # ----------------------------------------------------------- internal
    def _kv(self, name: str, kv_events: bool) -> None:
        if kv_events:
            self.kv_events.add(name)
        else:
            self.kv_events.discard(name)

    def _place(self, name: str, model: str, slots: Slots) -> None:
        if slots:
            self.placements[name] = (model, slots)
        else:
            self.placements.pop(name, None)
        self._book(name)

    def _book(self, name: str) -> bool:
        """Book the replica's placement plus any of its shards the placement does not cover."""
        model, slots = self.placements.get(name, ("", ()))
        ports = tuple(ShardPorts.needed(rank, name in self.kv_events) for rank in range(len(slots)))
        for shard_model, node, gpus, held in self.shards.get(name, {}).values():
            if (node, gpus) not in slots:
                model, slots, ports = model or shard_model, slots + ((node, gpus),), ports + (held,)
        before = self.replicas.get(name), self.booked_ports.get(name)
        self._set(name, model, slots, ports)
        return (self.replicas.get(name), self.booked_ports.get(name)) != before

    def _set(self, name: str, model: str, slots: Slots, ports: tuple[int, ...]) -> None:
        old = self.replicas.get(name)
        if (old == (model, slots) and self.booked_ports.get(name) == ports) or (old is None and not slots):
            return
        touched: set[str] = set()
        if old is not None:
            old_model, old_slots = old
            for (node, gpus), n in zip(old_slots, self.booked_ports.pop(name), strict=True):
                used = self.used.get(node, {})
                for g in gpus:
                    if used.get(g, 0) <= 1:
                        used.pop(g, None)
                    else:
                        used[g] -= 1
                self.ports[node] = self.ports.get(node, n) - n
                per = self.model_ranks.get(old_model, {})
                per[node] = per.get(node, 1) - 1
                if per.get(node) == 0:
                    del per[node]
                touched.add(node)
            del self.replicas[name]
        if slots:
            self.replicas[name] = (model, slots)
            self.booked_ports[name] = ports
            per = self.model_ranks.setdefault(model, {})
            for (node, gpus), n in zip(slots, ports, strict=True):
                used = self.used.setdefault(node, {})
                for g in gpus:
                    used[g] = used.get(g, 0) + 1
                self.ports[node] = self.ports.get(node, 0) + n
                per[node] = per.get(node, 0) + 1
                touched.add(node)
        for node in touched:
            if node in self.nodes:
                self._unbucket(node)
                self._rebucket(node)

    def _unbucket(self, name: str) -> None:
        free = self._bucket.pop(name, None)
        if free is None:
            return
        self.by_free[free].pop(name, None)
        for fabric in self.nodes[name].fabrics:
            self.by_fabric_free[fabric][free].pop(name, None)

    def _rebucket(self, name: str) -> None:
        info = self.nodes[name]
        used = self.used.get(name, ())
        free = sum(1 for i in info.gpus if i not in used)
        self._bucket[name] = free
        self.by_free.setdefault(free, {})[name] = None
        for fabric in info.fabrics:
            self.by_fabric_free.setdefault(fabric, {}).setdefault(free, {})[name] = None

    def check(self) -> Iterable[str]:
        """Internal consistency problems (for tests): double-booked GPUs, stale buckets."""
        seen: dict[tuple[str, int], str] = {}
        for rname, (_, slots) in self.replicas.items():
            for node, gpus in slots:
                for g in gpus:
                    if (node, g) in seen:
                        yield f"GPU {node}/{g} booked by {seen[(node, g)]} and {rname}"
                    seen[(node, g)] = rname
        for node in self.nodes:
            if self.free_count(node) != len(self.free_gpus(node)):
                yield f"bucket of {node} is {self.free_count(node)}, free is {self.free_gpus(node)}"
