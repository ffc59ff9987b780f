"""When is a node lost? One answer shared by the replica, node-lifecycle and drain controllers.

A node is *lost* when it is missing from the cache, or its Ready condition has
not been True for longer than ``node_grace`` seconds, unless more than
``max_silent_fraction`` of all nodes are not Ready (then the control plane is
probably the one cut off, and nothing is treated as lost).  The node
lifecycle controller owns the Ready condition (heartbeat expiry -> Ready
False/Unknown); this module only reads it.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from llmgw.api import get_condition


def node_ready(node: Any) -> bool:
    c = get_condition(node.status.conditions, "Ready")
    return c is not None and c.status == "True"


def not_ready_for(node: Any, now: datetime | None = None) -> float:
    """Seconds the node has not been Ready (0 when Ready)."""
    if node_ready(node):
        return 0.0
    c = get_condition(node.status.conditions, "Ready")
    since = (c.lastTransitionTime if c else None) or node.metadata.creationTimestamp
    if since is None:
        return 0.0
    now = now or datetime.now(timezone.utc)
    return max(0.0, (now - since).total_seconds())


def mass_silence(cache: Any, max_silent_fraction: float) -> bool:
    nodes = cache.list("nodes")
    if not nodes:
        return False
    down = sum(1 for n in nodes if not node_ready(n))
    return down / len(nodes) > max_silent_fraction


def node_lost(cache: Any, name: str, options: dict[str, Any],
              now: datetime | None = None) -> tuple[bool, float | None]:
    """(lost, seconds until it would count as lost, or None when that cannot be said yet)."""
    node = cache.get("nodes", name)
    if node is None:
        return True, None
    if node_ready(node):
        return False, None
    grace = float(options.get("node_grace", 30.0))
    left = grace - not_ready_for(node, now)
    if left > 0:
        return False, left
    if mass_silence(cache, float(options.get("max_silent_fraction", 0.5))):
        return False, grace
    return True, None
