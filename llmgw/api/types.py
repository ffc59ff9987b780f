"""The kinds: Node, Model, Replica, Shard, ApiKey, GitSource, Role, RoleBinding, Adapter (LoraAdapter)
(docs/architecture.md, "Objects")."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import AfterValidator, Field, JsonValue, PrivateAttr, model_validator

from llmgw import routing
from llmgw.api import git
from llmgw.api.limits import (
    MAX_ADAPTER_SLOTS,
    MAX_AUTOSCALE_SECONDS,
    MAX_CONTEXT,
    MAX_GPUS_PER_NODE,
    MAX_KEY_LIMIT,
    MAX_NODES,
    MAX_PLACEMENT_DEADLINE_SECONDS,
    MAX_PORT,
    MAX_REPLICAS,
    MAX_TARGET_IN_FLIGHT,
)
from llmgw.api.meta import (
    API_VERSION,
    Bool,
    Condition,
    DNSLabel,
    EnvName,
    Int,
    LabelKey,
    LabelValue,
    ObjectMeta,
    OwnerReference,
    Strict,
    added,
)
from llmgw.api.secrets import check_secret_hash
from llmgw.api.selectors import Selector
from llmgw.api.sources import check_digest, parse_source
from llmgw.engines import rules
from llmgw.routing.precise_prefix import PrecisePrefix


# A name in the engines' registry (llmgw/engines/rules.py: each engine's module registers itself).
def _engine_schema(schema: dict[str, JsonValue]) -> None:
    names: list[JsonValue] = [*sorted(rules.RULES)]
    schema["enum"] = names


EngineName = Annotated[str, AfterValidator(rules.check_name), Field(json_schema_extra=_engine_schema)]
Port = Annotated[int, Field(strict=True, ge=1, le=MAX_PORT)]
Replicas = Annotated[int, Field(strict=True, ge=0, le=MAX_REPLICAS)]
NodeCount = Annotated[int, Field(strict=True, ge=1, le=MAX_NODES)]
GPUCount = Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS_PER_NODE)]
Rank = Annotated[int, Field(strict=True, ge=0, le=MAX_NODES - 1)]
DeadlineSeconds = Annotated[int, Field(strict=True, ge=1, le=MAX_PLACEMENT_DEADLINE_SECONDS)]
PrefixBytes = Annotated[int, Field(strict=True, ge=64, le=65536)]
IndexBytes = Annotated[int, Field(strict=True, ge=65536, le=1 << 40)]


def _check_source(value: str) -> str:
    parse_source(value)
    return value


# Weights: a path, hf://ORG/NAME[@REVISION] or http(s)://HOST/DIR/ (llmgw/api/sources.py); never
# something an engine's command line takes for a flag.
Source = Annotated[str, AfterValidator(_check_source)]
# The content digest of a pulled source (llmgw/weights/digest.py), pinned by a Model or an Adapter.
Digest = Annotated[str, AfterValidator(check_digest)]


def check_pulled_digest(source: str | None, digest: str | None) -> None:
    """A digest pins what an hf:// or http(s):// source resolves to; a path has none to pin."""
    if digest is not None and (source is None or parse_source(source) is None):
        raise ValueError("digest: pins the content of an hf:// or http(s):// source; a path is used as it is")

def _launch_mode_schema(schema: dict[str, JsonValue]) -> None:
    modes: list[JsonValue] = [*sorted({m for e in rules.RULES.values() for m in e.launch_modes})]
    schema["enum"] = modes


# One of an engine's launch modes (vLLM: mp, ray); which engine's, the Profile checks.
LaunchMode = Annotated[str, AfterValidator(rules.check_launch_mode), Field(json_schema_extra=_launch_mode_schema)]


SpecT = TypeVar("SpecT", bound=Strict)
StatusT = TypeVar("StatusT", bound=Strict)
Scope = Literal["Cluster", "Node"]


class Object(Strict, Generic[SpecT, StatusT]):
    """Common shape: apiVersion, kind, metadata, spec, status.

    A kind is a subclass ``Object[ItsSpec, ItsStatus]`` that states its class facts:
    ``kind_plural`` (the name in keys, URLs and the CLI) and ``scope``: "Node" when
    the store files each object under the node it runs on (shards), else "Cluster".
    """

    kind_plural: ClassVar[str]
    scope: ClassVar[Scope] = "Cluster"
    apiVersion: Literal["llmgw.io/v1"] = API_VERSION
    kind: str  # each kind narrows it to its Literal name, so a document names what it is
    metadata: ObjectMeta
    spec: SpecT
    status: StatusT
    # The store revision this copy reflects: the later of its spec's and its status's
    # last writes, set by llmgw.store. Not serialised. resourceVersion alone cannot
    # order two copies: a status write leaves it unchanged.
    _revision: int = PrivateAttr(default=0)
    # The mod revision of the status key this copy's status was read at, set by llmgw.store:
    # 0 when there is no status key (a default status is not stored), -1 when not known. A
    # status patch of this copy is one compare-and-swap against it (Objects.patch_status).
    _status_revision: int = PrivateAttr(default=-1)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def revision(self) -> int:
        """The store revision this copy reflects (resourceVersion when not known)."""
        return self._revision or self.metadata.resourceVersion or 0

    def at_revision(self, revision: int, status_revision: int | None = None) -> Self:
        """Record the store revision this copy reflects (and, when given, its status key's
        mod revision); returns self."""
        self._revision = revision
        if status_revision is not None:
            self._status_revision = status_revision
        return self

    def owner_reference(self) -> OwnerReference:
        """A reference to this object as the owner of another; it must be stored (have a uid)."""
        if self.metadata.uid is None:
            raise ValueError(f"{self.kind} {self.name} has no uid (not stored yet): it cannot own objects")
        return OwnerReference(kind=self.kind, name=self.name, uid=self.metadata.uid)


# Any kind; ``ObjectT`` is one kind, in signatures that return what they were given.
AnyObject = Object[Any, Any]
ObjectT = TypeVar("ObjectT", bound=AnyObject)


# --------------------------------------------------------------------- Node

class GPU(Strict):
    index: Int
    uuid: str | None = None
    name: str | None = None
    memoryMiB: Int | None = None
    # Free when the agent started (nvidia-smi's memory.free): what others' processes left.
    memoryFreeMiB: Int | None = added("0.3.0")
    computeCap: str | None = None
    pciBusId: str | None = None


class Adapter(Strict):
    name: str
    port: Int = 1
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
    first: Port = 30000
    last: Port = 32767


DrainPhase = Literal["Draining", "Drained", "Stuck"]


class DrainStatus(Strict):
    phase: DrainPhase = "Draining"
    remaining: Int = 0
    current: str | None = None
    message: str = ""


class NodeSpec(Strict):
    unschedulable: Bool = False
    drain: Bool = False


class CachedWeights(Strict):
    digest: Digest
    bytes: Int = 0
    # The sources pulled as this content (a hub commit, hf://ORG/NAME@COMMIT), so a pulling peer
    # finds it before the content's digest is known; an HTTP manifest's source is its digest
    sources: list[str] = Field(default_factory=list)


class WeightsPull(Strict):
    """A pull in flight on a node: peers pulling the same source after it stream its files from it."""
    source: str
    startedAt: datetime


class WeightsCache(Strict):
    """The agent's weights cache (llmgw/weights/cache.py): what it holds, so placement can prefer
    the nodes that already have a Model's digest, and how much more it may hold."""
    capacityBytes: Int = 0
    freeBytes: Int = 0
    models: list[CachedWeights] = Field(default_factory=list)
    pulls: list[WeightsPull] = Field(default_factory=list)


class NodeStatus(Strict):
    observedGeneration: Int = 0
    addresses: list[str] = Field(default_factory=list)
    gpus: list[GPU] = Field(default_factory=list)
    driverVersion: str | None = None
    fabrics: list[Fabric] = Field(default_factory=list)
    engines: list[EngineInfo] = Field(default_factory=list)
    portRange: PortRange = Field(default_factory=PortRange)
    # Ports of portRange held by processes that are not this node's engines (the agent
    # refreshes it at registration and at each engine start); never assigned to a shard.
    foreignPorts: list[int] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    drain: DrainStatus | None = None
    agentVersion: str | None = None
    # Where its agent serves its shards' engine logs to the API server ("https://ADDR:PORT",
    # the agent's --logs-listen); None: it serves none (`llmgw logs` says so).
    agentEndpoint: str | None = None
    # HOST:PORT of its agent's GET /metrics (the agent's --metrics-listen, its host the node's
    # address where it listens on all); None: it serves none. `llmgw top` reads it.
    agentMetrics: str | None = added("0.3.0")
    weights: WeightsCache | None = None


# The Node status fields its agent writes (registration, rediscovery); a node certificate may
# write these and nothing else of its Node (docs/contracts.md, "Node rights"). observedGeneration
# and drain progress are the controllers'.
NODE_AGENT_STATUS_FIELDS = ("addresses", "gpus", "driverVersion", "fabrics", "engines", "portRange", "conditions",
                            "agentVersion", "foreignPorts", "agentEndpoint", "agentMetrics", "weights")

# The node lifecycle controller's verdict on a silent node, a Node condition
# (docs/contracts.md, "Failure semantics"); its reason says why.
EVICTING = "Evicting"


class Node(Object[NodeSpec, NodeStatus]):
    kind_plural: ClassVar[str] = "nodes"
    kind: Literal["Node"] = "Node"
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)


# -------------------------------------------------------------------- Model

class Profile(Strict):
    engine: EngineName
    launchMode: LaunchMode | None = None
    nodes: NodeCount = 1
    gpusPerNode: GPUCount = 1
    args: list[str] = Field(default_factory=list)
    env: dict[EnvName, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rules(self) -> "Profile":
        engine = rules.lookup(self.engine)
        if self.launchMode is not None and not engine.launch_modes:
            having = ", ".join(sorted(e.name for e in rules.RULES.values() if e.launch_modes))
            raise ValueError(f"launchMode is only for engine {having}, not {self.engine}")
        if self.launchMode is not None and self.launchMode not in engine.launch_modes:
            raise ValueError(f"launchMode {self.launchMode} is not one of engine {self.engine}'s: "
                             f"{', '.join(engine.launch_modes)}")
        if not engine.multi_node and self.nodes != 1:
            raise ValueError(f"engine {self.engine} is single-node: nodes must be 1")
        for arg in self.args:
            hit = engine.reserved_flag(arg)
            if hit:
                flag, why = hit
                raise ValueError(f"args may not set {flag}: {why}")
        return self

    @property
    def launch_mode(self) -> str | None:
        """The effective launch mode: the engine's first when none is given (vLLM: mp)."""
        modes = rules.lookup(self.engine).launch_modes
        return self.launchMode or (modes[0] if modes else None)


class UpdateStrategy(Strict):
    maxSurge: Replicas = 1
    maxUnavailable: Replicas = 0

    @model_validator(mode="after")
    def _progress(self) -> "UpdateStrategy":
        if self.maxSurge == 0 and self.maxUnavailable == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0")
        return self


def _routing_policy_schema(schema: dict[str, JsonValue]) -> None:
    enum: list[JsonValue] = [*sorted(routing.POLICIES)]
    schema.update(enum=enum, description=routing.describe())


class RoutingSpec(Strict):
    """How the gateway picks one of a model's replicas for a request (docs/gateway.md, Routing)."""

    # A name in llmgw.routing's registry: the schema's enum and description are the registered ones.
    policy: Annotated[str, AfterValidator(routing.check_name)] = Field(
        default=routing.DEFAULT,
        json_schema_extra=_routing_policy_schema)
    prefixBytes: PrefixBytes = Field(
        default=2048,
        description="characters of the rendered prompt that make its prefix key")
    loadBound: float = Field(
        default=1.25, ge=1.0, le=10.0, strict=True,
        description="no replica is given a request that would put it past loadBound x the "
                    "average requests in flight (prefix-hash, prefix-score; precise-prefix weighs a replica "
                    "past it by its queued work)")
    indexBytes: IndexBytes = Field(
        default=8 * 1024 * 1024,
        description="memory bound of prefix-score's prefix index in this gateway, per model")


Seconds = Annotated[int, Field(strict=True, ge=0, le=MAX_AUTOSCALE_SECONDS)]


class AutoscalingSpec(Strict):
    """How many replicas the autoscaler keeps, from the gateways' demand (docs/contracts.md,
    "Autoscaling"). Its decision lives in the Model's status (``desiredReplicas``), never in the
    spec: re-applying the manifest changes nothing and `llmgw diff` sees no drift."""

    minReplicas: Replicas = Field(default=1, description="fewest replicas; 0 lets the model scale to zero")
    maxReplicas: Annotated[int, Field(strict=True, ge=1, le=MAX_REPLICAS)] = Field(
        default=1, description="most replicas")
    targetInFlight: Annotated[int, Field(strict=True, ge=1, le=MAX_TARGET_IN_FLIGHT)] = Field(
        default=8, description="requests in flight or waiting per replica the autoscaler aims at")
    scaleUpStabilizationSeconds: Seconds = Field(
        default=0, description="scale up to the lowest recommendation of this window (0: at once)")
    scaleDownStabilizationSeconds: Seconds = Field(
        default=300, description="scale down only to the highest recommendation of this window")
    scaleToZeroDelaySeconds: Seconds = Field(
        default=600, description="seconds of no demand at all before the last replica goes")

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalingSpec":
        if self.maxReplicas < self.minReplicas:
            raise ValueError(f"maxReplicas ({self.maxReplicas}) is below minReplicas ({self.minReplicas})")
        return self

    def clamp(self, replicas: int) -> int:
        return max(self.minReplicas, min(self.maxReplicas, replicas))


class AdapterSlots(Strict):
    """A Model's spec.adapters: its engines are started able to load LoRA adapters at runtime
    (vLLM: --enable-lora --max-loras, VLLM_ALLOW_RUNTIME_LORA_UPDATING), each replica holding at most
    maxLoaded of them (docs/contracts.md, "Adapters")."""
    maxLoaded: Annotated[int, Field(strict=True, ge=1, le=MAX_ADAPTER_SLOTS)] = Field(
        default=4, description="LoRA adapters one replica holds loaded at once (its slots)")


class ModelSpec(Strict):
    # Ignored when autoscaling is set: the autoscaler's status.desiredReplicas counts then.
    replicas: Replicas = 1
    aliases: list[DNSLabel] = Field(default_factory=list)
    source: Source | None = None
    # The content the source must resolve to (hf:// and http(s):// sources): a pull that finds
    # other content fails, so a moved branch or a changed origin never reaches an engine.
    digest: Digest | None = None
    profiles: list[Profile] = Field(min_length=1)
    nodeSelector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    update: UpdateStrategy = Field(default_factory=UpdateStrategy)
    # How long a replica may stay unplaced before the next profile is tried.
    placementDeadlineSeconds: DeadlineSeconds = 60
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    autoscaling: AutoscalingSpec | None = None
    # LoRA adapters (the Adapter kind) its replicas load at runtime; absent: none.
    adapters: AdapterSlots | None = added("0.3.0")
    # Tokens of KV cache each replica must hold (a floor for placement, docs/contracts.md "Will it
    # fit"); absent: the engine's context flag in a profile's args (vLLM --max-model-len), else 4096.
    minContext: Annotated[int, Field(strict=True, ge=1, le=MAX_CONTEXT)] | None = added("0.3.0")

    def context_floor(self, index: int) -> int | None:
        """The context a replica of profile `index` must hold at least (docs/contracts.md, "Will it
        fit"): the larger of minContext and what its engine's context flag in the profile's args
        sets (vLLM's --max-model-len); None when neither says."""
        profile = self.profiles[index]
        floors = [f for f in (self.minContext, rules.lookup(profile.engine).context_floor(profile.args)) if f]
        return max(floors) if floors else None

    @model_validator(mode="after")
    def _digest_of_pulled(self) -> Self:
        check_pulled_digest(self.source, self.digest)
        return self

    @model_validator(mode="after")
    def _adapters_taken(self) -> Self:
        if self.adapters is not None:
            for i, p in enumerate(self.profiles):
                if rules.lookup(p.engine).lora is None:
                    able = ", ".join(sorted(n for n, e in rules.RULES.items() if e.lora is not None))
                    raise ValueError(f"adapters: profiles[{i}]'s engine {p.engine} loads no LoRA adapters "
                                     f"(engines that do: {able})")
        return self


# The autoscaler's Model condition: its reason (ScaledUp, ScaledDown, ScaledToZero, Steady) and
# message say why status.desiredReplicas is what it is (controllers/autoscaler.py).
SCALED = "Scaled"


class MemoryEstimate(Strict):
    """A replica's GPU memory, per GPU at its tensor and pipeline parallel sizes, estimated from the
    model's files (llmgw/fit.py; docs/contracts.md, "Will it fit")."""
    tp: Int
    pp: Int
    weightsBytes: Int
    kvBytesPerToken: Int
    overheadBytes: Int
    minContext: Int       # tokens of KV cache placement asks room for (the floor)
    neededBytes: Int      # what a GPU must have free: weights + overhead + kvBytesPerToken x minContext
    maxContext: Int | None = None   # the model's own (config.json's max_position_embeddings)


class ProfileFit(Strict):
    """The estimate of one profile in a Model's status.fit, or why there is none (placed by GPU count)."""
    profile: Int
    estimate: MemoryEstimate | None = None
    # The fewest KV tokens a placed replica of this profile was given (its spec.kvCache): the
    # context its GPUs hold after the weights and the overhead; None until one is placed.
    contextTokens: Int | None = None
    message: str = ""


class KVBudget(Strict):
    """What a placed replica's engine is told it may use, per GPU, from the free memory its GPUs
    reported when the scheduler placed it (docs/contracts.md, "Will it fit")."""
    gpuMiB: Int           # the smallest total memory of its GPUs
    freeMiB: Int          # the least free memory of its GPUs at placement
    bytes: Int            # its KV cache: free - weights - overhead
    tokens: Int           # the tokens that holds: bytes // kvBytesPerToken
    modelContext: Int | None = None   # the model's own context (its estimate's maxContext)


class ModelStatus(Strict):
    observedGeneration: Int = 0
    # The autoscaler's count (controllers/autoscaler.py): set only while spec.autoscaling is.
    desiredReplicas: Int | None = None
    replicas: Int = 0
    readyReplicas: Int = 0
    updatedReplicas: Int = 0
    templateHash: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    # Each profile's GPU memory estimate (condition MemoryEstimated says whether all have one).
    fit: list[ProfileFit] = added("0.3.0", factory=list)


class Model(Object[ModelSpec, ModelStatus]):
    kind_plural: ClassVar[str] = "models"
    kind: Literal["Model"] = "Model"
    spec: ModelSpec
    status: ModelStatus = Field(default_factory=ModelStatus)

    @model_validator(mode="after")
    def _aliases_once(self) -> "Model":
        seen = {self.metadata.name}
        for i, alias in enumerate(self.spec.aliases):
            if alias in seen:
                raise ValueError(f"spec.aliases[{i}]: {alias!r} is already a name of this Model")
            seen.add(alias)
        return self

    @property
    def served_names(self) -> list[str]:
        return [self.metadata.name, *self.spec.aliases]

    @property
    def wanted_replicas(self) -> int:
        """How many replicas the model controller keeps: spec.replicas, or with autoscaling the
        autoscaler's status.desiredReplicas (minReplicas until it decides), within the bounds."""
        scaling = self.spec.autoscaling
        if scaling is None:
            return self.spec.replicas
        desired = self.status.desiredReplicas
        return scaling.clamp(scaling.minReplicas if desired is None else desired)


PRECISE_PREFIX = PrecisePrefix.name


def kv_events(spec: ModelSpec) -> bool:
    """Whether the Model's replicas publish their engines' KV events: it routes with precise-prefix."""
    return spec.routing.policy == PRECISE_PREFIX


def template_hash(spec: ModelSpec, profile_index: int = 0) -> str:
    """Hash of what a replica runs; replicas with an older hash get rolled."""
    template = {
        "source": spec.source,
        "aliases": spec.aliases,
        "nodeSelector": spec.nodeSelector,
        "profiles": [p.model_dump(mode="json") for p in spec.profiles],
    }
    if spec.digest is not None:     # only when set: a Model without one keeps its replicas' hash
        template["digest"] = spec.digest
    if spec.adapters is not None:   # likewise: engines started with adapter slots are other engines
        template["adapters"] = spec.adapters.model_dump(mode="json")
    if kv_events(spec):  # likewise: engines start (or stop) publishing KV events in a rollout
        template["kvEvents"] = PRECISE_PREFIX
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:10]


# ------------------------------------------------------------------ Replica

ReplicaPhase = Literal["Pending", "Scheduled", "Starting", "Ready", "Failed", "Terminating"]


class Placement(Strict):
    rank: Rank
    node: str
    gpus: list[Int] = Field(default_factory=list)
    fabric: str | None = None


class ReplicaSpec(Strict):
    model: DNSLabel
    templateHash: str
    profileIndex: Int = 0
    profile: Profile
    source: Source | None = None
    digest: Digest | None = None
    servedModelNames: list[str] = Field(default_factory=list)
    nodeSelector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    placement: list[Placement] = Field(default_factory=list)
    adapters: AdapterSlots | None = added("0.3.0")
    # Its engine publishes its KV events for the gateways (the Model routes with precise-prefix and
    # the engine can): rank 0 gets two ports more, status.kvEvents and kvReplay say where.
    kvEvents: bool = added("0.3.0", False)
    # What each of its GPUs must have free (weights, engine overhead, the KV of minContext tokens),
    # estimated from the model's files (llmgw/fit.py); None: not estimated, placed by count.
    memory: MemoryEstimate | None = added("0.3.0")
    # Set with the placement, where memory is: what its engines are told to use (KV cache).
    kvCache: KVBudget | None = added("0.3.0")


class ReplicaStatus(Strict):
    observedGeneration: Int = 0
    phase: ReplicaPhase = "Pending"
    endpoint: str | None = None
    # Where its engine publishes its KV-cache events (ZeroMQ PUB) and replays them (ROUTER), when the
    # Model routes with precise-prefix and the engine publishes them (docs/gateway.md, "KV events").
    kvEvents: str | None = added("0.3.0")
    kvReplay: str | None = added("0.3.0")
    message: str = ""
    restarts: Int = 0
    # Failures in a row: back to 1 when the replica had stayed Ready for the controller's
    # backoff-reset period (10 min by default). This, not ``restarts``, sets the crash-loop delay.
    consecutiveFailures: Int = 0
    backoffUntil: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Replica(Object[ReplicaSpec, ReplicaStatus]):
    kind_plural: ClassVar[str] = "replicas"
    kind: Literal["Replica"] = "Replica"
    spec: ReplicaSpec
    status: ReplicaStatus = Field(default_factory=ReplicaStatus)


# -------------------------------------------------------------------- Shard

ShardPhase = Literal["Pending", "Pulling", "Starting", "Running", "Ready", "Failed", "Stopping", "Stopped"]


class ShardPorts(Strict):
    serve: Port
    distInit: Port
    # rank 0 of a replica whose engine publishes KV events for precise-prefix (ReplicaSpec.kvEvents)
    kvEvents: Port | None = added("0.3.0")
    kvReplay: Port | None = added("0.3.0")

    @staticmethod
    def needed(rank: int, kv_events: bool) -> int:
        """How many ports a shard is given on its node: serve and dist-init on rank 0, and the KV event
        and replay ports where its replica publishes them (ReplicaSpec.kvEvents); serve on the others."""
        return 1 if rank else 4 if kv_events else 2

    def own(self, rank: int) -> list[int]:
        """The ports the shard's engine binds on its node: serve; on rank 0 dist-init and the KV event ports."""
        if rank:
            return [self.serve]
        return [self.serve, self.distInit, *(p for p in (self.kvEvents, self.kvReplay) if p is not None)]


class ShardSpec(Strict):
    replica: DNSLabel
    model: DNSLabel
    node: DNSLabel
    rank: Rank
    worldSize: NodeCount
    gpus: list[Int] = Field(default_factory=list)
    ports: ShardPorts
    headAddress: str
    fabric: str | None = None
    engine: EngineName
    launchMode: LaunchMode | None = None
    gpusPerNode: GPUCount = 1
    source: Source | None = None
    digest: Digest | None = None
    servedModelNames: list[str] = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[EnvName, str] = Field(default_factory=dict)
    adapters: AdapterSlots | None = added("0.3.0")
    kvCache: KVBudget | None = added("0.3.0")   # its replica's: rendered as the engine's budget flag


class PullStatus(Strict):
    """The weights' pull into the node's cache (phase Pulling): bytes in the cache of the total."""
    digest: Digest | None = None      # known once the source is resolved (http) or pulled (hf)
    bytesDone: Int = 0
    bytesTotal: Int = 0


class ShardAdapter(Strict):
    """A LoRA adapter on a shard's engine: Loaded (its engine lists it), Failed to load (why), or
    Evicted: placed on its replica, and unloaded by its agent to load another that a gateway asked
    for directly (docs/contracts.md, "Adapters"), until the adapter controller drops it there."""
    name: DNSLabel
    digest: Digest | None = None
    state: Literal["Loaded", "Failed", "Evicted"]
    message: str = ""


class ShardStatus(Strict):
    observedGeneration: Int = 0
    phase: ShardPhase = "Pending"
    pid: Int | None = None
    exitCode: Int | None = None
    message: str = ""
    logTail: list[str] = Field(default_factory=list)
    startedAt: datetime | None = None
    phaseTime: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pull: PullStatus | None = None
    # The LoRA adapters its engine holds, as the engine lists them (rank 0, spec.adapters), and
    # the loads that failed; written by its agent (llmgw/agent/adapters.py).
    adapters: list[ShardAdapter] = added("0.3.0", factory=list)
    # The store revision of the last change to the Adapters placed on its replica that its agent
    # had seen when it last made its engine hold them: the adapter controller counts a replica
    # newly placed as resident on a report that has seen the placement (controllers/adapter.py).
    adaptersSeen: Int = added("0.3.0", default=0)


class Shard(Object[ShardSpec, ShardStatus]):
    kind_plural: ClassVar[str] = "shards"
    scope: ClassVar[Scope] = "Node"
    kind: Literal["Shard"] = "Shard"
    spec: ShardSpec
    status: ShardStatus = Field(default_factory=ShardStatus)


# ------------------------------------------------------------------- ApiKey

# Who is shed first under overload (the gateway's queue.py): best first.
PriorityClass = Literal["critical", "standard", "sheddable"]
KeyLimit = Annotated[int, Field(strict=True, ge=1, le=MAX_KEY_LIMIT)]


class ApiKeyLimits(Strict):
    """A key's limits over all gateways together (docs/gateway.md, "API keys"); absent: none."""
    requestsPerMinute: KeyLimit | None = None
    tokensPerMinute: KeyLimit | None = Field(
        default=None, description="prompt and completion tokens, as the engines report them")
    concurrentRequests: KeyLimit | None = None


class ApiKeySpec(Strict):
    owner: str = Field(min_length=1, max_length=253, description="who the key was given to")
    # The only trace of the secret: a salted KDF hash (llmgw/api/secrets.py); the secret is shown once.
    secretHash: Annotated[str, AfterValidator(check_secret_hash)]
    models: list[str] = Field(default_factory=list, description="model names or aliases the key may call")
    modelSelector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, description="models whose labels match may be called too; with no models "
                                          "either, the key may call every model")
    expires: datetime | None = None
    limits: ApiKeyLimits = Field(default_factory=ApiKeyLimits)
    priorityClass: PriorityClass = "standard"

    @property
    def any_model(self) -> bool:
        return not self.models and not self.modelSelector


class ApiKeyStatus(Strict):
    observedGeneration: Int = 0


class ApiKey(Object[ApiKeySpec, ApiKeyStatus]):
    kind_plural: ClassVar[str] = "apikeys"
    kind: Literal["ApiKey"] = "ApiKey"
    spec: ApiKeySpec
    status: ApiKeyStatus = Field(default_factory=ApiKeyStatus)


# ---------------------------------------------------------------- GitSource

GitRefName = Annotated[str, AfterValidator(git.check_ref_name)]


class GitRef(Strict):
    """Which commit to apply: a branch's head, a tag's, or one commit; exactly one is given."""
    branch: GitRefName | None = None
    tag: GitRefName | None = None
    commit: Annotated[str, AfterValidator(git.check_commit)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if sum(v is not None for v in (self.branch, self.tag, self.commit)) != 1:
            raise ValueError("give exactly one of branch, tag or commit")
        return self

    def __str__(self) -> str:
        return (f"branch {self.branch}" if self.branch is not None
                else f"tag {self.tag}" if self.tag is not None else f"commit {self.commit}")


class GitSecretRef(Strict):
    # A file in the controller-manager's credentials directory (--git-credentials-dir), never a
    # secret in etcd: an https token (sent as `Authorization: Bearer`), or an ssh private key.
    file: Annotated[str, AfterValidator(git.check_file_name)]


class GitSourceSpec(Strict):
    url: Annotated[str, AfterValidator(git.check_url)]
    ref: GitRef
    path: Annotated[str, AfterValidator(git.check_path)] = ""
    interval: Annotated[str, AfterValidator(git.check_interval)] = "1m"
    prune: Bool = True
    suspend: Bool = False
    secretRef: GitSecretRef | None = None
    dependsOn: list[DNSLabel] = Field(default_factory=list, max_length=64)

    @property
    def interval_seconds(self) -> int:
        return git.interval_seconds(self.interval)


class InventoryEntry(Strict):
    kind: str
    name: str


# A GitSource's conditions: Ready (applied, and every applied Model Available), Reconciling (a
# sync under way or waiting on a dependency), Stalled (it cannot go on until its commit or the
# cluster changes: a bad manifest, an object another owner holds).
GITSOURCE_CONDITIONS = ("Ready", "Reconciling", "Stalled")
# Ready's reasons while nothing is wrong: no commit applied yet, or its Models not yet Available.
# Any other reason of a Ready that is False is an error (a fetch, a manifest, a conflict).
GITSOURCE_WAITING = ("NotApplied", "Progressing")


class GitSourceStatus(Strict):
    observedGeneration: Int = 0
    lastAppliedRevision: str | None = None
    lastAttemptedRevision: str | None = None
    inventory: list[InventoryEntry] = Field(default_factory=list)
    # The llmgw.io/reconcile-requested-at annotation of the last request handled (`llmgw reconcile`).
    lastHandledReconcileAt: str | None = None
    conditions: list[Condition] = Field(default_factory=list)


class GitSource(Object[GitSourceSpec, GitSourceStatus]):
    kind_plural: ClassVar[str] = "gitsources"
    kind: Literal["GitSource"] = "GitSource"
    spec: GitSourceSpec
    status: GitSourceStatus = Field(default_factory=GitSourceStatus)

    @model_validator(mode="after")
    def _depends_on_others(self) -> "GitSource":
        seen: set[str] = set()
        for i, dep in enumerate(self.spec.dependsOn):
            if dep == self.metadata.name or dep in seen:
                raise ValueError(f"spec.dependsOn[{i}]: {dep!r} is "
                                 + ("this GitSource" if dep == self.metadata.name else "named twice"))
            seen.add(dep)
        return self


# ------------------------------------------------------- Role, RoleBinding

# What a Role's rule may grant (docs/contracts.md, "Roles"): the object verbs, and the subresources
# and changes a person makes by name: a Model's or a GitSource's `status`, the engine `logs`, a
# Node's `cordon` (spec.unschedulable) and `drain` (spec.drain), a Model's `scale` (spec.replicas,
# spec.autoscaling), a GitSource's `reconcile` (its reconcile request, spec.suspend).
RULE_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "status", "logs", "cordon", "drain",
              "scale", "reconcile")
# A rule's kinds: the kinds (plural), and the events; "*" in verbs or kinds is every one.
EVENTS = "events"
ANY = "*"


def _check_rule_verb(value: str) -> str:
    if value != ANY and value not in RULE_VERBS:
        raise ValueError(f"unknown verb {value!r}: use {ANY} or one of {', '.join(RULE_VERBS)}")
    return value


def _check_rule_kind(value: str) -> str:
    if value != ANY and value != EVENTS and value not in KINDS:
        raise ValueError(f"unknown kind {value!r}: use {ANY} or one of {', '.join([*KINDS, EVENTS])} (plural)")
    return value


def _check_rule_selector(value: str) -> str:
    if not Selector.parse(value):
        raise ValueError("an empty label selector selects everything: leave labelSelector out instead")
    return value


class PolicyRule(Strict):
    """Verbs on kinds, of every object or only those `names` names and `labelSelector` selects
    (both: an object must be named and selected)."""
    verbs: list[Annotated[str, AfterValidator(_check_rule_verb)]] = Field(min_length=1, max_length=32)
    kinds: list[Annotated[str, AfterValidator(_check_rule_kind)]] = Field(min_length=1, max_length=32)
    names: list[DNSLabel] = Field(default_factory=list, max_length=256)
    labelSelector: Annotated[str, AfterValidator(_check_rule_selector)] | None = Field(
        default=None, description="team=search: only the objects whose labels match (`llmgw get -l`'s form)")

    def __str__(self) -> str:
        what = ",".join(self.kinds) + (f" named {','.join(self.names)}" if self.names else "")
        return f"{','.join(self.verbs)} {what}" + (f" labelled {self.labelSelector}" if self.labelSelector else "")


class RoleSpec(Strict):
    rules: list[PolicyRule] = Field(min_length=1, max_length=256)   # a Role that grants nothing is a mistake


class RoleStatus(Strict):
    observedGeneration: Int = 0


class Role(Object[RoleSpec, RoleStatus]):
    kind_plural: ClassVar[str] = "roles"
    kind: Literal["Role"] = "Role"
    spec: RoleSpec
    status: RoleStatus = Field(default_factory=RoleStatus)


class Subject(Strict):
    """Who a binding grants its role to: a user (a certificate's CN) or a group (one of its O values)."""
    kind: Literal["User", "Group"]
    name: str = Field(min_length=1, max_length=253)

    def __str__(self) -> str:
        return f"{self.kind.lower()} {self.name}"


class RoleRef(Strict):
    name: DNSLabel = Field(description="a Role, or a built-in role: view, operate, edit, admin")


class RoleBindingSpec(Strict):
    roleRef: RoleRef
    subjects: list[Subject] = Field(min_length=1, max_length=1024)


class RoleBinding(Object[RoleBindingSpec, RoleStatus]):   # a Role's status: an observedGeneration alone
    kind_plural: ClassVar[str] = "rolebindings"
    kind: Literal["RoleBinding"] = "RoleBinding"
    spec: RoleBindingSpec
    status: RoleStatus = Field(default_factory=RoleStatus)


# ------------------------------------------------------------------ Adapter

class LoraAdapterSpec(Strict):
    baseModel: DNSLabel = Field(description="the Model whose replicas load this LoRA adapter")
    source: Source = Field(description="the adapter's weights: a path on the nodes, hf://ORG/NAME[@REVISION] "
                                       "or http(s)://HOST/DIR/, pulled through the nodes' weights cache")
    digest: Digest | None = None
    minReplicas: Replicas = Field(default=1, description="replicas of the base kept with it loaded")
    pinned: Bool = Field(default=False, description="kept loaded on every Ready replica of the base "
                                                    "(minReplicas is then not read)")

    @model_validator(mode="after")
    def _digest_of_pulled(self) -> Self:
        check_pulled_digest(self.source, self.digest)
        return self


class AdapterPending(Strict):
    """A replica asked to hold an adapter where it is not resident, and why (its reason)."""
    replica: str
    reason: str
    message: str = ""


# An Adapter's condition: True (reason Resident, or OnDemand at minReplicas 0 and no demand) once it
# is resident on as many replicas as asked; else why not (controllers/adapter.py): BaseModelNotFound,
# AdaptersDisabled, NoReplicas, NoFreeSlot, Loading, LoadFailed.
ADAPTER_READY = "Ready"


class LoraAdapterStatus(Strict):
    observedGeneration: Int = 0
    placement: list[str] = Field(default_factory=list)   # the replicas asked to hold it
    # The replicas whose engine has it loaded: their rank-0 shard is Ready and lists it, as its agent
    # read it from the engine. Never one whose engine restarted and has not loaded it again.
    resident: list[str] = Field(default_factory=list)
    pending: list[AdapterPending] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class LoraAdapter(Object[LoraAdapterSpec, LoraAdapterStatus]):
    """The Adapter kind: a LoRA adapter of a Model (the class is not named Adapter: a Node's network
    adapter is)."""
    kind_plural: ClassVar[str] = "adapters"
    kind: Literal["Adapter"] = "Adapter"
    spec: LoraAdapterSpec
    status: LoraAdapterStatus = Field(default_factory=LoraAdapterStatus)


# --------------------------------------------------------------- registry

KINDS: dict[str, type[AnyObject]] = {"nodes": Node, "models": Model, "replicas": Replica, "shards": Shard,
                                     "apikeys": ApiKey, "gitsources": GitSource, "roles": Role,
                                     "rolebindings": RoleBinding, "adapters": LoraAdapter}
# Node scope is said once, by the kind's class (``scope``); these read it.
NODE_SCOPED: frozenset[str] = frozenset(plural for plural, cls in KINDS.items() if cls.scope == "Node")


def node_of(obj: AnyObject) -> str | None:
    """The node a node-scoped object (a Shard) is filed under; None for a cluster-scoped one."""
    node: str | None = obj.spec.node if type(obj).scope == "Node" else None
    return node
KIND_BY_NAME: dict[str, type[AnyObject]] = {cls.model_fields["kind"].default: cls for cls in KINDS.values()}

_KIND_ALIASES = {
    "node": "nodes", "nodes": "nodes", "no": "nodes",
    "model": "models", "models": "models", "mo": "models",
    "replica": "replicas", "replicas": "replicas", "rep": "replicas",
    "shard": "shards", "shards": "shards", "sh": "shards",
    "apikey": "apikeys", "apikeys": "apikeys", "key": "apikeys",
    "gitsource": "gitsources", "gitsources": "gitsources", "gs": "gitsources",
    "role": "roles", "roles": "roles",
    "rolebinding": "rolebindings", "rolebindings": "rolebindings", "rb": "rolebindings",
    "adapter": "adapters", "adapters": "adapters", "ad": "adapters",
}


def resolve_kind(word: str) -> str:
    """The plural kind for a singular, plural, short or Kind-cased word."""
    try:
        return _KIND_ALIASES[word.lower()]
    except KeyError:
        raise ValueError(
            f"unknown kind {word!r}: use one of node/nodes/no, model/models/mo, "
            "replica/replicas/rep, shard/shards/sh, apikey/apikeys/key, gitsource/gitsources/gs, role/roles, "
            "rolebinding/rolebindings/rb, adapter/adapters/ad"
        ) from None
