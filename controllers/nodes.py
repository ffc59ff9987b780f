"""When is a node lost, and when is it gone? One answer each, read by every controller.

The node lifecycle controller (controllers/nodelifecycle.py) alone applies
the policy (grace, mass silence, settle period, eviction rate, a fresh grace
after a leadership change) and writes its verdict on the Node: condition
``Evicting``, True once the node is judged lost, False with the reason it is
held back. Other controllers read the verdict here (``node_lost``) instead of
recomputing it from timestamps, so two controllers never disagree about a
node and a new leader inherits a verdict rather than reaching a different one.

Lost is not gone: a lost node's engines may still run (only its agent may be
cut off), so its shards keep their GPUs and ports until the agent confirms it
stopped them (phase Stopped) or the Node object is deleted (``node_deleted``).
"""
from __future__ import annotations

from llmgw.api import EVICTING, Node, ObjectClient
from llmgw.api.errors import NotFound
from llmgw.api.meta import condition_true
from llmgw.runtime.cache import Cache


def node_lost(node: Node) -> bool:
    """The node lifecycle controller has judged the node lost (its replicas are being moved)."""
    return condition_true(node.status.conditions, EVICTING)


async def node_deleted(cache: Cache, store: ObjectClient, name: str) -> bool:
    """The Node object is gone: missing from the cache and confirmed with etcd."""
    if cache.get(Node, name) is not None:
        return False
    try:
        await store.get(Node, name)
    except NotFound:
        return True
    return False
