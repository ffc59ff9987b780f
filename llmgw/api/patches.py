"""Typed status patches: what a controller asks ``patch_status`` to change, per kind.

A patch names status fields by their wire names. The store replaces each field
the patch gives and merges ``conditions`` by type: a condition given replaces
the one of its type (its lastTransitionTime moves only when its status does),
the others stay. Values are JSON values (a timestamp is an ISO 8601 string), so
a patch goes over the REST API as it is. These are TypedDicts: mypy checks the
field names and their types, and at run time a patch is a plain dict, built
without a model or a validation (the store validates the merged status once).

Each mirrors its status model in llmgw.api.types (tests/api/test_api_patches.py
holds them to it); a field a controller does not patch may be left out. (No
``from __future__ import annotations`` here: TypedDict reads NotRequired only
from evaluated annotations.)
"""
from typing import NotRequired, TypedDict

from llmgw.api.meta import ConditionStatus
from llmgw.api.types import DrainPhase, ReplicaPhase


class ConditionPatch(TypedDict):
    type: str
    status: ConditionStatus
    reason: NotRequired[str]
    message: NotRequired[str]
    observedGeneration: NotRequired[int]


class DrainStatusPatch(TypedDict):
    phase: DrainPhase
    remaining: int
    current: str | None
    message: str


class NodeStatusPatch(TypedDict, total=False):
    conditions: list[ConditionPatch]
    drain: DrainStatusPatch | None


class MemoryEstimatePatch(TypedDict):
    tp: int
    pp: int
    weightsBytes: int
    kvBytesPerToken: int
    overheadBytes: int
    minContext: int
    neededBytes: int
    maxContext: int | None


class ProfileFitPatch(TypedDict):
    profile: int
    estimate: MemoryEstimatePatch | None
    contextTokens: int | None
    message: str


class ModelStatusPatch(TypedDict, total=False):
    observedGeneration: int
    desiredReplicas: int | None
    replicas: int
    readyReplicas: int
    updatedReplicas: int
    templateHash: str | None
    conditions: list[ConditionPatch]
    fit: list["ProfileFitPatch"]


class ReplicaStatusPatch(TypedDict, total=False):
    phase: ReplicaPhase
    endpoint: str | None
    kvEvents: str | None
    kvReplay: str | None
    message: str
    restarts: int
    consecutiveFailures: int
    backoffUntil: str | None
    conditions: list[ConditionPatch]


class InventoryEntryPatch(TypedDict):
    kind: str
    name: str


class GitSourceStatusPatch(TypedDict, total=False):
    observedGeneration: int
    lastAppliedRevision: str | None
    lastAttemptedRevision: str | None
    inventory: list[InventoryEntryPatch]
    lastHandledReconcileAt: str | None
    conditions: list[ConditionPatch]


class AdapterPendingPatch(TypedDict):
    replica: str
    reason: str
    message: str


class AdapterStatusPatch(TypedDict, total=False):
    observedGeneration: int
    placement: list[str]
    resident: list[str]
    pending: list[AdapterPendingPatch]
    conditions: list[ConditionPatch]
