"""Node lifecycle: heartbeats -> Node Ready; lost nodes' replicas moved elsewhere, within a disruption budget.

Modelled on Kubernetes' node lifecycle controller and Nomad's heartbeat
handling. Keys are node names; a node's key is enqueued when its Node
changes, when its heartbeat key (/llmgw/heartbeat/<node>, bound to an etcd
lease) appears or vanishes, and when a replacement for one of its replicas
changes.

- a Node without a Ready condition is registering (its agent creates it, then
  heartbeats): it is not judged until it has reported once.
- heartbeat gone: condition Ready=False, reason HeartbeatExpired; back:
  Ready=True, reason HeartbeatResumed (only undoing what this controller set;
  the agent owns Ready otherwise).
- silent for setting ``node_grace`` seconds (default 30) since this controller
  saw it go, the node is judged. The verdict is the condition ``Evicting``
  (controllers/nodes.py: the one answer other controllers read), and every
  change of it is also an event of the same reason:

  * False, ``MassSilence``: half or more of the nodes (setting
    ``max_silent_fraction``, default 0.5; at least two) are silent at once,
    so the likelier story is that the control plane lost the network, not
    that the fleet died: nothing is evicted; looked at again every
    ``node_grace`` / 3 s.
  * False, ``Settling``: mass silence ended less than setting
    ``eviction_settle`` seconds ago (default 60): agents of a healing
    partition come back one by one, and the last ones must not be judged in
    the moment before they do.
  * False, ``RateLimited``: nodes are judged lost at most setting
    ``eviction_rate`` per second (default 0.1, like Kubernetes): the first at
    once, the next when its turn comes.
  * False, ``LeaderChanged``: the node was already silent when this
    controller-manager took over; it gets a fresh ``node_grace`` (the clock
    lives in memory, so a new leader can only delay a verdict, never hasten one).
  * True, ``NodeLost``: each replica placed on the node gets a replacement
    (replacement.py, the drain's mechanism; the scheduler places it where
    there is room, never on a NotReady node). Make-before-break, because only
    the agent may be cut off and the engines still serving: the original is
    annotated ``llmgw.io/evict: node-lost`` and deleted once its replacement
    is Ready (at once if it was not Ready itself; without replacement if its
    model is gone). Deleting it does not free its GPUs and ports: its shards
    stay (Terminating) until the agent confirms it stopped them or an operator
    deletes the Node (controllers/replica.py).
  * False, ``HeartbeatResumed``: the node is back; replacements still in
    flight for its replicas are called off (they become ordinary replicas and
    the model controller scales the surplus down), unless the node is draining.

A node already judged lost stays lost across a leadership change: the new
leader carries the moves on.
"""
from __future__ import annotations

from typing import Iterable

from controllers.indexes import REPLICAS_BY_MODEL, REPLICAS_BY_NODE
from controllers.nodes import node_lost
from controllers.replacement import abandon_replacement, delete_replica, ensure_replacement, find_replacement
from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import EVICTING, AnyObject, Model, Node, Replica, get_condition
from llmgw.api.errors import NotFound
from llmgw.api.meta import ConditionStatus
from llmgw.api.patches import ConditionPatch, NodeStatusPatch
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT
from llmgw.runtime.controller import HEARTBEATS, Context, Controller, Result, WatchedKind


def mass_silence(silent: int, total: int, fraction: float) -> bool:
    """Too many nodes silent at once to believe each failed: the control plane is likelier cut off.

    At least two nodes and at least ``fraction`` of all of them: an even split is the
    likeliest shape of a partition; one silent node is judged on its own.
    """
    return silent >= 2 and silent >= fraction * total


class NodeLifecycleController(Controller):
    name = "nodelifecycle"
    # replicas: a replacement's progress wakes its original's node; models: whether a model lives
    watches = (Node, HEARTBEATS, Replica, Model)
    indexes = (REPLICAS_BY_NODE, REPLICAS_BY_MODEL)

    def __init__(self, settings: ControllerSettings = DEFAULTS) -> None:
        self.settings = settings
        # per leadership term (start)
        self.silent_since: dict[str, float] = {}
        self._mass = False                  # mass silence as last seen
        self._settle_until = 0.0
        self._next_eviction = 0.0           # when the rate limit lets the next node be judged lost

    def start(self, ctx: Context) -> None:
        """A new leadership term starts with a clean slate: every silent node a fresh grace."""
        super().start(ctx)
        self.silent_since = {}
        self._mass, self._settle_until, self._next_eviction = False, 0.0, 0.0

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if isinstance(obj, str):        # a heartbeat: the node's name
            return [obj]
        if type(obj) is Node:
            return [obj.metadata.name]
        if type(obj) is Replica:
            orig = obj.metadata.annotations.get(DRAINING_REPLACEMENT_FOR)
            o = self.ctx.cache.get(Replica, orig) if orig else None
            if o is None:
                return []
            nodes = (self.ctx.cache.get(Node, p.node) for p in o.spec.placement)
            return [n.metadata.name for n in nodes if n is not None and node_lost(n)]
        return []

    def _fleet(self, now: float) -> tuple[int, int]:
        """(silent, total) nodes; notes when mass silence ends, to start the settle period."""
        nodes = self.ctx.cache.list(Node)
        alive = self.ctx.cache.heartbeats()
        silent = sum(1 for n in nodes if n.metadata.name not in alive)
        mass = mass_silence(silent, len(nodes), self.settings.max_silent_fraction)
        if self._mass and not mass:
            self._settle_until = now + self.settings.eviction_settle
        self._mass = mass
        return silent, len(nodes)

    async def reconcile(self, key: str) -> Result | None:
        cache = self.ctx.cache
        now = self.ctx.clock()
        node = cache.get(Node, key)
        if node is None or key in cache.heartbeats():
            self.silent_since.pop(key, None)
            if self._mass:      # this node's return (or deletion) may end a mass silence
                self._fleet(now)
            if node is not None:
                await self._back(node)
            return None
        ready = get_condition(node.status.conditions, "Ready")
        if ready is None:   # registering: its agent created it and has not heartbeated yet
            return None
        silent, total = self._fleet(now)

        expired = ready is not None and ready.status == "False" and ready.reason == "HeartbeatExpired"
        if not expired:
            node = await self._patch(node, [_cond("Ready", "False", "HeartbeatExpired",
                                                  "no heartbeat from the node's agent")])
            self.ctx.events.record(node, "Warning", "NodeNotReady", "heartbeat expired")
        if node_lost(node):
            return await self._evict(node)
        grace = self.settings.node_grace
        since = self.silent_since.get(key)
        if since is None:
            since = self.silent_since[key] = now
            if expired:    # silent before this term: the verdict waits for a grace of our own
                await self._decide(node, "False", "LeaderChanged",
                                   f"silent since before the controller-manager's leadership changed: "
                                   f"judged after a fresh grace of {grace:g}s")
        if now - since < grace:
            return Result(requeue_after=grace - (now - since))

        if self._mass:
            share = self.settings.max_silent_fraction
            await self._decide(node, "False", "MassSilence",
                               f"{silent}/{total} nodes are silent (at least {share:.0%}): assuming the "
                               "control plane is cut off from them; evicting nothing")
            return Result(requeue_after=max(grace / 3, 0.1))
        if now < self._settle_until:
            await self._decide(node, "False", "Settling",
                               f"mass silence ended; nodes still silent are judged "
                               f"{self.settings.eviction_settle:g}s after it, when the partition has healed")
            return Result(requeue_after=self._settle_until - now)
        if now < self._next_eviction:
            await self._decide(node, "False", "RateLimited",
                               f"nodes are judged lost at most {self.settings.eviction_rate:g} per second: "
                               "waiting for this node's turn")
            return Result(requeue_after=self._next_eviction - now)
        self._next_eviction = now + 1.0 / self.settings.eviction_rate
        node = await self._decide(node, "True", "NodeLost",
                                  f"silent for {now - since:.0f}s (grace {grace:g}s): moving its replicas "
                                  "elsewhere, each original stopped once its replacement is Ready")
        return await self._evict(node)

    # ------------------------------------------------------------ verdicts
    async def _decide(self, node: Node, status: ConditionStatus, reason: str, message: str) -> Node:
        """Write the verdict as the Evicting condition and an event, once per change."""
        c = get_condition(node.status.conditions, EVICTING)
        if c is not None and (c.status, c.reason, c.message) == (status, reason, message):
            return node
        quiet = reason in ("HeartbeatResumed", "LeaderChanged")
        self.ctx.events.record(node, "Normal" if quiet else "Warning", reason, message)
        return await self._patch(node, [_cond(EVICTING, status, reason, message)])

    async def _back(self, node: Node) -> None:
        conds: list[ConditionPatch] = []
        ready = get_condition(node.status.conditions, "Ready")
        if ready is not None and ready.status != "True" and ready.reason == "HeartbeatExpired":
            conds.append(_cond("Ready", "True", "HeartbeatResumed", "the node's agent is heartbeating again"))
            self.ctx.events.record(node, "Normal", "NodeReady", "heartbeat resumed")
        node = await self._patch(node, conds)
        verdict = get_condition(node.status.conditions, EVICTING)
        if verdict is None or (verdict.status, verdict.reason) == ("False", "HeartbeatResumed"):
            return
        called_off = await self._call_off(node) if verdict.status == "True" else []
        await self._decide(node, "False", "HeartbeatResumed", "the node is back" + (
            f"; replacements called off: {', '.join(called_off)}" if called_off else ""))

    async def _call_off(self, node: Node) -> list[str]:
        """The node is back: replacements not yet needed are dropped (a drain keeps its own)."""
        if node.spec.drain:
            return []
        out = []
        for orig in _by_name(self.ctx.cache.index(Replica, "node", node.metadata.name)):
            if orig.metadata.deletionTimestamp is not None or self._on_other_lost_node(orig, node.metadata.name):
                continue
            repl = find_replacement(self.ctx.cache, orig)
            if repl is not None and DRAINING_REPLACEMENT_FOR in repl.metadata.annotations:
                await abandon_replacement(self.ctx, repl)
                out.append(repl.metadata.name)
        return out

    def _on_other_lost_node(self, rep: Replica, back: str) -> bool:
        nodes = (self.ctx.cache.get(Node, p.node) for p in rep.spec.placement if p.node != back)
        return any(n is not None and node_lost(n) for n in nodes)

    # ------------------------------------------------------------ eviction
    async def _evict(self, node: Node) -> Result | None:
        """Make-before-break for every replica on the node; looked at again while an original waits."""
        name = node.metadata.name
        waiting = 0
        for rep in _by_name(self.ctx.cache.index(Replica, "node", name)):
            if rep.metadata.deletionTimestamp is not None:
                continue
            why = f"node {name} is lost"
            if self.ctx.cache.get(Model, rep.spec.model) is None:
                await self._delete(node, rep, f"{why}; model {rep.spec.model} is gone: deleted without replacement")
                continue
            repl = await ensure_replacement(self.ctx, rep, why)
            if repl.status.phase == "Ready":
                await self._delete(node, rep, f"{why}; replacement {repl.metadata.name} is Ready: deleted")
            elif rep.status.phase != "Ready":
                await self._delete(node, rep, f"{why}; it was not serving: deleted before its replacement "
                                              f"{repl.metadata.name} is Ready")
            else:
                waiting += 1
        # Replacement events wake this key (keys_for); the requeue is a safety net.
        return Result(requeue_after=self.settings.node_grace) if waiting else None

    async def _delete(self, node: Node, rep: Replica, why: str) -> None:
        marked = rep.model_copy(deep=True)
        marked.metadata.annotations[EVICT] = "node-lost"
        await delete_replica(self.ctx, rep, (rep, "Warning", "Evicted", why),
                             (node, "Warning", "EvictedReplica", f"{rep.metadata.name}: {why}"), marked=marked)

    async def _patch(self, node: Node, conds: list[ConditionPatch]) -> Node:
        if not conds:
            return node
        patch: NodeStatusPatch = {"conditions": conds}
        try:
            written = await self.ctx.store.patch_status(Node, node.metadata.name, patch, current=node)
        except NotFound:
            return node
        self.ctx.cache.assume(written)
        return written


def _cond(type: str, status: ConditionStatus, reason: str, message: str) -> ConditionPatch:
    return {"type": type, "status": status, "reason": reason, "message": message}


def _by_name(replicas: list[Replica]) -> list[Replica]:
    return sorted(replicas, key=lambda r: r.metadata.name)
