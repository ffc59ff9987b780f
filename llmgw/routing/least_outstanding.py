"""least-outstanding: the replica with the fewest requests in flight at this gateway; ties take turns."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from llmgw.routing.policy import R, RoutingParams, register


@register
class LeastOutstanding:
    name: ClassVar[str] = "least-outstanding"
    description: ClassVar[str] = "fewest requests in flight at this gateway."

    def __init__(self, params: RoutingParams) -> None:
        self._turn = 0   # round-robin among the replicas tied for the fewest

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> None:
        return None

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        best: list[R] = []
        low = None
        for b in replicas:
            if b.replica in exclude:
                continue
            n = inflight.get(b.replica, 0)
            if low is None or n < low:
                low, best = n, [b]
            elif n == low:
                best.append(b)
        if not best:
            return None
        if len(best) == 1:
            return best[0]
        turn = self._turn
        self._turn = turn + 1
        return best[turn % len(best)]

    def predicted(self, key: Any, replica: str) -> None:
        return None
