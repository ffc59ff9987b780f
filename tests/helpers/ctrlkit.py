"""Builders and a running Manager for the scheduler/drain/node-lifecycle/GC tests.

Objects are written through the real store; nothing is mocked.
`ReadyPlayer` stands in for the replica controller and the agents where a
test only needs "a placed replica becomes Ready": it sets phase Ready on
every placed replica (unless `hold` is set) and nothing else. `ReplicaWatch`
follows a model's replicas through etcd's watch, for "never fewer than N
Ready" (make-before-break) assertions.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from llmgw.api import Model, Node, ObjectMeta, OwnerReference, Replica, Shard
from llmgw.api.errors import NotFound
from llmgw.api.wellknown import MODEL_LABEL
from llmgw.runtime.controller import Controller, Result
from llmgw.runtime.manager import Manager
from llmgw.runtime.settings import ManagerSettings
from llmgw.store import keys


def node(name: str, gpus: int = 8, fabric: str | None = None, engines=("sim",), labels=None,
         ready: bool = True, unschedulable: bool = False) -> Node:
    return Node.model_validate({
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "gpus": [{"index": i} for i in range(gpus)],
            "fabrics": [{"name": fabric}] if fabric else [],
            "engines": [{"name": e, "path": f"/usr/bin/{e}"} for e in engines],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    })


def model(name: str, replicas: int = 1, gpus: int = 1, nodes: int = 1) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": replicas, "profiles": [{"engine": "sim", "nodes": nodes, "gpusPerNode": gpus}]}})


def replica(name: str, model_name: str, *, gpus: int = 1, nodes: int = 1, owner: Model | None = None,
            placement: list[dict] | None = None, finalizers=(), selector=None) -> Replica:
    meta: dict[str, Any] = {"name": name, "labels": {MODEL_LABEL: model_name}, "finalizers": list(finalizers)}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "Model", "name": owner.metadata.name, "uid": owner.metadata.uid}]
    return Replica.model_validate({"metadata": meta, "spec": {
        "model": model_name, "templateHash": "t0",
        "profile": {"engine": "sim", "nodes": nodes, "gpusPerNode": gpus},
        "nodeSelector": selector or {}, "placement": placement or []}})


def shard(name: str, rep: Replica, node_name: str) -> Shard:
    return Shard(
        metadata=ObjectMeta(name=name, ownerReferences=[
            OwnerReference(kind="Replica", name=rep.metadata.name, uid=rep.metadata.uid or "none")]),
        spec={"replica": rep.metadata.name, "model": rep.spec.model, "node": node_name, "rank": 0,
              "worldSize": 1, "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "127.0.0.1",
              "engine": "sim", "servedModelNames": [rep.spec.model]},
    )


async def heartbeat(store, node_name: str) -> None:
    """A live heartbeat key (no lease: tests end silence by deleting it)."""
    await store.kv.put(keys.heartbeat_key(node_name), b"{}")


async def silence(store, node_name: str) -> None:
    await store.kv.delete(keys.heartbeat_key(node_name))


async def get_or_none(store, kind, name: str):
    try:
        return await store.get(kind, name)
    except NotFound:
        return None


@contextlib.asynccontextmanager
async def running(store, controllers: list[Controller]):
    """A Manager leading with `controllers` (each built with the settings it reads)."""
    m = Manager(store, controllers, identity="test", settings=ManagerSettings(lease_seconds=5))
    task = asyncio.create_task(m.run())
    try:
        await asyncio.wait_for(m.leading.wait(), 30)
        yield m
    finally:
        # Bounded: a watch stream that ignores cancellation must not hang the test
        # (seen with aetcd: the informer task stays "cancelling").
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(m.stop(), 10)
        task.cancel()


class ReadyPlayer(Controller):
    """Plays the replica controller + agents: a placed replica becomes Ready."""

    name = "ready-player"
    watches = ("replicas",)

    def __init__(self) -> None:
        self.hold = False

    async def reconcile(self, key: str) -> Result | None:
        rep = self.ctx.cache.get(Replica, key)
        if rep is None or not rep.spec.placement or rep.status.phase == "Ready" \
                or rep.metadata.deletionTimestamp is not None:
            return None
        if self.hold:
            return Result(requeue_after=0.1)
        self.ctx.cache.assume(await self.ctx.store.patch_status(Replica, key, {"phase": "Ready"}))
        return None


class ReplicaWatch:
    """Follows every replica change from a revision on: names ever seen, least Ready count."""

    def __init__(self, store, model_name: str, ready: dict[str, bool], rev: int):
        self.store, self.model, self.rev = store, model_name, rev
        self.ready = dict(ready)           # name -> Ready and not being deleted
        self.seen = set(ready)
        self.least = sum(ready.values())
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        async for ev in self.store.watch(Replica, from_revision=self.rev + 1):
            r = ev.object
            if r.spec.model != self.model:
                continue
            self.seen.add(r.metadata.name)
            if ev.type == "DELETED":
                self.ready.pop(r.metadata.name, None)
            else:
                self.ready[r.metadata.name] = (r.status.phase == "Ready" and r.metadata.deletionTimestamp is None)
            self.least = min(self.least, sum(self.ready.values()))

    async def stop(self):
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
