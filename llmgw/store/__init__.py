"""llmgw's etcd store: the only module that imports aetcd. See docs/contracts.md."""
from llmgw.store.errors import (  # noqa: F401
    AlreadyExists, Compacted, Conflict, FencedOut, NameTaken, NotFound, StoreError, StoreUnavailable,
)
from llmgw.api.selectors import Selector  # noqa: F401
from llmgw.store.store import Leadership, RawEvent, Store, WatchEvent  # noqa: F401
