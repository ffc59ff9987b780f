"""The columns of each kind's table (`llmgw get`, `-o wide`, `llmgw-onboard-node`'s node row)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from llmgw.api.kinds import all_of_kind
from llmgw.api.meta import get_condition
from llmgw.api.types import EVICTING, SCALED, AnyObject, ApiKey, GitSource, Model, Node, Replica, Shard
from llmgw.api.usage import KeyUsage
from llmgw.printers.table import NONE, human_age
from llmgw.printers.usage import last_use

Table = tuple[list[str], list[list[str]]]   # headers, rows


def _join(items: Iterable[str]) -> str:
    items = [i for i in items if i]
    return ",".join(items) if items else NONE


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


# --------------------------------------------------------------------- nodes

def node_status(node: Node) -> str:
    """kubectl-style combined status: Ready | NotReady, then the flags that apply."""
    ready = get_condition(node.status.conditions, "Ready")
    parts = ["Ready" if ready is not None and ready.status == "True" else "NotReady", _eviction(node)]
    gpu = get_condition(node.status.conditions, "GPUDiscovery")
    if gpu is not None and gpu.status == "False":
        parts.append("GPUDiscoveryFailed")
    if node.spec.unschedulable:
        parts.append("SchedulingDisabled")
    if node.spec.drain:
        phase = node.status.drain.phase if node.status.drain else "Draining"
        parts.append({"Stuck": "DrainStuck"}.get(phase, phase))
    if node.metadata.deletionTimestamp is not None:
        parts.append("Terminating")
    return ",".join(p for p in parts if p)


def _eviction(node: Node) -> str:
    """The node lifecycle controller's verdict (condition Evicting): Lost, EvictionHeld(REASON)
    while a silent node's judgement is held back, nothing once the node is back (HeartbeatResumed)."""
    verdict = get_condition(node.status.conditions, EVICTING)
    if verdict is None or verdict.reason == "HeartbeatResumed":
        return ""
    return "Lost" if verdict.status == "True" else f"EvictionHeld({verdict.reason})"


def gpus_used(replicas: Iterable[Replica]) -> dict[str, set[int]]:
    """node name -> GPU indices held by the placements of replicas on it."""
    used: dict[str, set[int]] = {}
    for r in replicas:
        for p in r.spec.placement:
            used.setdefault(p.node, set()).update(p.gpus)
    return used


def weights(node: Node) -> str:
    """The node's weights cache: `2 models, 120Gi free` (none: its agent keeps no cache)."""
    cache = node.status.weights
    if cache is None:
        return NONE
    n = len(cache.models)
    return f"{n} model{'' if n == 1 else 's'}, {binary_size(cache.freeBytes)} free"


def binary_size(n: int) -> str:
    """Bytes as kubectl shows quantities: the largest of Ki, Mi, Gi, Ti that keeps a whole number."""
    for unit, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return str(n)


def replicas_per_node(replicas: Iterable[Replica]) -> dict[str, int]:
    count: dict[str, int] = {}
    for r in replicas:
        for node in {p.node for p in r.spec.placement}:
            count[node] = count.get(node, 0) + 1
    return count


def node_table(nodes: Sequence[Node], replicas: Sequence[Replica], wide: bool = False,
               now: datetime | None = None) -> Table:
    headers = ["NAME", "STATUS", "GPUS", "FABRICS", "ENGINES", "REPLICAS", "AGE"]
    if wide:
        headers += ["WEIGHTS", "ADDRESS", "GPU-MODEL", "AGENT"]
    used, count = gpus_used(replicas), replicas_per_node(replicas)
    rows: list[list[str]] = []
    for n in nodes:
        row = [
            n.name, node_status(n),
            f"{len(used.get(n.name, ()))}/{len(n.status.gpus)}",
            _join(f.name for f in n.status.fabrics),
            _join(_unique(e.name for e in n.status.engines)),
            str(count.get(n.name, 0)),
            human_age(n.metadata.creationTimestamp, now),
        ]
        if wide:
            row += [
                weights(n),
                n.status.addresses[0] if n.status.addresses else NONE,
                _join(_unique(g.name or "" for g in n.status.gpus)),
                n.status.agentVersion or NONE,
            ]
        rows.append(row)
    return headers, rows


# -------------------------------------------------------------------- models

def autoscale(m: Model) -> str:
    """`MIN-MAX` and the autoscaler's last reason (its condition Scaled), or none without autoscaling."""
    scaling = m.spec.autoscaling
    if scaling is None:
        return NONE
    scaled = get_condition(m.status.conditions, SCALED)
    return f"{scaling.minReplicas}-{scaling.maxReplicas}" + (f" {scaled.reason}" if scaled is not None else "")


def model_table(models: Sequence[Model], wide: bool = False, now: datetime | None = None) -> Table:
    # READY is Ready/desired: spec.replicas, or the autoscaler's count (AUTOSCALE says why it moved).
    headers = ["NAME", "READY", "UP-TO-DATE", "AUTOSCALE", "ENGINE", "ALIASES", "AGE"]
    if wide:
        headers += ["SOURCE", "TEMPLATE", "NODE-SELECTOR"]
    rows: list[list[str]] = []
    for m in models:
        row = [
            m.name, f"{m.status.readyReplicas}/{m.wanted_replicas}", str(m.status.updatedReplicas), autoscale(m),
            _join(_unique(p.engine for p in m.spec.profiles)), _join(m.spec.aliases),
            human_age(m.metadata.creationTimestamp, now),
        ]
        if wide:
            row += [
                m.spec.source or NONE, m.status.templateHash or NONE,
                _join(f"{k}={v}" for k, v in sorted(m.spec.nodeSelector.items())),
            ]
        rows.append(row)
    return headers, rows


# ------------------------------------------------------------------ replicas

def replica_table(replicas: Sequence[Replica], wide: bool = False, now: datetime | None = None) -> Table:
    headers = ["NAME", "MODEL", "PHASE", "NODES", "ENDPOINT", "RESTARTS", "AGE"]
    if wide:
        headers += ["ENGINE", "GPUS", "MESSAGE"]
    rows: list[list[str]] = []
    for r in replicas:
        phase = "Terminating" if r.metadata.deletionTimestamp is not None else r.status.phase
        placement = sorted(r.spec.placement, key=lambda p: p.rank)
        row = [
            r.name, r.spec.model, phase, _join(_unique(p.node for p in placement)),
            r.status.endpoint or NONE, str(r.status.restarts),
            human_age(r.metadata.creationTimestamp, now),
        ]
        if wide:
            why = r.status.message
            sched = get_condition(r.status.conditions, "Scheduled")
            if not why and sched is not None and sched.status == "False":
                why = sched.message
            row += [
                r.spec.profile.engine,
                str(sum(len(p.gpus) for p in placement)),
                why or NONE,
            ]
        rows.append(row)
    return headers, rows


# -------------------------------------------------------------------- shards

def _shard_phase(s: Shard) -> str:
    """The phase, with a pull's share done ("Pulling 40%")."""
    pull = s.status.pull
    if s.status.phase == "Pulling" and pull is not None and pull.bytesTotal:
        return f"Pulling {100 * pull.bytesDone // pull.bytesTotal}%"
    return s.status.phase


def shard_table(shards: Sequence[Shard], wide: bool = False, now: datetime | None = None) -> Table:
    headers = ["NAME", "NODE", "RANK", "PHASE", "GPUS", "PORT", "AGE"]
    if wide:
        headers += ["REPLICA", "ENGINE", "PID", "EXIT"]
    rows: list[list[str]] = []
    for s in shards:
        row = [
            s.name, s.spec.node, f"{s.spec.rank}/{s.spec.worldSize}", _shard_phase(s),
            _join(str(g) for g in s.spec.gpus), str(s.spec.ports.serve),
            human_age(s.metadata.creationTimestamp, now),
        ]
        if wide:
            row += [
                s.spec.replica, s.spec.engine,
                str(s.status.pid) if s.status.pid is not None else NONE,
                str(s.status.exitCode) if s.status.exitCode is not None else NONE,
            ]
        rows.append(row)
    return headers, rows


# ------------------------------------------------------------------- apikeys

def key_scope(k: ApiKey) -> str:
    """The models a key may call: names, then `label=value` selectors; `*` for every model."""
    if k.spec.any_model:
        return "*"
    return _join([*k.spec.models, *(f"{n}={v}" for n, v in sorted(k.spec.modelSelector.items()))])


def key_limits(k: ApiKey) -> str:
    lim = k.spec.limits
    parts = [f"{what}={n}" for what, n in (("rpm", lim.requestsPerMinute), ("tpm", lim.tokensPerMinute),
                                           ("concurrency", lim.concurrentRequests)) if n is not None]
    return _join(parts)


def apikey_table(keys: Sequence[ApiKey], wide: bool = False, now: datetime | None = None,
                 usage: Mapping[str, KeyUsage] | None = None) -> Table:
    # Never the secret: the object holds only its hash, which is not shown either.
    headers = ["NAME", "OWNER", "MODELS", "LIMITS", "PRIORITY", "EXPIRES", "LAST-USE", "AGE"]
    rows: list[list[str]] = []
    for k in keys:
        expires = k.spec.expires
        rows.append([k.name, k.spec.owner, key_scope(k), key_limits(k), k.spec.priorityClass,
                     expires.isoformat().replace("+00:00", "Z") if expires is not None else NONE,
                     last_use((usage or {}).get(k.name), now), human_age(k.metadata.creationTimestamp, now)])
    return headers, rows


# ---------------------------------------------------------------- gitsources

def gitsource_table(sources: Sequence[GitSource], wide: bool = False, now: datetime | None = None) -> Table:
    """URL, ref, the applied commit (short), Ready and its reason (why not, at a glance); -o wide: path,
    interval and the commit last attempted."""
    headers = ["NAME", "URL", "REF", "REVISION", "READY", "REASON", "AGE"]
    if wide:
        headers[4:4] = ["PATH", "INTERVAL", "ATTEMPTED"]
    rows: list[list[str]] = []
    for s in sources:
        ready = get_condition(s.status.conditions, "Ready")
        status = "Suspended" if s.spec.suspend else ready.status if ready is not None else "Unknown"
        row = [s.name, s.spec.url, str(s.spec.ref).replace(" ", ":"), (s.status.lastAppliedRevision or NONE)[:12],
               status, ready.reason if ready is not None and ready.reason else NONE,
               human_age(s.metadata.creationTimestamp, now)]
        if wide:
            row[4:4] = [s.spec.path or ".", s.spec.interval, (s.status.lastAttemptedRevision or NONE)[:12]]
        rows.append(row)
    return headers, rows


def table(kind: str, objects: Sequence[AnyObject], *, wide: bool = False, replicas: Sequence[Replica] = (),
          now: datetime | None = None, usage: Mapping[str, KeyUsage] | None = None) -> Table:
    """(headers, rows) for objects of one plural kind; nodes need every replica for GPUS/REPLICAS,
    apikeys their usage over the live gateways for LAST-USE."""
    if kind == "nodes":
        return node_table(all_of_kind(Node, objects), replicas, wide, now)
    if kind == "models":
        return model_table(all_of_kind(Model, objects), wide, now)
    if kind == "replicas":
        return replica_table(all_of_kind(Replica, objects), wide, now)
    if kind == "shards":
        return shard_table(all_of_kind(Shard, objects), wide, now)
    if kind == "apikeys":
        return apikey_table(all_of_kind(ApiKey, objects), wide, now, usage)
    if kind == "gitsources":
        return gitsource_table(all_of_kind(GitSource, objects), wide, now)
    raise ValueError(f"no table for kind {kind!r}")

