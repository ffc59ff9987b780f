"""`llmgw ctl weights`' table: which node's cache holds which content, for which models, and
how much room each cache has left."""
from __future__ import annotations

from collections.abc import Sequence

from llmgw.api import Model, Node, Shard
from llmgw.printers.table import NONE, Row, binary_size

HEADERS = ["NODE", "DIGEST", "SIZE", "MODELS", "SHARDS", "FREE", "CAPACITY"]


def short(digest: str) -> str:
    """`sha256:` and the first 12 hex digits, as container tools shorten image digests."""
    algo, _, hexes = digest.partition(":")
    return f"{algo}:{hexes[:12]}"


def weights_rows(nodes: Sequence[Node], models: Sequence[Model], shards: Sequence[Shard]) -> list[Row]:
    """A row per node and digest in its cache (one `<none>` row for an empty cache; nodes whose
    agent keeps no cache are left out). MODELS: the models whose content it is (pinned by
    `spec.digest`, or pulled by a shard anywhere); SHARDS: this node's shards running on it,
    which keep it from eviction."""
    names: dict[str, set[str]] = {}
    for m in models:
        if m.spec.digest:
            names.setdefault(m.spec.digest, set()).add(m.name)
    using: dict[tuple[str, str], int] = {}
    for s in shards:
        digest = s.spec.digest or (s.status.pull.digest if s.status.pull else None)
        if digest:
            names.setdefault(digest, set()).add(s.spec.model)
            key = (s.spec.node, digest)
            using[key] = using.get(key, 0) + 1
    rows: list[Row] = []
    for n in sorted(nodes, key=lambda n: n.name):
        cache = n.status.weights
        if cache is None:
            continue
        room = [binary_size(cache.freeBytes), binary_size(cache.capacityBytes)]
        if not cache.models:
            rows.append([n.name, NONE, NONE, NONE, "0", *room])
        for w in sorted(cache.models, key=lambda w: w.digest):
            used_by = ",".join(sorted(names.get(w.digest, ()))) or NONE
            rows.append([n.name, short(w.digest), binary_size(w.bytes), used_by,
                         str(using.get((n.name, w.digest), 0)), *room])
    return rows
