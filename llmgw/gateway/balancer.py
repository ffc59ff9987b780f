"""Least-outstanding-requests balancing; ties go round-robin."""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from llmgw.gateway.table import Backend


class Balancer:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = defaultdict(int)  # replica -> outstanding requests
        self.model_of: dict[str, str] = {}  # replica -> model, while it has outstanding requests
        self._turn: dict[str, int] = defaultdict(int)  # model -> round-robin counter

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
