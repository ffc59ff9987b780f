"""Direct loads of LoRA adapters (docs/gateway.md, "LoRA adapters"): a request for an adapter
resident nowhere has the gateway ask a replica's agent to load it at once, rather than wait for
the adapter controller to place it and the agent to see that.

When the first request for such an adapter starts waiting in its queue (`want`), and this gateway
is not loading it already (one load per burst: the requests after it wait in the same queue),
the gateway picks a Ready replica of its base whose engine loads adapters at runtime: one with a
free slot (by this gateway's table, the loads it has asked for counted as slots taken), the
emptiest first; else the one whose victim is best. A replica's victim is chosen by segmented LRU
among the adapters routed there that may go (none pinned, none on no more replicas than its
minReplicas but one loaded there directly and not yet recorded, none with a request in flight or
waiting here): those requested at least twice since this gateway loaded them are protected, the most
recently requested of them up to 80 % of the replica's slots; the victim is the least recently
requested unprotected one, else the least recently requested protected one; the best victim is
an unprotected one before a protected one, the least recently requested first. (Over the bench's
Zipf(1.1) draws into 64 slots one segmented LRU hits 0.65-0.66 where one LRU hits 0.60-0.61: an
adapter requested once does not push out one requested again and again.) Where the table says the replica
is full, the victim leaves that replica's routing first (until its status no longer names it
there). It asks the replica's rank-0 agent over mutual TLS with its own certificate (`POST
/adapters/<adapter>/load` on the agent's listener, its Node's status.agentEndpoint;
llmgw/agent/direct.py), naming the replica's victim, which the agent unloads first if its engine
is full (this gateway's table may be behind it: the victim the agent says it unloaded leaves that
replica's routing then; one that left it and the agent kept, its engine having room, is routed
there again). On the agent's 200 (its engine's) the adapter is routed there at once
(the table's `loaded`) and the waiting requests go; the control plane records it after (the
adapter controller adopts what the shard reports Loaded). Until its status says it is resident
there, or `hold` seconds pass, the gateway reports the adapter `loading` in its demand: the
controller then places it for demand on no replica of its own. A load that fails (an agent that
cannot be reached, no replica to take it, the engine's error) is logged, and tried again every
RETRY seconds while requests wait for the adapter and it is resident nowhere; meanwhile the demand
report says no `loading` and the controller places it: whichever lands first serves them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import Counter
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
RETRY = 1.0              # seconds before a failed direct load is tried again, while requests wait
PROTECTED = 0.8          # of a replica's slots, at most, the adapters its victims are not taken from first


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
    """`post(node, path, body)`: Agents.post; `waiting(model)`: the requests waiting for a model
    (the queue's, those let go and not yet in flight included); `on_change()`: after a load began
    or ended (the demand publisher reports at once)."""

    def __init__(self, table: RoutingTable, balancer: Balancer, post: Post, waiting: Callable[[str], int],
                 on_change: Callable[[], None] | None = None, hold: float = HOLD) -> None:
        self.table, self.balancer, self.post, self.waiting = table, balancer, post, waiting
        self.on_change, self.hold = on_change, hold
        # adapter -> (replica, victim named) of each load this gateway asks of an agent now
        self._asked: dict[str, tuple[str, str | None]] = {}
        self._again: set[str] = set()       # adapters to try again after RETRY
        self._loaded: dict[tuple[str, str], float] = {}   # (adapter, replica) -> when last loaded there
        self._tasks: set[asyncio.Task[None]] = set()

    def reported(self) -> dict[str, int]:
        """The demand report's `loading`: 1 for each adapter loading, or routed by a direct load alone."""
        return {a: 1 for a in self._asked.keys() | self.table.directly_loaded()}

    def want(self, model: str) -> None:
        """A request for `model` starts waiting (its queue's first): an adapter resident nowhere is
        loaded now (tried again every RETRY seconds while requests wait for it and it is resident
        nowhere); `on_change` is called either way (the demand report goes at once)."""
        entry = self.table.adapters.get(model)
        if entry is not None and model not in self.table.models and model not in self._asked \
                and not self.table.backends_for(model):
            pick = self._pick(entry.base)
            if pick is None:
                self._retry(model)
            else:
                b, victim, full = pick
                self._asked[model] = (b.replica, victim)
                self.balancer.sent[model] = time.monotonic()   # requested now
                self.balancer.sends[model] = 0                  # and counted again from its load
                if victim is not None and full:     # it goes: no more requests of this gateway go there
                    self.table.evicted(victim, b.replica, self.hold)
                task = asyncio.ensure_future(self._load(model, b, victim))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if self.on_change is not None:
            self.on_change()

    def _retry(self, model: str) -> None:
        if model not in self._again:
            self._again.add(model)
            asyncio.get_running_loop().call_later(RETRY, self._retried, model)

    def _retried(self, model: str) -> None:
        self._again.discard(model)
        if self.waiting(model):
            self.want(model)

    def _pick(self, base: str) -> tuple[Backend, str | None, bool] | None:
        """The replica to load on (the emptiest with a free slot by this gateway's table, its loads
        asked included; else the one whose victim is best: `_victim`), the adapter the agent is to
        unload there first if its engine is full (None: none may go), and whether the table says
        it is full."""
        replicas = [b for b in self.table.backends_for(base) if b.slots and b.node and b.engine in ENGINES
                    and (api := ENGINES[b.engine].lora) is not None and not api.at_start]
        held = self.table.held
        victims = {b.replica: self._victim(b.replica, held.get(b.replica, []), b.slots) for b in replicas}
        onto = Counter(replica for replica, _ in self._asked.values())   # loads asked of each (slots taken)

        def taken(b: Backend) -> int:
            return len(held.get(b.replica, ())) + onto[b.replica]
        free = [b for b in replicas if taken(b) < b.slots]
        pick = min(free, key=lambda b: (taken(b), self.balancer.inflight.get(b.replica, 0), b.replica)) if free \
            else min((b for b in replicas if victims[b.replica] is not None and onto[b.replica] < b.slots),
                     key=lambda b: (victims[b.replica], b.replica), default=None)
        if pick is None:
            return None
        victim = victims[pick.replica]
        return pick, victim[2] if victim is not None else None, not free

    def _victim(self, replica: str, held: list[str], slots: int) -> tuple[bool, float, str] | None:
        """A replica's victim by segmented LRU: of the adapters routed there that may go, those
        requested at least twice since this gateway loaded them are protected (the most recently
        requested of them, up to PROTECTED of the replica's slots); the least recently requested
        unprotected one goes, else the least recently requested protected one. (protected, last
        request, name), or None."""
        sent, sends = self.balancer.sent, self.balancer.sends
        ours = [(sent.get(v, 0.0), v) for v in held if self._evictable(v, replica)]
        repeated = sorted((t for t in ours if sends.get(t[1], 0) >= 2), reverse=True)[:int(slots * PROTECTED)]
        protected = {v for _, v in repeated}
        return min(((v in protected, at, v) for at, v in ours), default=None)

    def _evictable(self, adapter: str, replica: str) -> bool:
        """Whether the adapter may be a victim on the replica: not pinned, loaded there directly (its
        status does not say so yet) or resident on more replicas than its minReplicas, not loading or
        named a victim already, and no request for it in flight or waiting here. A direct load is
        taken as soon as its requests are served: kept until its status records it (0.3 to 0.6 s
        under the bench's churn), the adapters loaded last took the slots the victims should have
        come from, and older, busier ones went in their place."""
        entry = self.table.adapters[adapter]
        spare = replica in self.table.direct(adapter) or len(entry.resident) > entry.min_replicas
        return not entry.pinned and spare \
            and adapter not in self._asked and all(adapter != v for _, v in self._asked.values()) \
            and not self.balancer.per_model.get(adapter) and not self.waiting(adapter)

    async def _load(self, adapter: str, b: Backend, victim: str | None) -> None:
        entry = self.table.adapters[adapter]
        body = {"replica": b.replica, "digest": entry.digest, "victim": victim}
        started = time.monotonic()
        try:
            status, words = await self.post(b.node, f"/adapters/{quote(adapter)}/load", body)
        except Unreachable as err:
            status, words = 0, str(err)
        try:
            if status != 200:
                log.warning("direct load of adapter %s on %s failed (%s): %s; tried again in %.0fs while requests "
                            "wait, and meanwhile the adapter controller places it", adapter, b.replica,
                            status or "unreachable", words, RETRY)
                self._retry(adapter)
                return
            evicted = _evicted(words)
            if evicted is not None:
                self.table.evicted(evicted, b.replica, self.hold)   # no more requests of this gateway go there
            elif victim is not None:    # kept (its engine had room): routed there again, where it left routing
                self.table.kept(victim, b.replica)
            log.info("adapter %s loaded on %s directly in %.2fs%s", adapter, b.replica, time.monotonic() - started,
                     f", in the place of {evicted}" if evicted else "")
            at = self.balancer.sent[adapter] = time.monotonic()   # its requests go now
            self.table.loaded(adapter, b.replica)
            self._loaded[(adapter, b.replica)] = at
            asyncio.get_running_loop().call_later(self.hold, self._expire, adapter, b.replica, at)
        finally:
            del self._asked[adapter]
            if self.on_change is not None:
                self.on_change()

    def _expire(self, adapter: str, replica: str, at: float) -> None:
        """A direct load (that of `at`: not one there since) its status has not recorded in `hold`
        seconds is routed by the status alone."""
        if self._loaded.get((adapter, replica)) != at:
            return
        del self._loaded[(adapter, replica)]
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


def _evicted(words: str) -> str | None:
    """The victim an agent's 200 says it unloaded."""
    try:
        body = json.loads(words)
    except ValueError:
        return None
    evicted = body.get("evicted") if isinstance(body, dict) else None
    return evicted if isinstance(evicted, str) else None
