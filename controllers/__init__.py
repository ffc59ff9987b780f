"""The reconcilers, one module per controller; ``ALL`` lists their classes.

`llmgw controller-manager` runs every class in ``ALL`` (see
llmgw/runtime/controller.py for the interface), in this order.
"""
from __future__ import annotations

from controllers.drain import DrainController
from controllers.gc import GarbageCollector
from controllers.model import ModelController
from controllers.nodelifecycle import NodeLifecycleController
from controllers.replica import ReplicaController
from controllers.scheduler import SchedulerController

ALL: list[type] = [ModelController, ReplicaController, SchedulerController, NodeLifecycleController,
                   DrainController, GarbageCollector]
