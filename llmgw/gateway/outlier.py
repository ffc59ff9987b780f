"""Passive outlier detection: a replica that keeps failing is left out of routing for a while.

The gateway learns of a sick replica before the control plane does: a partition between the
gateway and one engine (the agent still reaches it, so the replica stays Ready), an engine that
accepts connections and never answers, one that resets every connection. Without this, every
request that picks such a replica pays a connect or response timeout before its retry.

As Envoy's outlier detection: `threshold` failures in a row before a response starts (connect
errors, timeouts, disconnects; not an engine's 503, which is a loading or draining engine
saying so) eject the replica for `base` seconds, doubled at each ejection in a row up to `most`;
a response that starts resets the count. An ejected replica is tried again when its time is
up. Ejections never leave a model without a replica: when every candidate is ejected, all are
candidates (Envoy's panic threshold at its simplest).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable

log = logging.getLogger("llmgw.gateway.outlier")


class Outliers:
    def __init__(self, threshold: int = 3, base: float = 5.0, most: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold, self.base, self.most = threshold, base, most
        self._clock = clock
        self.failures: dict[str, int] = {}   # replica -> failures in a row (only while > 0)
        # replica -> (ejected until, ejections in a row); kept `most` seconds past its end, so that
        # a replica that fails again soon after is ejected for longer
        self.ejections: dict[str, tuple[float, int]] = {}

    def failed(self, replica: str) -> None:
        n = self.failures.get(replica, 0) + 1
        if n < self.threshold:
            self.failures[replica] = n
            return
        del self.failures[replica]
        times = self.ejections.get(replica, (0.0, 0))[1] + 1
        seconds = min(self.base * 2 ** (times - 1), self.most)
        self.ejections[replica] = (self._clock() + seconds, times)
        log.warning("replica %s ejected from routing for %gs: %d failures in a row before a response "
                    "(ejection %d in a row)", replica, seconds, n, times)

    def succeeded(self, replica: str) -> None:
        """A response started: the replica's streaks end."""
        self.failures.pop(replica, None)
        held = self.ejections.get(replica)
        if held is not None and held[0] <= self._clock():
            del self.ejections[replica]

    def excluded(self, replicas: Iterable[str], also: Collection[str] = ()) -> Collection[str]:
        """`also` plus the ejected ones among `replicas`, unless that would exclude every one."""
        if not self.ejections:
            return also
        now = self._clock()
        for name, (until, _) in list(self.ejections.items()):
            if until + self.most < now:
                del self.ejections[name]   # long over: forgotten (a replica gone for good too)
        names = list(replicas)
        out = set(also).union(n for n in names if n in self.ejections and self.ejections[n][0] > now)
        return also if all(n in out for n in names) else out
