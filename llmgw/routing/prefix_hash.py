"""prefix-hash: consistent hashing of the prompt's prefix (or its session) with bounded loads (CHWBL).

The first replica clockwise from the request's key on a hash ring that stays within
the load bound after taking the request. Gateways that share no state agree on the
ring (docs/gateway.md, "Routing").
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from llmgw.routing.policy import R, Routed, RoutingParams, register
from llmgw.routing.prefix import key_hash
from llmgw.routing.ring import Ring, load_bound


@register
class PrefixHash:
    name: ClassVar[str] = "prefix-hash"
    description: ClassVar[str] = ("consistent hashing of the prompt's prefix (or session) with bounded loads; "
                   "gateways agree without sharing state.")

    def __init__(self, params: RoutingParams) -> None:
        self.prefix_bytes, self.bound = params.prefixBytes, params.loadBound
        self._ring: tuple[Sequence[Routed], Ring] | None = None  # the replicas it was made of, and the ring

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> int:
        return key_hash(doc, session, self.prefix_bytes)

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        held = self._ring
        if held is None or held[0] is not replicas:  # the routing table gives a new list on every change
            held = self._ring = (replicas, Ring(b.replica for b in replicas))
        by_name = {b.replica: b for b in replicas if b.replica not in exclude}
        if not by_name:
            return None
        limit = load_bound(sum(inflight.get(r, 0) for r in by_name), len(by_name), self.bound)
        for replica in held[1].order(key):
            b = by_name.get(replica)
            if b is not None and inflight.get(replica, 0) < limit:
                return b
        return None  # unreachable: some replica is always under the bound

    def predicted(self, key: Any, replica: str) -> None:
        return None
