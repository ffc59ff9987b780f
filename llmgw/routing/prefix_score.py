"""prefix-score: a prefix index kept in the gateway, weighed against load within the load bound.

Among the replicas within the bound, the highest (share of the request's prefix
blocks the index says the replica was sent) - (load / bound); the index then
records that the choice was sent these blocks (docs/gateway.md, "Routing").
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from llmgw.routing.policy import R, RoutingParams, register
from llmgw.routing.prefix import key_blocks
from llmgw.routing.prefixindex import PrefixIndex
from llmgw.routing.ring import load_bound


@register
class PrefixScore:
    name: ClassVar[str] = "prefix-score"
    description: ClassVar[str] = "a prefix index kept in the gateway weighed against load, within the same load bound."

    def __init__(self, params: RoutingParams) -> None:
        self.prefix_bytes, self.bound = params.prefixBytes, params.loadBound
        self.index = PrefixIndex(params.indexBytes)
        self._turn = 0

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> list[int]:
        return key_blocks(doc, session, self.prefix_bytes)

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        blocks: list[int] = key
        candidates = [b for b in replicas if b.replica not in exclude]
        if not candidates:
            return None
        best = self.choose(candidates, inflight, self.index.matches(blocks, [b.replica for b in candidates]),
                           len(blocks))
        if best is not None:
            self.index.record(blocks, best.replica)
        return best

    def choose(self, candidates: Sequence[R], inflight: Mapping[str, int], matched: Mapping[str, int],
               blocks: int) -> R | None:
        """Among the candidates within the load bound, the highest matched/blocks - load/limit."""
        limit = load_bound(sum(inflight.get(b.replica, 0) for b in candidates), len(candidates), self.bound)
        turn = self._turn
        self._turn = turn + 1
        best, high = None, None
        for i in range(len(candidates)):  # from a rotating start: equal scores take turns
            b = candidates[(turn + i) % len(candidates)]
            load = inflight.get(b.replica, 0)
            if load >= limit:
                continue
            score = matched[b.replica] / blocks - load / limit
            if high is None or score > high:
                best, high = b, score
        return best

    def predicted(self, key: Any, replica: str) -> None:
        return None
