"""This gateway's API keys' usage, as it reports it beside its demand (llmgw/api/usage.py).

Admission (admission.py) counts, per key and model, the requests admitted, the prompt and
completion tokens and the requests refused since the gateway started, and each key's last use.
Nothing here runs per request: each report (demand.py, at most once per interval; the usage
made again at most every PERIOD seconds) takes the change in those counts since it was last
made and adds it to the current slot of two rings, one
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
# A report's usage is made again at most this often (the minute window's slot): with a thousand
# keys all busy, making it costs some 20 ms of the event loop (2026-12-05, the 2-core machine).
PERIOD = 5.0

Counts = list[int]


class _Rings:
    """One key and model's counts as last reported, the slots of each window and their sums, and
    what was last reported of them (kept while nothing changes)."""

    __slots__ = ("seen", "rings", "sums", "shown")

    def __init__(self) -> None:
        self.seen: Counts = [0] * len(FIELDS)
        self.rings: tuple[deque[tuple[int, Counts]], ...] = tuple(deque() for _ in WINDOWS)
        self.sums: list[Counts] = [[0] * len(FIELDS) for _ in WINDOWS]
        self.shown: dict[str, dict[str, int]] | None = None

    def advance(self, counts: Counts, now: float) -> bool:
        """Add what changed since the last report to the current slots, drop the slots past each
        window; whether any figure moved."""
        changed = counts != self.seen
        delta = [c - s for c, s in zip(counts, self.seen, strict=True)] if changed else None
        if changed:
            self.seen = list(counts)
        moved = changed
        for i, ((_, width, slots), ring) in enumerate(zip(WINDOWS, self.rings, strict=True)):
            slot = int(now // width)
            while ring and ring[0][0] <= slot - slots:
                self.sums[i] = [a - b for a, b in zip(self.sums[i], ring.popleft()[1], strict=True)]
                moved = True
            if delta is not None:
                if ring and ring[-1][0] == slot:
                    ring[-1] = (slot, [a + b for a, b in zip(ring[-1][1], delta, strict=True)])
                else:
                    ring.append((slot, delta))
                self.sums[i] = [a + b for a, b in zip(self.sums[i], delta, strict=True)]
        return moved

    def usage(self) -> dict[str, dict[str, int]]:
        """The model's usage as reported: since start, and the windows that hold any."""
        return {"total": _tally(self.seen),
                **{name: _tally(w) for (name, _, _), w in zip(WINDOWS, self.sums, strict=True) if any(w)}}


def _tally(counts: Counts) -> dict[str, int]:
    return {f: n for f, n in zip(FIELDS, counts, strict=True) if n}


class UsageWindows:
    def __init__(self, counts: Mapping[tuple[str, str], Counts], last_used: Mapping[str, float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`counts`: (key, model) -> admission's counts since start; `last_used`: key -> time.time()."""
        self.counts, self.last_used, self.clock = counts, last_used, clock
        self._rings: dict[tuple[str, str], _Rings] = {}
        self._keys: dict[str, tuple[float | None, dict[str, Any], int]] = {}   # key -> (last use, entry, bytes)
        self._made: tuple[float, dict[str, Any]] | None = None   # the last report made, and when

    def report(self) -> dict[str, Any]:
        """The keys' usage as the demand report's ``keys`` (llmgw/api/usage.py's KeyUsage by name).
        Made again at most every PERIOD seconds, and then only what moved since."""
        now = self.clock()
        if self._made is not None and now - self._made[0] < PERIOD:
            return self._made[1]
        models: dict[str, dict[str, Any]] = {}
        moved: set[str] = set()
        for pair, counts in list(self.counts.items()):
            rings = self._rings.get(pair)
            if rings is None:
                rings = self._rings[pair] = _Rings()
            key, model = pair
            if rings.advance(counts, now) or rings.shown is None:
                rings.shown = rings.usage()
                moved.add(key)
            models.setdefault(key, {})[model] = rings.shown
        for key, by_model in models.items():
            used = self.last_used.get(key)
            cached = self._keys.get(key)
            if key in moved or cached is None or cached[0] != used:
                entry: dict[str, Any] = {"models": by_model}
                if used is not None:
                    entry["lastUsed"] = datetime.fromtimestamp(used, timezone.utc).isoformat()
                self._keys[key] = (used, entry, len(json.dumps(entry)) + len(key) + 6)   # "key": {...},
        out: dict[str, Any] = {}
        size = 2   # {}
        for key in sorted(models, key=lambda k: -self.last_used.get(k, 0.0)):
            _, entry, n = self._keys[key]
            size += n
            if size > MAX_REPORT_BYTES:
                break
            out[key] = entry
        self._made = (now, out)
        return out
