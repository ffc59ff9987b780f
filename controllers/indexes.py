"""The cache indexes the controllers read: ``cache.index(Shard, "node", name)`` and the like.

A controller names those it reads in ``Controller.indexes``; the manager registers
them in each term's cache (llmgw/runtime/cache.py keeps them current).
"""
from __future__ import annotations

from llmgw.api import ADAPTER_READY, LoraAdapter, Replica, Shard, get_condition
from llmgw.runtime.cache import Index

SHARDS_BY_NODE = Index(Shard, "node", lambda s: (s.spec.node,))
SHARDS_BY_REPLICA = Index(Shard, "replica", lambda s: (s.spec.replica,))
REPLICAS_BY_MODEL = Index(Replica, "model", lambda r: (r.spec.model,))
# Every node a replica has a rank on.
REPLICAS_BY_NODE = Index(Replica, "node", lambda r: {p.node for p in r.spec.placement})
ADAPTERS_BY_MODEL = Index(LoraAdapter, "model", lambda a: (a.spec.baseModel,))
# The replicas an adapter is placed on (its status.placement).
ADAPTERS_BY_PLACEMENT = Index(LoraAdapter, "placed", lambda a: a.status.placement)


def _wanting(a: LoraAdapter) -> tuple[str, ...]:
    ready = get_condition(a.status.conditions, ADAPTER_READY)
    return (a.spec.baseModel,) if a.spec.pinned or ready is None or ready.status != "True" else ()


# By base model, the adapters a replica coming or changing may be wanted by: pinned (on every
# replica) or not Ready (short of replicas).
ADAPTERS_WANTING = Index(LoraAdapter, "wanting", _wanting)
