"""Direct loads of LoRA adapters (docs/gateway.md, "LoRA adapters"): a request for an adapter
resident nowhere has the gateway ask a replica's agent to load it at once, rather than wait for
the adapter controller to place it and the agent to see that.

When the first request for such an adapter starts waiting in its queue (`want`), and this gateway
is not loading it already (one load per burst: the requests after it wait in the same queue),
the gateway picks a Ready replica of its base whose engine loads adapters at runtime: one with a
free slot (by this gateway's table), the emptiest first; else the one whose least recently
requested adapter (`victim`: none pinned, none kept on no more than its minReplicas, none with a
request in flight here) was requested longest ago. It takes the victim out of that replica's
routing first, then asks the replica's rank-0 agent over mutual TLS with its own certificate
(`POST /adapters/<adapter>/load` on the agent's listener, its Node's status.agentEndpoint;
llmgw/agent/direct.py). On the agent's 200 (its engine's) the adapter is routed there at once
(the table's `loaded`) and the waiting requests go; the control plane records it after (the
adapter controller adopts what the shard reports Loaded). Until its status says it is resident
there, or `hold` seconds pass, the gateway reports the adapter `loading` in its demand: the
controller then places it for demand on no replica of its own. A load that fails (an agent that
cannot be reached, no replica to take it, the engine's error) is logged and left to the
controller, which places it as the demand report, without `loading`, asks.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from llmgw.api import Node
from llmgw.client import ApiError, Client
from llmgw.engines import ENGINES
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.table import Backend, RoutingTable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
LOAD_TIMEOUT = 120.0     # seconds an agent gets to answer a load (a pull of the weights included)
HOLD = 60.0              # seconds a direct load is routed before the Adapter's status records it


class Unreachable(Exception):
    """The agent could not be asked: why."""


class Agents:
    """Posts to the agents' listeners: each node's found at its Node's status.agentEndpoint (read
    once, and again after a failure to reach it), over mutual TLS (`tls`: the gateway's own
    certificate, the agent's verified against the cluster CA)."""

    def __init__(self, client: Client, tls: ssl.SSLContext) -> None:
        self.client, self.tls = client, tls
        self._endpoints: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None

    async def post(self, node: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """The agent's status and words; raises Unreachable."""
        endpoint = self._endpoints.get(node) or await self._endpoint(node)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.tls),
                timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT, sock_connect=CONNECT_TIMEOUT))
        try:
            async with self._session.post(endpoint + path, json=body) as resp:
                return resp.status, (await resp.text())[:2000]
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            self._endpoints.pop(node, None)
            raise Unreachable(f"the agent of node {node} at {endpoint}: {err or type(err).__name__}") from None

    async def _endpoint(self, node: str) -> str:
        try:
            endpoint = (await self.client.get(Node, node)).status.agentEndpoint
        except ApiError as err:
            raise Unreachable(f"node {node}: {err}") from None
        if not endpoint:
            raise Unreachable(f"node {node}'s agent has no listener (--logs-listen)")
        self._endpoints[node] = endpoint
        return endpoint

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


Post = Callable[[str, str, dict[str, Any]], Any]   # Agents.post


class DirectLoads:
    """`post(node, path, body)`: Agents.post; `on_change()`: after a load began or ended (the
    demand publisher reports at once)."""

    def __init__(self, table: RoutingTable, balancer: Balancer, post: Post,
                 on_change: Callable[[], None] | None = None, hold: float = HOLD) -> None:
        self.table, self.balancer, self.post = table, balancer, post
        self.on_change, self.hold = on_change, hold
        self.loading: set[str] = set()      # adapters this gateway asks an agent to load now
        self._tasks: set[asyncio.Task[None]] = set()

    def reported(self) -> dict[str, int]:
        """The demand report's `loading`: 1 for each adapter loading, or routed by a direct load alone."""
        return {a: 1 for a in self.loading | {a for a in self.table.adapters if self.table.direct(a)}}

    def want(self, model: str) -> None:
        """A request for `model` starts waiting (its queue's first): an adapter resident nowhere is
        loaded now; `on_change` is called either way (the demand report goes at once)."""
        entry = self.table.adapters.get(model)
        if entry is not None and model not in self.table.models and model not in self.loading \
                and not self.table.backends_for(model) and (pick := self._pick(entry.base)) is not None:
            self.loading.add(model)
            task = asyncio.ensure_future(self._load(model, *pick))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.on_change is not None:
            self.on_change()

    def _pick(self, base: str) -> tuple[Backend, str | None] | None:
        """The replica to load on, and the adapter to unload there first (None: a free slot)."""
        replicas = [b for b in self.table.backends_for(base) if b.slots and b.node and b.engine in ENGINES
                    and (api := ENGINES[b.engine].lora) is not None and not api.at_start]
        held = self.table.held
        free = [b for b in replicas if len(held.get(b.replica, ())) < b.slots]
        if free:
            return min(free, key=lambda b: (len(held.get(b.replica, ())), self.balancer.inflight.get(b.replica, 0),
                                            b.replica)), None
        victims = [(self.balancer.sent.get(v, 0.0), b.replica, b, v) for b in replicas
                   for v in held.get(b.replica, ()) if self._evictable(v)]
        if not victims:
            return None
        _, _, b, victim = min(victims, key=lambda t: (t[0], t[1], t[3]))
        return b, victim

    def _evictable(self, adapter: str) -> bool:
        entry = self.table.adapters[adapter]
        return not entry.pinned and len({*entry.resident, *self.table.direct(adapter)}) > entry.min_replicas \
            and adapter not in self.loading and not self.balancer.per_model.get(adapter)

    async def _load(self, adapter: str, b: Backend, victim: str | None) -> None:
        entry = self.table.adapters[adapter]
        if victim is not None:
            self.table.unloaded(victim, b.replica)   # no more requests of this gateway go there
        body = {"replica": b.replica, "digest": entry.digest, "victim": victim}
        started = time.monotonic()
        try:
            status, words = await self.post(b.node, f"/adapters/{quote(adapter)}/load", body)
        except Unreachable as err:
            status, words = 0, str(err)
        try:
            if status != 200:
                log.warning("direct load of adapter %s on %s failed (%s): %s; the adapter controller places it",
                            adapter, b.replica, status or "unreachable", words)
                return
            log.info("adapter %s loaded on %s directly in %.2fs%s", adapter, b.replica, time.monotonic() - started,
                     f", in the place of {victim}" if victim else "")
            self.table.loaded(adapter, b.replica)
            asyncio.get_running_loop().call_later(self.hold, self._expire, adapter, b.replica)
        finally:
            self.loading.discard(adapter)
            if self.on_change is not None:
                self.on_change()

    def _expire(self, adapter: str, replica: str) -> None:
        """A direct load its status has not recorded in `hold` seconds is routed by the status alone."""
        if replica in self.table.direct(adapter):
            log.warning("adapter %s: loaded on %s directly %.0fs ago, and its status does not say so yet: routed "
                        "by its status alone", adapter, replica, self.hold)
            self.table.unloaded(adapter, replica)
            if self.on_change is not None:
                self.on_change()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
