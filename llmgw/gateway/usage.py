"""This gateway's API keys' usage, as it reports it beside its demand (llmgw/api/usage.py).

Admission (admission.py) counts, per key and model, the requests admitted, the prompt and
completion tokens and the requests refused since the gateway started, and each key's last use.
Nothing here runs per request: each report (demand.py, at most once per interval) takes the
change in those counts since the last report and adds it to the current slot of two rings, one
of 5-second slots for the last minute and one of 1-minute slots for the last hour; a window's
figure is the sum of its ring (so "the last minute" is the last 55 to 60 seconds, to the
report's interval). The report names the keys used most recently first, up to
MAX_REPORT_BYTES of JSON, so it stays far below the API server's body limit (1 MiB) with many
keys: a key beyond that is left out of this gateway's figures.
"""
from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

FIELDS = ("requests", "promptTokens", "completionTokens", "rateLimited")   # admission.py's counts, in order
WINDOWS = (("lastMinute", 5.0, 12), ("lastHour", 60.0, 60))   # name, slot seconds, slots
MAX_REPORT_BYTES = 256 << 10

Counts = list[int]


class _Rings:
    """One key and model's counts as last reported, and the slots of each window."""

    __slots__ = ("seen", "rings")

    def __init__(self) -> None:
        self.seen: Counts = [0] * len(FIELDS)
        self.rings: tuple[deque[tuple[int, Counts]], ...] = tuple(deque() for _ in WINDOWS)

    def advance(self, counts: Counts, now: float) -> list[Counts]:
        """Add what changed since the last report to the current slots; each window's sums."""
        delta = [c - s for c, s in zip(counts, self.seen, strict=True)]
        changed = any(delta)
        if changed:
            self.seen = list(counts)
        sums = []
        for (_, width, slots), ring in zip(WINDOWS, self.rings, strict=True):
            slot = int(now // width)
            while ring and ring[0][0] <= slot - slots:
                ring.popleft()
            if changed:
                if ring and ring[-1][0] == slot:
                    ring[-1] = (slot, [a + b for a, b in zip(ring[-1][1], delta, strict=True)])
                else:
                    ring.append((slot, delta))
            sums.append([sum(col) for col in zip(*(c for _, c in ring), strict=True)] if ring else [0] * len(FIELDS))
        return sums


def _tally(counts: Counts) -> dict[str, int]:
    return {f: n for f, n in zip(FIELDS, counts, strict=True) if n}


class UsageWindows:
    def __init__(self, counts: Mapping[tuple[str, str], Counts], last_used: Mapping[str, float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`counts`: (key, model) -> admission's counts since start; `last_used`: key -> time.time()."""
        self.counts, self.last_used, self.clock = counts, last_used, clock
        self._rings: dict[tuple[str, str], _Rings] = {}

    def report(self) -> dict[str, Any]:
        """The keys' usage as the demand report's ``keys`` (llmgw/api/usage.py's KeyUsage by name)."""
        now = self.clock()
        keys: dict[str, dict[str, Any]] = {}
        for pair, counts in list(self.counts.items()):
            rings = self._rings.get(pair)
            if rings is None:
                rings = self._rings[pair] = _Rings()
            windows = rings.advance(counts, now)
            key, model = pair
            usage = {"total": _tally(counts),
                     **{name: _tally(w) for (name, _, _), w in zip(WINDOWS, windows, strict=True) if any(w)}}
            keys.setdefault(key, {"models": {}})["models"][model] = usage
        out: dict[str, Any] = {}
        size = 2   # {}
        for key in sorted(keys, key=lambda k: -self.last_used.get(k, 0.0)):
            used = self.last_used.get(key)
            if used is not None:
                keys[key]["lastUsed"] = datetime.fromtimestamp(used, timezone.utc).isoformat()
            size += len(json.dumps(keys[key])) + len(key) + 6   # "key": {...}, and a comma
            if size > MAX_REPORT_BYTES:
                break
            out[key] = keys[key]
        return out
