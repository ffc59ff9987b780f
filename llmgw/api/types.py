"""The four kinds: Node, Model, Replica, Shard (see DESIGN.md, "Objects")."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from llmgw.api.flags import reserved_flag
from llmgw.api.meta import API_VERSION, Condition, DNSLabel, ObjectMeta, Strict

Engine = Literal["vllm", "sglang", "llamacpp", "sim"]
LaunchMode = Literal["mp", "ray"]


class Object(Strict):
    """Common shape: apiVersion, kind, metadata, spec, status."""

    kind_plural: ClassVar[str]
    apiVersion: Literal["llmgw.io/v1"] = API_VERSION
    metadata: ObjectMeta
    # The store revision this copy reflects: the later of its spec's and its status's
    # last writes, set by llmgw.store. Not serialised. resourceVersion alone cannot
    # order two copies: a status write leaves it unchanged.
    _revision: int = PrivateAttr(default=0)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def revision(self) -> int:
        """The store revision this copy reflects (resourceVersion when not known)."""
        return self._revision or self.metadata.resourceVersion or 0

    def at_revision(self, revision: int) -> "Object":
        """Record the store revision this copy reflects; returns self."""
        self._revision = revision
        return self


# --------------------------------------------------------------------- Node

class GPU(Strict):
    index: int
    uuid: str | None = None
    name: str | None = None
    memoryMiB: int | None = None
    computeCap: str | None = None
    pciBusId: str | None = None


class Adapter(Strict):
    name: str
    port: int = 1
    state: str = ""
    linkLayer: str = ""
    rate: str = ""


class Fabric(Strict):
    name: DNSLabel
    adapters: list[Adapter] = Field(default_factory=list)


class EngineInfo(Strict):
    name: str
    path: str
    version: str | None = None


class PortRange(Strict):
    first: int = Field(30000, ge=1, le=65535)
    last: int = Field(32767, ge=1, le=65535)


class DrainStatus(Strict):
    phase: Literal["Draining", "Drained", "Stuck"] = "Draining"
    remaining: int = 0
    current: str | None = None
    message: str = ""


class NodeSpec(Strict):
    unschedulable: bool = False
    drain: bool = False


class NodeStatus(Strict):
    observedGeneration: int = 0
    addresses: list[str] = Field(default_factory=list)
    gpus: list[GPU] = Field(default_factory=list)
    driverVersion: str | None = None
    fabrics: list[Fabric] = Field(default_factory=list)
    engines: list[EngineInfo] = Field(default_factory=list)
    portRange: PortRange = Field(default_factory=PortRange)
    conditions: list[Condition] = Field(default_factory=list)
    drain: DrainStatus | None = None
    agentVersion: str | None = None


class Node(Object):
    kind_plural: ClassVar[str] = "nodes"
    kind: Literal["Node"] = "Node"
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)


# -------------------------------------------------------------------- Model

class Profile(Strict):
    engine: Engine
    launchMode: LaunchMode | None = None
    nodes: int = Field(1, ge=1)
    gpusPerNode: int = Field(1, ge=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rules(self) -> "Profile":
        if self.launchMode is not None and self.engine != "vllm":
            raise ValueError(f"launchMode is only for engine vllm, not {self.engine}")
        if self.engine == "llamacpp" and self.nodes != 1:
            raise ValueError("engine llamacpp is single-node: nodes must be 1")
        for arg in self.args:
            hit = reserved_flag(self.engine, arg)
            if hit:
                flag, why = hit
                raise ValueError(f"args may not set {flag}: {why}")
        return self

    @property
    def launch_mode(self) -> LaunchMode | None:
        """The effective launch mode: vLLM defaults to mp."""
        return self.launchMode or ("mp" if self.engine == "vllm" else None)


class UpdateStrategy(Strict):
    maxSurge: int = Field(1, ge=0)
    maxUnavailable: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _progress(self) -> "UpdateStrategy":
        if self.maxSurge == 0 and self.maxUnavailable == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0")
        return self


class RoutingSpec(Strict):
    """How the gateway picks one of a model's replicas for a request (docs/gateway.md, Routing)."""

    policy: Literal["least-outstanding", "prefix-hash", "prefix-score"] = Field(
        "least-outstanding",
        description="least-outstanding: fewest requests in flight at this gateway. prefix-hash: "
                    "consistent hashing of the prompt's prefix (or session) with bounded loads; "
                    "gateways agree without sharing state. prefix-score: a prefix index kept in the "
                    "gateway weighed against load, within the same load bound.")
    prefixBytes: int = Field(
        2048, ge=64, le=65536,
        description="characters of the rendered prompt that make its prefix key")
    loadBound: float = Field(
        1.25, ge=1.0, le=10.0,
        description="no replica is given a request that would put it past loadBound x the "
                    "average requests in flight (prefix-hash and prefix-score)")
    indexBytes: int = Field(
        8 * 1024 * 1024, ge=65536,
        description="memory bound of prefix-score's prefix index in this gateway, per model")


class ModelSpec(Strict):
    replicas: int = Field(1, ge=0)
    aliases: list[DNSLabel] = Field(default_factory=list)
    source: str | None = None
    profiles: list[Profile] = Field(min_length=1)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    update: UpdateStrategy = Field(default_factory=UpdateStrategy)
    # How long a replica may stay unplaced before the next profile is tried.
    placementDeadlineSeconds: int = Field(60, ge=1)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)


class ModelStatus(Strict):
    observedGeneration: int = 0
    replicas: int = 0
    readyReplicas: int = 0
    updatedReplicas: int = 0
    templateHash: str | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Model(Object):
    kind_plural: ClassVar[str] = "models"
    kind: Literal["Model"] = "Model"
    spec: ModelSpec
    status: ModelStatus = Field(default_factory=ModelStatus)

    @property
    def served_names(self) -> list[str]:
        return [self.metadata.name, *self.spec.aliases]


def template_hash(spec: ModelSpec, profile_index: int = 0) -> str:
    """Hash of what a replica runs; replicas with an older hash get rolled."""
    template = {
        "source": spec.source,
        "aliases": spec.aliases,
        "nodeSelector": spec.nodeSelector,
        "profiles": [p.model_dump(mode="json") for p in spec.profiles],
    }
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:10]


# ------------------------------------------------------------------ Replica

ReplicaPhase = Literal["Pending", "Scheduled", "Starting", "Ready", "Failed", "Terminating"]


class Placement(Strict):
    rank: int = Field(ge=0)
    node: str
    gpus: list[int] = Field(default_factory=list)
    fabric: str | None = None


class ReplicaSpec(Strict):
    model: DNSLabel
    templateHash: str
    profileIndex: int = 0
    profile: Profile
    source: str | None = None
    servedModelNames: list[str] = Field(default_factory=list)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    placement: list[Placement] = Field(default_factory=list)


class ReplicaStatus(Strict):
    observedGeneration: int = 0
    phase: ReplicaPhase = "Pending"
    endpoint: str | None = None
    message: str = ""
    restarts: int = 0
    # Failures in a row: back to 1 when the replica had stayed Ready for the controller's
    # backoff-reset period (10 min by default). This, not ``restarts``, sets the crash-loop delay.
    consecutiveFailures: int = 0
    backoffUntil: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Replica(Object):
    kind_plural: ClassVar[str] = "replicas"
    kind: Literal["Replica"] = "Replica"
    spec: ReplicaSpec
    status: ReplicaStatus = Field(default_factory=ReplicaStatus)


# -------------------------------------------------------------------- Shard

ShardPhase = Literal["Pending", "Starting", "Running", "Ready", "Failed", "Stopping", "Stopped"]


class ShardPorts(Strict):
    serve: int = Field(ge=1, le=65535)
    distInit: int = Field(ge=1, le=65535)


class ShardSpec(Strict):
    replica: DNSLabel
    model: DNSLabel
    node: DNSLabel
    rank: int = Field(ge=0)
    worldSize: int = Field(ge=1)
    gpus: list[int] = Field(default_factory=list)
    ports: ShardPorts
    headAddress: str
    fabric: str | None = None
    engine: Engine
    launchMode: LaunchMode | None = None
    gpusPerNode: int = Field(1, ge=1)
    source: str | None = None
    servedModelNames: list[str] = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class ShardStatus(Strict):
    observedGeneration: int = 0
    phase: ShardPhase = "Pending"
    pid: int | None = None
    exitCode: int | None = None
    message: str = ""
    logTail: list[str] = Field(default_factory=list)
    startedAt: datetime | None = None
    phaseTime: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Shard(Object):
    kind_plural: ClassVar[str] = "shards"
    kind: Literal["Shard"] = "Shard"
    spec: ShardSpec
    status: ShardStatus = Field(default_factory=ShardStatus)


# --------------------------------------------------------------- registry

KINDS: dict[str, type[Object]] = {"nodes": Node, "models": Model, "replicas": Replica, "shards": Shard}
KIND_BY_NAME: dict[str, type[Object]] = {cls.model_fields["kind"].default: cls for cls in KINDS.values()}

_KIND_ALIASES = {
    "node": "nodes", "nodes": "nodes", "no": "nodes",
    "model": "models", "models": "models", "mo": "models",
    "replica": "replicas", "replicas": "replicas", "rep": "replicas",
    "shard": "shards", "shards": "shards", "sh": "shards",
}


def resolve_kind(word: str) -> str:
    """The plural kind for a singular, plural, short or Kind-cased word."""
    try:
        return _KIND_ALIASES[word.lower()]
    except KeyError:
        raise ValueError(
            f"unknown kind {word!r}: use one of node/nodes/no, model/models/mo, "
            "replica/replicas/rep, shard/shards/sh"
        ) from None
