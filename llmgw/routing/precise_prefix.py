"""precise-prefix: the blocks the replicas' engines really hold (their KV events), weighed against load.

The gateway gives the policy its model's KVIndex (``kv``), kept from the
engines' own events (llmgw.kvevents). A request's key is its prompt's token ids
(as the sim tokenizes: llmgw.routing.kvblocks) hashed into the engines' block
keys; among the replicas within the load bound, the highest (share of the
request's blocks the replica holds as a leading run) - (load / bound), as
prefix-score scores its guess; where no replica holds even its first block, as
prefix-score (which keeps a prefix where it sent it before, rather than wherever
load is least). Until the index knows the model's blocks (no
event yet, no replica publishing, or keys refused as mismatched), it is
prefix-score, whose index it keeps up to date either way.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from llmgw.routing.kvindex import KVIndex
from llmgw.routing.policy import R, RoutingParams, register
from llmgw.routing.prefix_score import PrefixScore


@register
class PrecisePrefix:
    name: ClassVar[str] = "precise-prefix"
    description: ClassVar[str] = ("the longest prefix each replica's engine holds, from its KV events "
                                  "(vLLM, sim), weighed against load; prefix-score until events come.")

    def __init__(self, params: RoutingParams) -> None:
        self.fallback = PrefixScore(params)
        self.kv: KVIndex | None = None  # the gateway's index of this model (an adapter's: its base's)
        self.lora: str | None = None  # the LoRA adapter this policy routes, an extra key of its blocks

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> tuple[list[int], list[int]]:
        kv = self.kv
        keys = kv.keys(kv.token_ids(doc), self.lora) if kv is not None and kv.usable else []
        return keys, self.fallback.key(doc, session)

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        keys, approx = key
        kv = self.kv
        if not keys or kv is None or not kv.usable:
            return self.fallback.pick(replicas, inflight, approx, exclude)
        candidates = [b for b in replicas if b.replica not in exclude]
        if not candidates:
            return None
        matched = kv.matches(keys, [b.replica for b in candidates])
        if not any(matched.values()):  # cached nowhere: where prefix-score sent it before, if anywhere
            return self.fallback.pick(candidates, inflight, approx)
        best = self.fallback.choose(candidates, inflight, matched, len(keys))
        if best is not None:
            self.fallback.index.record(approx, best.replica)
        return best
