"""The etcd key layout (docs/architecture.md, "etcd layout"): a public interface people watch with etcdctl."""
from __future__ import annotations

from llmgw.api import types

ROOT = "/llmgw"
SPEC = f"{ROOT}/spec/"
STATUS = f"{ROOT}/status/"
HEARTBEAT = f"{ROOT}/heartbeat/"
DEMAND = f"{ROOT}/demand/"   # a gateway's demand report, bound to its lease
USAGE = f"{ROOT}/usage/"     # a gateway's API keys' usage, bound to the same lease
LEADER = f"{ROOT}/leader/"
REVOKED = f"{ROOT}/revoked/"
RENEWED = f"{ROOT}/renewed/"   # a certificate the API server renewed -> the serial it renewed
EVENTS = f"{ROOT}/events/"
NAMES = f"{ROOT}/names/"  # a served model name or alias -> the Model that serves it

# Kinds keyed by node (their class's scope), so an agent's watch is one prefix.
NODE_SCOPED = types.NODE_SCOPED


def kind_prefix(section: str, kind: str, node: str | None = None) -> str:
    """`/llmgw/spec/models/`, or `/llmgw/spec/shards/<node>/` when node is given."""
    prefix = f"{section}{kind}/"
    if node is not None:
        if kind not in NODE_SCOPED:
            raise ValueError(f"kind {kind} is not keyed by node")
        prefix += f"{node}/"
    return prefix


def object_key(section: str, kind: str, name: str, node: str | None = None) -> str:
    if kind in NODE_SCOPED:
        if not node:
            raise ValueError(f"a {kind} key needs its node")
        return f"{section}{kind}/{node}/{name}"
    return f"{section}{kind}/{name}"


def parse_object_key(key: str) -> tuple[str, str, str | None, str] | None:
    """(section, kind, node, name) of an object key, or None for other keys."""
    for section in (SPEC, STATUS):
        if key.startswith(section):
            parts = key[len(section):].split("/")
            if len(parts) == 2 and parts[0] not in NODE_SCOPED:
                return section, parts[0], None, parts[1]
            if len(parts) == 3 and parts[0] in NODE_SCOPED:
                return section, parts[0], parts[1], parts[2]
            return None
    return None


def served_name_key(name: str) -> str:
    return f"{NAMES}{name}"


def heartbeat_key(node: str) -> str:
    return f"{HEARTBEAT}{node}"


def demand_key(gateway: str) -> str:
    return f"{DEMAND}{gateway}"


def usage_key(gateway: str) -> str:
    return f"{USAGE}{gateway}"


def leader_key(component: str) -> str:
    return f"{LEADER}{component}"


def revoked_key(serial: str) -> str:
    return f"{REVOKED}{serial}"


def renewed_key(serial: str) -> str:
    return f"{RENEWED}{serial}"


def events_prefix(kind: str | None = None, name: str | None = None) -> str:
    """Every object's events, a kind's (`/llmgw/events/models/`) or one object's (`.../models/m/`)."""
    if name is not None and kind is None:
        raise ValueError("the events of a name need its kind")
    return EVENTS + "".join(f"{part}/" for part in (kind, name) if part is not None)


def parse_event_key(key: str) -> tuple[str, str, str]:
    """(kind, name, id) of `/llmgw/events/<kind>/<name>/<id>`; ValueError for any other key."""
    parts = key[len(EVENTS):].split("/") if key.startswith(EVENTS) else []
    if len(parts) != 3:
        raise ValueError(f"{key!r} is not an event's key")
    kind, name, id_ = parts
    return kind, name, id_


def prefix_end(prefix: str | bytes) -> bytes:
    """The smallest key greater than every key starting with prefix."""
    b = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\0"
