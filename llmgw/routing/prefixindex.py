"""prefix-score's approximate index: which replicas were sent which prompt prefixes.

Keys are prefix.key_blocks' chained block hashes; each maps to a bit mask of the
replicas a request with that prefix was sent to. It is kept in least-recently-used
order and bounded in entries, so in memory: ENTRY_BYTES is what one entry costs
in CPython (measured with tracemalloc by the tests). Like an engine's cache it
forgets the coldest prefixes first; unlike one it never learns of an engine's
evictions, so it is an estimate, and routing weighs it against load.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

ENTRY_BYTES = 280  # at most; an OrderedDict grows in doublings, so it is often less
MAX_REPLICAS = 64  # distinct replica names before the index starts over (rollouts add names)


class PrefixIndex:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.max_entries = max(1, max_bytes // ENTRY_BYTES)
        self._entries: OrderedDict[int, int] = OrderedDict()  # block hash -> replicas' bits
        self._bits: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def matches(self, blocks: Sequence[int], replicas: Sequence[str]) -> dict[str, int]:
        """For each replica, how many of the leading blocks it was sent."""
        counts = dict.fromkeys(replicas, 0)
        bits = self._bits
        had = 0
        for r in replicas:
            had |= bits.get(r, 0)
        entries = self._entries
        n = 0
        for h in blocks:
            alive = had & entries.get(h, 0)
            if alive != had:  # some replicas' runs end at this block
                for r in replicas:
                    if had & ~alive & bits.get(r, 0):
                        counts[r] = n
                if not alive:
                    return counts
                had = alive
            n += 1
        for r in replicas:  # matched every block
            if had & bits.get(r, 0):
                counts[r] = n
        return counts

    def record(self, blocks: Sequence[int], replica: str) -> None:
        """`replica` was sent these blocks: they become the most recently used."""
        bit = self._bits.get(replica)
        if bit is None:
            if len(self._bits) >= MAX_REPLICAS:
                self._bits.clear()
                self._entries.clear()
            bit = self._bits[replica] = 1 << len(self._bits)
        entries = self._entries
        for h in blocks:
            entries[h] = entries.pop(h, 0) | bit
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
