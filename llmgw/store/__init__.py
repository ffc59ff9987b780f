"""llmgw's etcd store: the only module that imports aetcd. See docs/contracts.md."""
import os

# gRPC's core logs a refused TLS handshake to stderr, several lines at a time, before
# anything imports it; the error the caller gets says it in one line
# (connection.describe_failure). GRPC_VERBOSITY=ERROR brings them back.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from llmgw.api.selectors import Selector  # noqa: F401
from llmgw.store.errors import (  # noqa: F401
    AlreadyExists,
    Compacted,
    Conflict,
    FencedOut,
    NameTaken,
    NotFound,
    StoreError,
    StoreUnavailable,
)
from llmgw.store.store import Leadership, RawEvent, Store, WatchEvent  # noqa: F401
