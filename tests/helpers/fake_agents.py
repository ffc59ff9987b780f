"""FakeAgents: plays the node agents of many nodes through the store, in one process.

Used by controller tests and by the control-plane benchmark ("hollow nodes").
Efficient for ~1000 nodes: one watch over every shard (not one per node), one
etcd lease for all heartbeat keys, status writes by a few workers.

    agents = FakeAgents(store, ["n1", "n2"], gpus=8, fabric="fab-a")
    await agents.start()          # registers Nodes (Ready), heartbeats, watches shards
    ...                           # shards on these nodes go Pending -> Starting -> Ready
    agents.hold_replicas.add("m-abc-xyz12")   # its shards stay Starting until released
    agents.hold = lambda shard: True          # or any predicate on the Shard
    await agents.release("m-abc-xyz12")       # release(None): everything held
    agents.fail_replicas.add(...)             # its shards go Failed instead of Ready
    await agents.fail_shard("m-abc-xyz12-0")  # a running shard crashes
    await agents.silence("n2")                # agent dies: heartbeat key gone, shards untouched
    await agents.set_node_ready("n2", False)  # what node lifecycle would write
    await agents.stop()

Deleted shards (deletionTimestamp set) on live nodes are confirmed with phase
Stopped, as a real agent does after stopping the process.
"""
from __future__ import annotations

import asyncio
import json
from typing import Iterable

from llmgw.api import Condition, Node, ObjectMeta, now
from llmgw.api.errors import NotFound
from llmgw.api.types import GPU, Adapter, EngineInfo, Fabric, NodeStatus, Shard
from llmgw.runtime.workqueue import WorkQueue
from llmgw.store import StoreError
from llmgw.store.errors import Compacted, StoreUnavailable

ENGINES = ("sim", "vllm", "sglang", "llamacpp")


def node_address(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def make_node(name: str, index: int, *, gpus: int = 8, fabric: str | None = None,
              engines: Iterable[str] = ENGINES, labels: dict[str, str] | None = None) -> Node:
    return Node(
        metadata=ObjectMeta(name=name, labels=dict(labels or {})),
        status=NodeStatus(
            addresses=[node_address(index)],
            gpus=[GPU(index=g, uuid=f"GPU-{name}-{g}", name="NVIDIA H100 80GB HBM3", memoryMiB=81559)
                  for g in range(gpus)],
            driverVersion="570.86.15",
            fabrics=[Fabric(name=fabric, adapters=[Adapter(name="mlx5_0", state="ACTIVE",
                                                           linkLayer="InfiniBand", rate="400 Gb/sec (4X NDR)")])]
            if fabric else [],
            engines=[EngineInfo(name=e, path=f"/usr/bin/{e}", version="fake") for e in engines],
            conditions=[Condition(type="Ready", status="True", reason="AgentReady",
                                  message="fake agent", lastTransitionTime=now())],
            agentVersion="fake",
        ),
    )


class FakeAgents:
    def __init__(self, store, nodes: Iterable[str] | int = (), *, gpus: int = 8, fabric: str | None = None,
                 engines: Iterable[str] = ENGINES, labels: dict[str, str] | None = None,
                 heartbeat_ttl: int = 15, workers: int = 8):
        self.store = store
        names = [f"node-{i}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        self.nodes: dict[str, Node] = {}
        self._specs = [(n, dict(gpus=gpus, fabric=fabric, engines=tuple(engines), labels=labels)) for n in names]
        self._index = 0
        self.heartbeat_ttl = heartbeat_ttl
        self.dead: set[str] = set()                 # silenced agents: they do nothing
        self.hold_replicas: set[str] = set()        # shards stay Starting
        self.hold = lambda shard: shard.spec.replica in self.hold_replicas   # replaceable predicate
        self.fail_replicas: set[str] = set()        # shards go Failed instead of Ready
        self.shards: dict[str, Shard] = {}          # latest seen Shard by name
        self.transitions: list[tuple[str, str]] = []  # (shard, phase) written, in order
        self._queue = WorkQueue()
        self._workers = workers
        self._tasks: list[asyncio.Task] = []
        self._lease: int | None = None
        self.synced = asyncio.Event()

    # --------------------------------------------------------------- nodes
    async def start(self) -> "FakeAgents":
        self._lease = await self.store.leases.grant(self.heartbeat_ttl)
        specs, self._specs = self._specs, []
        for i in range(0, len(specs), 64):
            await asyncio.gather(*(self.add_node(n, **kw) for n, kw in specs[i:i + 64]))
        self._tasks.append(asyncio.create_task(self._keepalive()))
        self._tasks.append(asyncio.create_task(self._watch()))
        self._tasks += [asyncio.create_task(self._work()) for _ in range(self._workers)]
        await asyncio.wait_for(self.synced.wait(), 60)
        return self

    async def add_node(self, name: str, *, gpus: int = 8, fabric: str | None = None,
                       engines: Iterable[str] = ENGINES, labels: dict[str, str] | None = None) -> Node:
        self._index += 1
        node = make_node(name, self._index, gpus=gpus, fabric=fabric, engines=engines, labels=labels)
        node = await self.store.create(node)
        self.nodes[name] = node
        await self._put_heartbeat(name)
        return node

    async def _put_heartbeat(self, name: str) -> None:
        value = json.dumps({"node": name, "since": now().isoformat()}).encode()
        await self.store.kv.put(f"/llmgw/heartbeat/{name}", value, lease=self._lease)

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(max(0.5, self.heartbeat_ttl / 3))
            try:
                if not await self.store.leases.refresh(self._lease):
                    self._lease = await self.store.leases.grant(self.heartbeat_ttl)
                    for name in self.nodes:
                        if name not in self.dead:
                            await self._put_heartbeat(name)
            except StoreError:
                pass

    async def silence(self, name: str) -> None:
        """The agent dies: its heartbeat key goes and its shards are left as they are."""
        self.dead.add(name)
        await self.store.kv.delete(f"/llmgw/heartbeat/{name}")

    async def revive(self, name: str) -> None:
        self.dead.discard(name)
        await self._put_heartbeat(name)
        for shard in list(self.shards.values()):
            if shard.spec.node == name:
                self._queue.add(shard.metadata.name)

    async def set_node_ready(self, name: str, ready: bool, reason: str = "") -> None:
        cond = {"type": "Ready", "status": "True" if ready else "False",
                "reason": reason or ("AgentReady" if ready else "NodeStatusUnknown"), "message": ""}
        await self.store.patch_status(Node, name, {"conditions": [cond]})

    # -------------------------------------------------------------- shards
    async def release(self, replica: str | None = None) -> None:
        """Let held shards (of one replica, or all with None) become Ready."""
        if replica is None:
            self.hold_replicas.clear()
            self.hold = lambda shard: shard.spec.replica in self.hold_replicas
        else:
            self.hold_replicas.discard(replica)
        for shard in list(self.shards.values()):
            if replica is None or shard.spec.replica == replica:
                self._queue.add(shard.metadata.name)

    async def fail_shard(self, name: str, message: str = "engine exited with code 1", exit_code: int = 1,
                         log_tail: list[str] | None = None) -> None:
        shard = self.shards[name]
        await self._set_phase(shard, "Failed", exitCode=exit_code, message=message, logTail=log_tail or [])

    def phase(self, name: str) -> str | None:
        s = self.shards.get(name)
        return s.status.phase if s is not None else None

    async def _watch(self) -> None:
        rev = 0
        while True:
            try:
                if not self.synced.is_set() or rev == 0:
                    items, rev = await self.store.list(Shard)
                    for s in items:
                        self._seen(s)
                    self.synced.set()
                # held: the echo of a status this process wrote is its copy, not decoded again
                async for ev in self.store.watch(Shard, from_revision=rev + 1, held=self.shards.get):
                    rev = ev.revision
                    if ev.type == "DELETED":
                        self.shards.pop(ev.object.metadata.name, None)
                    else:
                        self._seen(ev.object)
            except (Compacted, StoreUnavailable):
                rev = 0
                await asyncio.sleep(0.2)

    def _seen(self, shard) -> None:
        self.shards[shard.metadata.name] = shard
        if shard.spec.node in self.nodes:
            self._queue.add(shard.metadata.name)

    async def _work(self) -> None:
        while (name := await self._queue.get()) is not None:
            try:
                await self._step(name)
                self._queue.forget(name)
            except NotFound:
                pass
            except StoreError:
                self._queue.add_rate_limited(name)
            finally:
                self._queue.done(name)

    async def _step(self, name: str) -> None:
        shard = self.shards.get(name)
        if shard is None or shard.spec.node in self.dead:
            return
        phase = shard.status.phase
        if shard.metadata.deletionTimestamp is not None:
            if phase != "Stopped":
                await self._set_phase(shard, "Stopped", exitCode=0, message="stopped")
            return
        if phase == "Pending":
            await self._set_phase(shard, "Starting", pid=10000 + hash(name) % 50000, startedAt=now().isoformat())
            return
        if phase == "Starting" and not self.hold(shard):
            if shard.spec.replica in self.fail_replicas:
                await self._set_phase(shard, "Failed", exitCode=1, message="engine exited with code 1")
            else:
                await self._set_phase(shard, "Ready", message="serving")

    async def _set_phase(self, shard, phase: str, **fields) -> None:
        patch = {"phase": phase, "phaseTime": now().isoformat(), **fields}
        new = await self.store.patch_status(Shard, shard.metadata.name, patch, current=shard)
        self.transitions.append((shard.metadata.name, phase))
        cur = self.shards.get(shard.metadata.name)
        if cur is not None and cur.metadata.resourceVersion == new.metadata.resourceVersion:
            self.shards[shard.metadata.name] = new

    async def stop(self) -> None:
        self._queue.shutdown()
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        self._tasks = []   # heartbeat keys expire with their lease
