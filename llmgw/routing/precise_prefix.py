"""precise-prefix: the blocks the replicas' engines really hold (their KV events), weighed against load.

The gateway gives the policy its model's KVIndex (``kv``), kept from the
engines' own events (llmgw.kvevents). A request's key is its prompt's token ids
(as the sim tokenizes: llmgw.routing.kvblocks) hashed into the engines' block
keys, as far as some replica holds them. Among the replicas, the one that lacks
the fewest blocks of the prompt, fewer requests in flight first on a tie; but a
replica at prefix-score's load bound (ceil(loadBound x the average requests in
flight)) also counts its queued work: the blocks the requests this gateway has in
flight there lacked when sent, less what the replica has stored since (an engine
stores a request's blocks as it admits it), counted against the oldest first. The
gateway's balancer tells the policy when a request ends (done()), the oldest one
in flight there taken to be it. So a request goes where its context is cached
unless that replica is both past the bound and has more work queued than
computing the context elsewhere would take. Either alone did worse on an
llm-d-shaped workload (hack/bench/routing.py --policy precise-prefix, its
docstring): the bound alone (prefix-score's rule, the bound 2 requests at 8
replicas with 8 in flight) sent 19% of the requests past the replica holding their
context, to compute it again elsewhere and evict another tenant's there; queued
work alone spilled contexts whenever queues formed, and at 20 requests/s the
engines' hit rate fell to 0.29 and TTFT to seconds. Where no replica holds even its first
block, as prefix-score (which keeps a prefix where it sent it before, rather than
wherever load is least). Until the index knows the model's blocks (no event
yet, no replica publishing, or keys refused as mismatched), it is prefix-score,
whose index it keeps up to date either way.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from llmgw.routing.kvindex import KVIndex
from llmgw.routing.policy import R, RoutingParams, register
from llmgw.routing.prefix_score import PrefixScore
from llmgw.routing.ring import load_bound


@register
class PrecisePrefix:
    name: ClassVar[str] = "precise-prefix"
    description: ClassVar[str] = ("the longest prefix each replica's engine holds, from its KV events "
                                  "(vLLM, sim), weighed against load; prefix-score until events come.")

    def __init__(self, params: RoutingParams) -> None:
        self.fallback = PrefixScore(params)
        self.kv: KVIndex | None = None  # the gateway's index of this model (an adapter's: its base's)
        self.lora: str | None = None  # the LoRA adapter this policy routes, an extra key of its blocks
        self._sent: dict[str, deque[int]] = {}  # replica -> blocks each request in flight there lacks, oldest first
        self._seen: dict[str, int] = {}  # replica -> its kv.stored when its entries were last brought up to date

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> tuple[list[int], int, list[int]]:
        """The keys of the prompt's leading blocks some replica holds, how many whole blocks it has,
        and prefix-score's key."""
        kv = self.kv
        keys, blocks = [], 0
        if kv is not None and kv.usable and kv.hasher is not None:
            ids = kv.token_ids(doc)
            keys, blocks = kv.keys(ids, self.lora), len(ids) // kv.hasher.block_size
        return keys, blocks, self.fallback.key(doc, session)

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        keys, blocks, approx = key
        kv = self.kv
        if kv is None or not kv.usable:
            return self.fallback.pick(replicas, inflight, approx, exclude)
        candidates = [b for b in replicas if b.replica not in exclude]
        if not candidates:
            return None
        matched = kv.matches(keys, [b.replica for b in candidates]) if keys else {}
        best: R | None
        if any(matched.values()):
            # the least prefill: what the replica's requests in flight had to compute, then what it
            # lacks of this prompt
            limit = load_bound(sum(inflight.get(b.replica, 0) for b in candidates), len(candidates),
                               self.fallback.bound)
            best = min(candidates, key=lambda b: (
                blocks - matched[b.replica] + (self.load(b.replica) if inflight.get(b.replica, 0) >= limit else 0),
                inflight.get(b.replica, 0)))
            self.fallback.index.record(approx, best.replica)
        else:  # cached nowhere: where prefix-score sent it before, if anywhere
            best = self.fallback.pick(candidates, inflight, approx)
        if best is not None:
            if best.replica not in self._sent and self.kv is not None:  # stores from now on count against it
                self._seen[best.replica] = self.kv.stored.get(best.replica, 0)
            self._sent.setdefault(best.replica, deque()).append(blocks - matched.get(best.replica, 0))
        return best

    def predicted(self, key: Any, replica: str) -> tuple[int, int] | None:
        """(tokens, block size): the prompt's tokens `replica`'s engine should find cached, by the
        index, asked when the request is sent there; None where the index does not route it."""
        kv = self.kv
        if kv is None or not kv.usable or kv.hasher is None:
            return None
        keys = key[0]
        size = kv.hasher.block_size
        return (kv.matches(keys, [replica])[replica] * size if keys else 0), size

    def load(self, replica: str) -> int:
        """The blocks the requests this gateway has in flight at `replica` lacked when sent and that the
        replica has not stored since (its engine stores a request's blocks as it admits it: what is
        left is queued work), the oldest request's first."""
        sent = self._sent.get(replica)
        if not sent:
            return 0
        stored = self.kv.stored.get(replica, 0) if self.kv is not None else 0
        new = stored - self._seen.get(replica, stored)
        self._seen[replica] = stored
        for i, left in enumerate(sent):
            if new <= 0:
                break
            if left:
                sent[i] = max(0, left - new)
                new -= left
        return sum(sent)

    def done(self, replica: str) -> None:
        """A request at `replica` ended (the gateway's balancer says so): the oldest one sent there is
        taken to be it (its requests end in about the order they came, as an engine's FCFS queue has them)."""
        sent = self._sent.get(replica)
        if sent:
            sent.popleft()
            if not sent:
                del self._sent[replica]
                self._seen.pop(replica, None)
