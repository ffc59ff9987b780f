"""Choosing a replica: least outstanding requests (ties round-robin), or a model's cache-aware
policy (prefix-hash, prefix-score; see docs/gateway.md) within a bound on load."""
from __future__ import annotations

from collections import defaultdict
from typing import Collection, Iterable

from llmgw.api import RoutingSpec
from llmgw.gateway.prefixindex import PrefixIndex
from llmgw.gateway.ring import Ring, load_bound
from llmgw.gateway.table import Backend


class Balancer:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = defaultdict(int)  # replica -> outstanding requests
        self.model_of: dict[str, str] = {}  # replica -> model, while it has outstanding requests
        self._turn: dict[str, int] = defaultdict(int)  # model -> round-robin counter
        self._rings: dict[str, tuple[list[Backend], Ring]] = {}  # model -> (its backends, their ring)
        self.indexes: dict[str, PrefixIndex] = {}  # model -> prefix-score's index

    def pick(self, model: str, backends: list[Backend], exclude: Iterable[str] = ()) -> Backend | None:
        """The backend with the fewest outstanding requests, not in `exclude` (replica names)."""
        excluded = set(exclude)
        best: list[Backend] = []
        low = None
        for b in backends:
            if b.replica in excluded:
                continue
            n = self.inflight.get(b.replica, 0)
            if low is None or n < low:
                low, best = n, [b]
            elif n == low:
                best.append(b)
        if not best:
            return None
        if len(best) == 1:
            return best[0]
        turn = self._turn[model]
        self._turn[model] = turn + 1
        return best[turn % len(best)]

    def pick_hashed(self, model: str, backends: list[Backend], key: int, bound: float,
                    exclude: Collection[str] = ()) -> Backend | None:
        """prefix-hash: the first replica clockwise from `key` on the ring that stays within the
        load bound after taking the request (CHWBL)."""
        held = self._rings.get(model)
        if held is None or held[0] is not backends:  # the table gives a new list on every change
            held = self._rings[model] = (backends, Ring(b.replica for b in backends))
        by_name = {b.replica: b for b in backends if b.replica not in exclude}
        if not by_name:
            return None
        inflight = self.inflight
        limit = load_bound(sum(inflight.get(r, 0) for r in by_name), len(by_name), bound)
        for replica in held[1].order(key):
            b = by_name.get(replica)
            if b is not None and inflight.get(replica, 0) < limit:
                return b
        return None  # unreachable: some replica is always under the bound

    def pick_scored(self, model: str, backends: list[Backend], blocks: list[int], routing: RoutingSpec,
                    exclude: Collection[str] = ()) -> Backend | None:
        """prefix-score: among the replicas within the load bound, the highest
        (share of the prefix's blocks in the index) - (load / bound); the index then
        records that the choice was sent these blocks."""
        candidates = [b for b in backends if b.replica not in exclude]
        if not candidates:
            return None
        index = self.indexes.get(model)
        if index is None or index.max_bytes != routing.indexBytes:
            index = self.indexes[model] = PrefixIndex(routing.indexBytes)
        inflight = self.inflight
        limit = load_bound(sum(inflight.get(b.replica, 0) for b in candidates), len(candidates),
                           routing.loadBound)
        matched = index.matches(blocks, [b.replica for b in candidates])
        turn = self._turn[model]
        self._turn[model] = turn + 1
        best, high = None, None
        for i in range(len(candidates)):  # from a rotating start: equal scores take turns
            b = candidates[(turn + i) % len(candidates)]
            load = inflight.get(b.replica, 0)
            if load >= limit:
                continue
            score = matched[b.replica] / len(blocks) - load / limit
            if high is None or score > high:
                best, high = b, score
        if best is not None:
            index.record(blocks, best.replica)
        return best

    def acquire(self, b: Backend) -> None:
        self.inflight[b.replica] += 1
        self.model_of[b.replica] = b.model

    def release(self, b: Backend) -> None:
        n = self.inflight[b.replica] - 1
        if n <= 0:
            del self.inflight[b.replica]
            self.model_of.pop(b.replica, None)
        else:
            self.inflight[b.replica] = n
