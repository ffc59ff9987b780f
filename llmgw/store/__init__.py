"""llmgw's etcd store: the only module that imports aetcd. See docs/architecture.md, "The store"."""
import os

# gRPC's core logs a refused TLS handshake to stderr, several lines at a time, before
# anything imports it; the error the caller gets says it in one line
# (connection.describe_failure). GRPC_VERBOSITY=ERROR brings them back.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from llmgw.api.client import WatchEvent
from llmgw.api.selectors import Selector
from llmgw.store.compaction import Compactor
from llmgw.store.election import Leadership
from llmgw.store.errors import (
    AlreadyExists,
    Compacted,
    Conflict,
    FencedOut,
    NameTaken,
    NotFound,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from llmgw.store.kv import RawEvent
from llmgw.store.store import Store

__all__ = [
    "AlreadyExists", "Compacted", "Compactor", "Conflict", "FencedOut", "Leadership", "NameTaken", "NotFound",
    "RawEvent", "Selector", "Store", "StoreError", "StoreFull", "StoreUnavailable", "WatchEvent",
]
