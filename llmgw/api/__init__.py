"""API types of llmgw.io/v1: Node, Model, Replica, Shard, manifest loading, the ObjectClient protocol."""
from llmgw.api import errors
from llmgw.api.client import EventType, ObjectClient, StatusPatch, WatchEvent
from llmgw.api.manifests import (
    InvalidObject,
    ManifestError,
    load_file,
    load_path,
    parse_object,
    parse_stored,
)
from llmgw.api.meta import (
    API_VERSION,
    Condition,
    ObjectMeta,
    OwnerReference,
    check_dns1123_label,
    condition_true,
    get_condition,
    now,
    set_condition,
)
from llmgw.api.types import *  # noqa: F403
from llmgw.api.types import (
    KIND_BY_NAME,
    KINDS,
    AnyObject,
    Object,
    ObjectT,
    kv_events,
    resolve_kind,
    template_hash,
)

# The names above are this package's interface (mypy's no_implicit_reexport reads this list);
# the kinds and their parts come with llmgw.api.types' names.
__all__ = [
    "errors", "EventType", "ObjectClient", "StatusPatch", "WatchEvent",
    "InvalidObject", "ManifestError", "load_file", "load_path", "parse_object", "parse_stored",
    "API_VERSION", "Condition", "ObjectMeta", "OwnerReference", "check_dns1123_label", "condition_true",
    "get_condition", "now", "set_condition",
    "KIND_BY_NAME", "KINDS", "AnyObject", "Object", "ObjectT", "resolve_kind", "kv_events", "template_hash",
]
