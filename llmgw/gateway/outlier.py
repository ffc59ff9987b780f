"""Passive outlier detection: a replica that keeps failing is left out of routing for a while.

The gateway learns of a sick replica before the control plane does: a partition between the
gateway and one engine (the agent still reaches it, so the replica stays Ready), an engine that
accepts connections and never answers, one that resets every connection. Without this, every
request that picks such a replica pays a connect or response timeout before its retry.

As Envoy's outlier detection: `threshold` failures in a row before a response starts (connect
errors, timeouts, disconnects; not an engine's 503, which is a loading or draining engine
saying so) eject the replica for `base` seconds; a connect that timed out ejects at once (an
engine on the fleet's network answers a connect in milliseconds: one that does not is cut
off). A response that starts resets the count. When an ejection's time is up the replica is
not handed requests to find out: a probe connects to its engine first, and only a connect
that succeeds returns it to routing; a probe that fails ejects it again for twice as long, up
to `most` (passive detection, active recovery). Ejections never leave a model without a
replica: when every candidate is ejected, all are candidates (Envoy's panic threshold at its
simplest). `on_eject(endpoint)` is told of each ejection (the gateway sends the tries still
waiting there for their headers elsewhere, as Envoy resets an ejected host's requests).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass

log = logging.getLogger("llmgw.gateway.outlier")


@dataclass
class _Ejection:
    until: float          # monotonic; then a probe decides
    times: int            # ejections in a row
    endpoint: str
    probing: bool = False
    back: bool = False    # a probe connected: routed again (kept `most` s to double the next one)


class Outliers:
    def __init__(self, probe: Callable[[str], Awaitable[bool]], threshold: int = 3, base: float = 5.0,
                 most: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 on_eject: Callable[[str], None] | None = None) -> None:
        self.probe = probe    # whether a connection to the endpoint opens
        self.on_eject = on_eject
        self.threshold, self.base, self.most = threshold, base, most
        self._clock = clock
        self.failures: dict[str, int] = {}   # replica -> failures in a row (only while > 0)
        self.ejections: dict[str, _Ejection] = {}
        self._probes: set[asyncio.Task[None]] = set()

    def failed(self, replica: str, endpoint: str, at_once: bool = False) -> None:
        n = self.failures.get(replica, 0) + 1
        if n < self.threshold and not at_once:
            self.failures[replica] = n
            return
        self.failures.pop(replica, None)
        held = self.ejections.get(replica)
        if held is not None and not held.back:
            return   # ejected already (a try that began before it)
        self._eject(replica, endpoint, (held.times if held else 0) + 1,
                    f"{n} failure(s) in a row before a response" + (" (a connect timed out)" if at_once else ""))

    def _eject(self, replica: str, endpoint: str, times: int, why: str) -> None:
        seconds = min(self.base * 2 ** (times - 1), self.most)
        self.ejections[replica] = _Ejection(self._clock() + seconds, times, endpoint)
        log.warning("replica %s (%s) ejected from routing for %gs: %s (ejection %d in a row)", replica, endpoint,
                    seconds, why, times)
        if self.on_eject is not None:
            self.on_eject(endpoint)

    def succeeded(self, replica: str) -> None:
        """A response started: the replica's streaks end."""
        self.failures.pop(replica, None)
        held = self.ejections.get(replica)
        if held is not None and held.back:
            del self.ejections[replica]

    def excluded(self, replicas: Iterable[str], also: Collection[str] = ()) -> Collection[str]:
        """`also` plus the ejected ones among `replicas`, unless that would exclude every one; a
        probe starts for each whose time is up."""
        if not self.ejections:
            return also
        now = self._clock()
        out = set(also)
        names = list(replicas)
        for name in names:
            held = self.ejections.get(name)
            if held is None or held.back:
                continue
            out.add(name)
            if held.until <= now and not held.probing:
                held.probing = True
                task = asyncio.get_running_loop().create_task(self._probe(name, held))
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
        for name, held in list(self.ejections.items()):
            if held.back and held.until + self.most < now:
                del self.ejections[name]   # long over: forgotten (a replica gone for good too)
        return also if all(n in out for n in names) else out

    async def _probe(self, replica: str, held: _Ejection) -> None:
        ok = await self.probe(held.endpoint)
        if self.ejections.get(replica) is not held:
            return
        if ok:
            held.back, held.probing = True, False
            log.warning("replica %s (%s) routed again: its engine accepts connections", replica, held.endpoint)
        else:
            self._eject(replica, held.endpoint, held.times + 1, "its engine still does not accept connections")

    def close(self) -> None:
        for task in list(self._probes):
            task.cancel()
