"""Every limit on input, in one place: the CLI, the API server and the gateway share them.

A document (a manifest, a REST body, a chat request) is refused, with the same
message wherever it arrives, when it is nested deeper than MAX_DEPTH, holds
more than MAX_ELEMENTS values (a YAML alias bomb is small on disk and huge in
memory), repeats a key in one mapping, or is larger than its size limit.
Numbers that size something (replicas, nodes, GPUs, ports) have bounds here
too, so a typo of 10**30 is a 4xx, not a controller looping on OverflowError.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

MAX_DEPTH = 64                 # nesting of mappings and lists; objects of llmgw.io/v1 need under 10
MAX_ELEMENTS = 100_000         # values in one document, aliases expanded
MAX_BODY_BYTES = 1 << 20       # one REST body (one object): etcd refuses requests over 1.5 MiB
MAX_MANIFEST_BYTES = 8 << 20   # one manifest file, any number of documents

MAX_REPLICAS = 10_000          # Model spec.replicas, update.maxSurge, update.maxUnavailable
MAX_NODES = 1_024              # profile nodes: nodes of one replica
MAX_GPUS_PER_NODE = 64         # profile gpusPerNode
MAX_PLACEMENT_DEADLINE_SECONDS = 7 * 86_400
MAX_PORT = 65_535
MAX_AUTOSCALE_SECONDS = 86_400  # autoscaling's stabilization windows and scale-to-zero delay
MAX_ADAPTER_SLOTS = 1024      # a Model's spec.adapters.maxLoaded: LoRA adapters one replica holds at once
MAX_CONTEXT = 1 << 24          # a Model's spec.minContext: tokens of KV cache a replica must hold
MAX_TARGET_IN_FLIGHT = 100_000  # autoscaling's targetInFlight: requests per replica
MAX_KEY_LIMIT = 1 << 40         # an ApiKey's requests or tokens per minute, concurrent requests
HEARTBEAT_TTL = 15             # s a node's heartbeat key lives after a beat that names no ttl (the agent's)
MAX_TTL = 600                  # s a heartbeat or a gateway's demand report may ask its key to live
INT64 = (-(1 << 63), (1 << 63) - 1)  # any other integer: etcd and Go readers hold int64


def heartbeat_window(ttl: float) -> float:
    """How long a server gathers beats of `ttl` s before it writes them (llmgw.store.leases): a
    tenth of the ttl, at least 0.5 s (the period at which etcd looks for leases run out), at most
    2 s; so also how much longer than its own work a beat's answer may take (the agent's timeout)."""
    return min(2.0, max(0.5, ttl / 10))


class InputError(ValueError):
    """A document refused before schema validation; `path` names where (`<document>` for all of it)."""

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}")


def too_deep() -> str:
    return f"nested deeper than {MAX_DEPTH} levels"


def too_large(limit: int) -> str:
    return f"larger than the limit of {_size(limit)}"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def path_text(loc: Iterable[Any]) -> str:
    """`spec.profiles[0].env` from ("spec", "profiles", 0, "env")."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class Duplicates(dict[Any, Any]):
    """A mapping in which a key appeared twice; check_document reports where."""

    key: Any = None
    line: int | None = None


def check_document(doc: Any, max_elements: int | None = MAX_ELEMENTS) -> None:
    """InputError when `doc` is nested too deeply, holds a Duplicates mapping, or more than
    max_elements values (None: no count, for JSON, which has no aliases: its size bounds it)."""
    if not isinstance(doc, (dict, list)):
        return
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(doc, (), 0)]
    seen = 0
    while stack:
        value, loc, depth = stack.pop()
        if depth >= MAX_DEPTH:
            raise InputError(path_text(loc) or "<document>", too_deep())
        if isinstance(value, Duplicates):
            where = f" (line {value.line})" if value.line else ""
            raise InputError(path_text((*loc, str(value.key))), f"duplicate key{where}")
        seen += len(value)
        if max_elements is not None and seen > max_elements:
            raise InputError("<document>", f"more than {max_elements} values (YAML aliases expanded)")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((v, (*loc, k if isinstance(k, int) and isinstance(value, list) else str(k)), depth + 1)
                     for k, v in items if isinstance(v, (dict, list)))


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    dup = Duplicates(out)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            dup.key = key
            break
        seen.add(key)
    return dup


def parse_json(data: bytes | str, *, unique_keys: bool = True) -> Any:
    """A JSON document within the limits above, or InputError (ValueError for JSON that is not).

    unique_keys=False (the gateway: chat bodies go on to engines that read the same last
    value) keeps json's C mapping builder, and walks the document only when it has more
    brackets than MAX_DEPTH, the only way it can be nested deeper.
    """
    try:
        doc = json.loads(data, object_pairs_hook=_unique_pairs if unique_keys else None)
    except RecursionError:
        raise InputError("<document>", too_deep()) from None
    if unique_keys or _brackets(data) > MAX_DEPTH:
        check_document(doc, max_elements=None)
    return doc


def _brackets(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count("{") + data.count("[")
    return data.count(b"{") + data.count(b"[")
