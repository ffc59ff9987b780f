"""`control_plane(store, ...)`: FakeAgents + a Manager running the model and replica
controllers and the FirstFitPlacer (or `placer=`, e.g. the real scheduler), plus
any `extra` controllers, for controller tests."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from controllers.model import ModelController
from controllers.replica import ReplicaController
from controllers.settings import ControllerSettings
from llmgw.api.types import Replica
from llmgw.runtime.manager import Manager
from tests.helpers.fake_agents import FakeAgents
from tests.helpers.placer import FirstFitPlacer

FAST = ControllerSettings(lease_seconds=2, node_grace=1.0, rebuild_backoff_base=0.5, rebuild_backoff_max=4.0)


@dataclass
class ControlPlane:
    store: Any
    agents: FakeAgents
    manager: Manager
    placer: Any

    @property
    def cache(self):
        return self.manager.cache

    def replicas(self, model: str) -> list:
        return [r for r in self.cache.index(Replica, "model", model) if r.metadata.deletionTimestamp is None]

    def events(self, reason: str, name: str | None = None) -> list:
        return self.manager.events.find(name=name, reason=reason)


@contextlib.asynccontextmanager
async def control_plane(store, nodes=("n1", "n2", "n3"), *, gpus: int = 2, fabric: str | None = "fab-a",
                        settings: dict | None = None, placer: Any = None, extra: tuple = ()):
    """`settings`: what differs from FAST, for the manager and the replica controller (`extra` and
    `placer` controllers are built with their own)."""
    agents = await FakeAgents(store, nodes, gpus=gpus, fabric=fabric).start()
    placer = placer or FirstFitPlacer()
    fast = ControllerSettings(**FAST.model_dump() | (settings or {}))   # validated: a misspelt name fails
    manager = Manager(store, [ModelController(), ReplicaController(fast), placer, *extra], identity="test",
                      settings=fast)
    task = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(manager.leading.wait(), 60)
        yield ControlPlane(store, agents, manager, placer)
    finally:
        await manager.stop()
        task.cancel()
        await agents.stop()


