"""API types of llmgw.io/v1: Node, Model, Replica, Shard, manifest loading, the ObjectClient protocol."""
from llmgw.api.client import EventType, ObjectClient, StatusPatch, WatchEvent, kind_name  # noqa: F401
from llmgw.api.manifests import (  # noqa: F401
    InvalidObject,
    ManifestError,
    load_file,
    load_path,
    parse_object,
    parse_stored,
)
from llmgw.api.meta import (  # noqa: F401
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
from llmgw.api.types import (  # noqa: F401
    KIND_BY_NAME,
    KINDS,
    AnyObject,
    Object,
    ObjectT,
    resolve_kind,
    template_hash,
)
