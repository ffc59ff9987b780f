"""The gateway's demand, reported to the server for the autoscaler (docs/contracts.md, "Autoscaling").

Per model: the requests in flight at this gateway (its Balancer's count) and those waiting in its
queue for a replica or a concurrency slot (queue.py). A report goes out when the figures changed,
at most once per ``interval`` seconds, and at least once per ``ttl / 3`` seconds to keep its
lease: a gateway that dies or is cut off has its figures expire with the lease, ``ttl`` seconds
after its last report. ``poke()`` sends the next report at once: the gateway pokes when a model's
first request starts waiting, so a model at zero is scaled up by the first request of a burst,
not after an interval (and by one report, not one per request).

A gateway with API keys sends their usage in the same report (``keys``, usage.py), which the
server keeps beside the demand under the same lease; it changes the report as the demand does,
so it adds no report beyond the same bound.

The server answers a report with the number of live reports, the gateways (this one included):
``on_gateways(n)`` hands it on, to share each API key's limits among them (admission.py).

``stop()`` withdraws the report (and the usage beside it), as Kubernetes' leader election
releases its lease on a graceful shutdown: the other gateways take back this one's share of each
limit at their next report, and the autoscaler stops counting its figures, without waiting out the
lease (a restart, a rolling upgrade). It waits at most WITHDRAW_TIMEOUT seconds for the server:
one that does not answer leaves the report to expire with its lease, and the gateway exits.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from llmgw.backoff import Backoff
from llmgw.gateway.balancer import Balancer

log = logging.getLogger("llmgw.gateway.demand")

WITHDRAW_TIMEOUT = 2.0   # seconds a stopping gateway waits for its report's withdrawal
Figures = dict[str, dict[str, int]]   # model -> {"inFlight": n, "waiting": m[, "loading": 1]}


class DemandSink(Protocol):
    """Where reports go: llmgw.client.Client's report_demand, and withdraw_demand."""

    async def report_demand(self, gateway: str, models: Figures, ttl: int | None = None,
                            keys: dict[str, Any] | None = None, metrics: str | None = None) -> dict[str, Any]: ...

    async def withdraw_demand(self, gateway: str) -> None: ...


def figures(balancer: Balancer, waiting: Mapping[str, int] | None = None,
            loading: Mapping[str, int] | None = None) -> Figures:
    """This gateway's demand per model: the balancer's requests in flight, `waiting` (per model),
    and `loading` (per adapter loaded directly and not yet recorded: loads.py; sent only where set)."""
    out: Figures = {}
    for model, n in balancer.per_model.items():
        out[model] = {"inFlight": n, "waiting": 0}
    for model, n in (waiting or {}).items():
        out.setdefault(model, {"inFlight": 0, "waiting": 0})["waiting"] = n
    for model, n in (loading or {}).items():
        out.setdefault(model, {"inFlight": 0, "waiting": 0})["loading"] = n
    return out


class DemandPublisher:
    def __init__(self, sink: DemandSink, gateway: str, read: Callable[[], Figures], *,
                 interval: float = 1.0, ttl: int = 15, on_gateways: Callable[[int], None] | None = None,
                 keys: Callable[[], dict[str, Any]] | None = None, metrics: str | None = None) -> None:
        """`keys()`: the API keys' usage, sent in the same report (usage.py), by a gateway with keys;
        `metrics`: the HOST:PORT of its GET /metrics, announced in each report."""
        self.sink, self.gateway, self.read, self.keys, self.metrics = sink, gateway, read, keys, metrics
        self.on_gateways = on_gateways
        self.interval, self.ttl = interval, ttl
        self.reports = 0          # reports the server accepted
        self._task: asyncio.Task[None] | None = None
        self._sending: asyncio.Future[dict[str, Any]] | None = None   # the last report sent
        self._poked = asyncio.Event()

    def poke(self) -> None:
        """Report now rather than at the end of the interval."""
        self._poked.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="demand-publisher")

    async def stop(self) -> None:
        """Stop reporting, and withdraw the report (waiting WITHDRAW_TIMEOUT s at most)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        try:
            await asyncio.wait_for(self._withdraw(), WITHDRAW_TIMEOUT)
        except Exception as err:  # noqa: BLE001 - the server away: the report expires with its lease
            log.warning("demand report not withdrawn (%s); it expires with its lease, in %d s at most",
                        err or type(err).__name__, self.ttl)

    async def _withdraw(self) -> None:
        # A report in flight is answered first: the server would write it after the withdrawal,
        # on a lease of its own, alive for a ttl.
        if self._sending is not None:
            await asyncio.gather(self._sending, return_exceptions=True)
        await self.sink.withdraw_demand(self.gateway)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(self.interval, self.ttl / 3)
        last: tuple[Figures, dict[str, Any] | None] | None = None
        sent_at = 0.0
        while True:
            now = (self.read(), self.keys() if self.keys is not None else None)
            if now != last or loop.time() - sent_at >= self.ttl / 3:
                try:
                    # shielded: stop() cancels this task, not the report it waits for (_withdraw)
                    self._sending = asyncio.ensure_future(self.sink.report_demand(
                        self.gateway, now[0], ttl=self.ttl, metrics=self.metrics,
                        **({"keys": now[1]} if now[1] is not None else {})))
                    reply = await asyncio.shield(self._sending)
                except Exception as err:  # noqa: BLE001 - the server away: report again, backing off
                    delay = backoff.next()
                    log.warning("demand report failed (%s); again in %.1fs", err, delay)
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                gateways = reply.get("gateways")
                if self.on_gateways is not None and isinstance(gateways, int):
                    self.on_gateways(gateways)
                last, sent_at = now, loop.time()
                self.reports += 1
            try:
                await asyncio.wait_for(self._poked.wait(), self.interval)
            except TimeoutError:
                pass
            self._poked.clear()
