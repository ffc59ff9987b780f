"""The reconcilers, one module per controller; ``ALL`` lists their classes.

`llmgw controller-manager` runs every class in ``ALL`` (see
llmgw/runtime/controller.py for the interface).  One line per controller:
each engineer edits only the lines of their own controllers.
"""
from __future__ import annotations

ALL: list[type] = []

from controllers.model import ModelController; ALL.append(ModelController)  # noqa: E402,E702
from controllers.replica import ReplicaController; ALL.append(ReplicaController)  # noqa: E402,E702
from controllers.scheduler import SchedulerController; ALL.append(SchedulerController)  # noqa: E402,E702
from controllers.nodelifecycle import NodeLifecycleController; ALL.append(NodeLifecycleController)  # noqa: E402,E702
from controllers.drain import DrainController; ALL.append(DrainController)  # noqa: E402,E702
from controllers.gc import GarbageCollector; ALL.append(GarbageCollector)  # noqa: E402,E702
