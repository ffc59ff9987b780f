"""A consistent-hash ring with virtual nodes, for prefix-hash routing with bounded loads.

Each replica owns VNODES points on a 64-bit ring (BLAKE2b of `name#i`, so every
gateway builds the same ring); a key goes to the first point at or after its
hash. A replica that joins takes only the keys that now land on its points (about
1/n of them); one that leaves gives away only its own. With bounded loads (CHWBL)
a key whose replica is at its bound goes on clockwise to the next replica under it.
"""
from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from collections.abc import Iterable

VNODES = 100


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class Ring:
    def __init__(self, replicas: Iterable[str], vnodes: int = VNODES):
        points = sorted((_point(f"{r}#{i}"), r) for r in set(replicas) for i in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [r for _, r in points]
        self._n = len(set(self._owners))
        self._orders: dict[int, list[str]] = {}  # point -> distinct replicas clockwise from it

    def order(self, key: int) -> list[str]:
        """Every replica, in the order a key visits them: its own first."""
        if not self._hashes:
            return []
        i = bisect_left(self._hashes, key) % len(self._hashes)
        order = self._orders.get(i)
        if order is None:
            order, seen, j = [], set(), i
            while len(order) < self._n:
                r = self._owners[j]
                if r not in seen:
                    seen.add(r)
                    order.append(r)
                j = (j + 1) % len(self._owners)
            self._orders[i] = order
        return order


def load_bound(total: int, n: int, c: float) -> int:
    """The most requests a replica may hold after taking one more: ceil(c x (total + 1) / n).
    Some replica is always under it (c >= 1), so a request is never refused for it."""
    return math.ceil(c * (total + 1) / n)
