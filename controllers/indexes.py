"""The cache indexes the controllers read: ``cache.index(Shard, "node", name)`` and the like.

A controller names those it reads in ``Controller.indexes``; the manager registers
them in each term's cache (llmgw/runtime/cache.py keeps them current).
"""
from __future__ import annotations

from llmgw.api import LoraAdapter, Replica, Shard
from llmgw.runtime.cache import Index

SHARDS_BY_NODE = Index(Shard, "node", lambda s: (s.spec.node,))
SHARDS_BY_REPLICA = Index(Shard, "replica", lambda s: (s.spec.replica,))
REPLICAS_BY_MODEL = Index(Replica, "model", lambda r: (r.spec.model,))
# Every node a replica has a rank on.
REPLICAS_BY_NODE = Index(Replica, "node", lambda r: {p.node for p in r.spec.placement})
ADAPTERS_BY_MODEL = Index(LoraAdapter, "model", lambda a: (a.spec.baseModel,))
