"""LoRA adapters on this node's engines (docs/contracts.md, "Adapters").

The agent watches the Adapters (`AdapterBook`); an Adapter's status.placement, written by the
adapter controller (controllers/adapter.py), names the replicas asked to hold it. For each serving
shard of a Model with spec.adapters (rank 0), `EngineAdapters.sync` makes its engine hold exactly
the adapters placed on its replica, through its engine's runtime API (the engine's LoraApi: vLLM's,
which the sim serves too, or SGLang's):

- what the engine holds is read from the engine itself (GET /v1/models: the cards with a
  parent), so an engine that restarted is seen empty and is loaded again (what
  it held before first, where more are placed on its replica than it has slots);
- an adapter's weights come through the node's weights cache (hf://, http(s)://; pinned while
  loaded; one pinned by spec.digest that the cache holds is read from it, its source not asked)
  or from its path; a loaded adapter whose weights changed (another digest: another
  path) is unloaded and loaded again;
- adapters no longer placed here are unloaded first, freeing their slots, once their Adapter no
  longer says they are resident here (what the gateways route by);
- pulls, then loads, of one sync go at once.

An engine that takes adapters only at start (llama-server) is given the Model's Adapters in
their start order when it starts (`start_weights`); its sync loads nothing and reports an
adapter placed there Loaded where the engine lists its weights at the adapter's id.

The runner syncs before its shard first reports Ready, so a Ready shard's status.adapters
already lists what it was asked to hold, and again whenever an Adapter placed or resident on its
replica changes (AdapterBook.on_change) or a probe interval passes; status.adapters is what the
engine listed after the sync, and the loads that failed with why.

A gateway may ask for a load at once (`EngineAdapters.load_direct`, llmgw/agent/direct.py): the
agent loads the adapter, unloading the victim the gateway names where the engine is full, before
the adapter controller has placed it. Such a load, and such an eviction, is the agent's own
intent (the book's `direct` and `evicted`) until the controller's placement agrees (it adopts
what the shard reports Loaded, and drops what it reports Evicted), or DIRECT_HOLD passes: a sync
keeps the one loaded and leaves the other unloaded meanwhile. A sync and a direct load's choice of
its slot take turns; direct loads run at once, as a sync's loads do.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from llmgw.api import LoraAdapter, Shard, ShardAdapter
from llmgw.api.sources import parse_source
from llmgw.engines.engine import LoraApi, start_order
from llmgw.weights.errors import PullError
from llmgw.weights.puller import Puller

log = logging.getLogger(__name__)

LOAD_TIMEOUT = 300.0     # seconds an engine gets to answer one load
# Seconds a direct load (or eviction) is held as this agent's own intent while the adapter
# controller has not recorded it: the controller's adapter_idle_seconds, by default.
DIRECT_HOLD = 300.0


class AdapterBook:
    """The cluster's Adapters as this agent's watch last saw them; `on_change(replicas)` after each
    change, with the replicas it may concern: those the adapter was or is placed or resident on."""

    def __init__(self) -> None:
        self.adapters: dict[str, LoraAdapter] = {}
        self.on_change: Callable[[set[str]], None] | None = None
        # replica -> the revision of the last change seen to the adapters placed on it (a shard's
        # status.adaptersSeen once its engine was synced to them)
        self.placement_seen: dict[str, int] = {}
        # (adapter, replica) -> when (monotonic) a gateway's direct load put it there / took it off,
        # while the Adapter's placement does not say so yet
        self.direct: dict[tuple[str, str], float] = {}
        self.evicted: dict[tuple[str, str], float] = {}
        # replica -> the adapters whose placement names it (a sync reads its replica's, not all)
        self.placed: dict[str, set[str]] = {}
        # replica -> the adapters its engine listed at the end of its last sync: an engine started
        # again (its replica rebuilt) is given these first where more are placed than it has slots
        self.listed: dict[str, set[str]] = {}

    def apply(self, type_: str, obj: LoraAdapter, revision: int) -> None:
        """A change of an Adapter, seen at that store revision (a list's, for a list's changes)."""
        old = self.adapters.get(obj.name)
        if type_ == "DELETED":
            self.adapters.pop(obj.name, None)
        else:
            self.adapters[obj.name] = obj
        after = set() if type_ == "DELETED" else set(obj.status.placement)
        before = set(old.status.placement) if old is not None else set()
        for replica in after ^ before:
            self.placement_seen[replica] = max(self.placement_seen.get(replica, 0), revision)
            names = self.placed.setdefault(replica, set())
            if replica in after:
                names.add(obj.name)
            else:
                names.discard(obj.name)
        for key in [k for k in self.direct if k[0] == obj.name and (k[1] in after or type_ == "DELETED")]:
            del self.direct[key]     # adopted: the placement holds it now
        for key in [k for k in self.evicted if k[0] == obj.name and (k[1] in before - after or type_ == "DELETED")]:
            del self.evicted[key]    # dropped there
        if self.on_change is not None:
            self.on_change(after | before | set(obj.status.resident) | set(old.status.resident if old else ()))

    def start_order(self, model: str) -> list[LoraAdapter]:
        """The Model's adapters in the order an engine that takes them at start numbers them."""
        mine = {a.name: a for a in self.adapters.values()
                if a.spec.baseModel == model and a.metadata.deletionTimestamp is None}
        return [mine[n] for n in start_order((created(a), a.name) for a in mine.values())]

    def resident_on(self, name: str, replica: str) -> bool:
        """Whether the Adapter of that name (existing, not being deleted) names the replica resident."""
        a = self.adapters.get(name)
        return a is not None and a.metadata.deletionTimestamp is None and replica in a.status.resident

    def wanted_on(self, shard: Shard) -> list[LoraAdapter]:
        """The adapters of the shard's model its engine is to hold, by name: those placed on its
        replica, less those this agent evicted there at a gateway's request, and those it loaded
        there at one, while the placement does not say so yet (DIRECT_HOLD at most)."""
        spec = shard.spec
        evicted, direct = self.held(self.evicted, spec.replica), self.held(self.direct, spec.replica)
        return sorted((a for n in self.placed.get(spec.replica, set()) | direct
                       if (a := self.adapters.get(n)) is not None and n not in evicted
                       and a.spec.baseModel == spec.model and a.metadata.deletionTimestamp is None),
                      key=lambda a: a.name)

    @staticmethod
    def held(intents: dict[tuple[str, str], float], replica: str) -> set[str]:
        """The adapters of a direct intent on the replica not yet past DIRECT_HOLD (older ones forgotten)."""
        now = time.monotonic()
        for key in [k for k, at in intents.items() if k[1] == replica and now - at > DIRECT_HOLD]:
            del intents[key]
        return {name for name, r in intents if r == replica}


class AdapterCounts:
    """The agent's series of its engines' adapters (docs/metrics.md), collected by its /metrics."""

    def __init__(self) -> None:
        self.loads = Counter("llmgw_agent_adapter_loads", "LoRA adapter loads into this node's engines, by base "
                             "model and result (loaded, failed)", ["model", "result"], registry=None)
        self.unloads = Counter("llmgw_agent_adapter_unloads", "LoRA adapters unloaded from this node's engines "
                               "(no longer placed there: evicted, moved, deleted, or reloaded with new weights)",
                               ["model"], registry=None)
        self.load_seconds = Histogram("llmgw_agent_adapter_load_seconds", "Time an engine took to load a LoRA "
                                      "adapter (its weights already on the node)", ["model"],
                                      registry=None, buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))

    def collect(self) -> Iterator[Metric]:
        for metric in (self.loads, self.unloads, self.load_seconds):
            yield from metric.collect()


class EngineError(Exception):
    """The engine refused or failed a request: its answer's message."""


class Refused(Exception):
    """A direct load refused: the HTTP status to answer the gateway, and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def created(a: LoraAdapter) -> int:
    """An Adapter's creation in whole seconds (as the gateway's table holds it)."""
    stamp = a.metadata.creationTimestamp
    return int(stamp.timestamp()) if stamp is not None else 0


class EngineAdapters:
    """One serving engine's adapters, loaded and unloaded through its runtime LoRA API."""

    def __init__(self, base_url: str, api: LoraApi, book: AdapterBook,
                 session: Callable[[], Awaitable[aiohttp.ClientSession]],
                 puller: Puller | None, model: str, counts: AdapterCounts) -> None:
        self.base_url = base_url.rstrip("/")
        self.api, self.book = api, book
        self._session = session
        self.puller = puller
        self.model, self.counts = model, counts
        self._pinned: dict[str, str] = {}   # adapter -> the cached digest its engine reads
        self._turn = asyncio.Lock()          # a sync, and a direct load's choice of its slot, one at a time
        self._loading: dict[str, asyncio.Future[None]] = {}   # direct loads in flight

    async def sync(self, shard: Shard, leaving: Callable[[list[ShardAdapter]], None]) -> list[ShardAdapter]:
        """Load what is placed on the shard's replica and missing, unload what is held and not
        placed; what the engine holds after (Loaded), and the loads that failed (Failed, why).
        Pulls, and then loads, go at once, not one after another: an engine restarted with eight
        adapters gets them in one load's time. What goes is first reported gone (`leaving(what
        stays)`), and is unloaded once its Adapter, as this agent's watch has it, no longer names
        the replica in status.resident: the gateways learn that from the same watch. The adapter
        controller takes a replica out of `resident` as it takes it out of `placement` (an eviction),
        or on the report that its engine no longer holds it (new weights); one still named stays
        until the sync that change of the Adapter brings. A load waits for a free slot likewise.
        What this agent evicted at a gateway's request and is still placed here is listed Evicted.
        What the engine holds, what goes, and the slots its loads take are decided in turn with the
        direct loads (`_turn`); the loads themselves run beside them."""
        wanted = self.book.wanted_on(shard)
        if self.api.at_start:
            return await self._started_with(wanted)
        paths, failed = await self._locate(wanted)
        async with self._turn:
            loads = await self._decide(shard, wanted, paths, failed, leaving)
        for a, task in loads:
            try:
                await asyncio.shield(task)
            except EngineError as err:
                failed[a.name] = ShardAdapter(name=a.name, digest=a.spec.digest, state="Failed", message=str(err))
        held = await self._listed()
        self.book.listed[shard.spec.replica] = set(held)
        digests = {a.name: a.spec.digest for a in wanted}
        loaded = [ShardAdapter(name=n, digest=digests.get(n), state="Loaded") for n in sorted(held)]
        evicted = [ShardAdapter(name=n, state="Evicted")
                   for n in sorted(self.book.held(self.book.evicted, shard.spec.replica) - set(held))]
        return loaded + [failed[n] for n in sorted(failed)] + evicted

    async def _decide(self, shard: Shard, wanted: list[LoraAdapter], paths: dict[str, str],
                      failed: dict[str, ShardAdapter], leaving: Callable[[list[ShardAdapter]], None]
                      ) -> list[tuple[LoraAdapter, asyncio.Future[None]]]:
        """A sync's unloads, and its loads started (each adapter with its load). A direct load
        asked for since `wanted` was read is not one to unload."""
        held = await self._listed()
        direct = self.book.held(self.book.direct, shard.spec.replica)
        going = [name for name in _going(held, paths, failed) if name not in direct]
        if going:
            digests = {a.name: a.spec.digest for a in wanted}
            leaving([ShardAdapter(name=n, digest=digests.get(n), state="Loaded") for n in sorted(held)
                     if n not in going])
        for name in going:
            if self.book.resident_on(name, shard.spec.replica):
                continue    # a gateway may still send it requests: when the Adapter says not, next sync
            await self._unload(name)
            del held[name]
        slots = shard.spec.adapters.maxLoaded if shard.spec.adapters is not None else 0
        # What its engine held before (one started again), then the placed ones, first: the controller
        # may place an adapter on a replica whose engine is full of direct loads not yet adopted.
        before = self.book.listed.get(shard.spec.replica, set())
        missing = sorted((a for a in wanted if a.name in paths and a.name not in held and a.name not in self._loading),
                         key=lambda a: (a.name not in before, shard.spec.replica not in a.status.placement))
        missing = missing[:max(0, slots - len(held) - len(self._loading))]
        return [(a, self._start(a, paths[a.name])) for a in missing]

    def _start(self, a: LoraAdapter, where: str) -> asyncio.Future[None]:
        """A load begun, counted in `_loading` (a slot taken) until it ends."""
        task = self._loading[a.name] = asyncio.ensure_future(self._load(a, where))
        task.add_done_callback(lambda _: self._loading.pop(a.name, None))
        return task

    async def load_direct(self, shard: Shard, name: str, digest: str | None, victim: str | None) -> str | None:
        """Load the adapter into the engine now, at a gateway's request, before its placement says
        so; where the engine is full, unload `victim` first (one the engine holds). Returns, once the
        engine answered its load 200, the victim if it was unloaded; raises Refused with the status
        and words to answer."""
        a = self.book.adapters.get(name)
        if a is None or a.metadata.deletionTimestamp is not None or a.spec.baseModel != shard.spec.model:
            raise Refused(404, f"no Adapter {name} of model {shard.spec.model} known to this agent")
        if digest != a.spec.digest:
            raise Refused(409, f"Adapter {name} has digest {a.spec.digest}, not {digest}: this agent's view "
                               "of it differs from the gateway's; ask again once they agree")
        if self.api.at_start or not self.api.load:
            raise Refused(409, f"the engine of {shard.spec.replica} takes adapters only at start")
        replica = shard.spec.replica
        paths, failed = await self._locate([a])
        if name in failed:
            raise Refused(502, failed[name].message)
        evicted = None
        async with self._turn:     # what the engine holds and loads now, and a slot taken, at once
            pending = self._loading.get(name)
            if pending is None:
                held = await self._listed()
                if held.get(name) == paths[name]:
                    self._intend(a, replica)
                    return None
                if name in held:    # other weights: loaded again
                    await self._unload(name)
                    del held[name]
                slots = shard.spec.adapters.maxLoaded if shard.spec.adapters is not None else 0
                if len(held) + len(self._loading) >= slots:
                    if victim is None or victim not in held:
                        raise Refused(409, f"the engine of {replica} has no free slot (it holds "
                                           f"{', '.join(sorted(held))}, and loads {len(self._loading)} more) and "
                                           f"the victim named ({victim}) is not one it holds")
                    await self._unload(victim)
                    evicted = victim
                    self.book.direct.pop((victim, replica), None)
                    self.book.evicted[(victim, replica)] = time.monotonic()
                    log.info("adapter %s unloaded from %s for %s, at a gateway's request", victim, self.base_url,
                             name)
                self._intend(a, replica)
                pending = self._start(a, paths[name])
        try:
            await asyncio.shield(pending)
        except EngineError as err:
            self.book.direct.pop((name, replica), None)
            raise Refused(502, str(err)) from None
        return evicted

    def _intend(self, a: LoraAdapter, replica: str) -> None:
        """The engine is to hold it: no longer evicted there, and held as a direct load until a
        change of its Adapter places it there (this agent's view of the placement may be behind
        the controller's: one that names the replica now may be a drop on its way)."""
        self.book.evicted.pop((a.name, replica), None)
        self.book.direct[(a.name, replica)] = time.monotonic()

    async def _load(self, a: LoraAdapter, where: str) -> None:
        """One load into the engine (raises EngineError with its words), counted."""
        started = time.monotonic()
        try:
            await self._post(self.api.load or "", {"lora_name": a.name, "lora_path": where})
        except EngineError:
            self.counts.loads.labels(self.model, "failed").inc()
            self._unpin(a.name)
            raise
        self.counts.loads.labels(self.model, "loaded").inc()
        self.counts.load_seconds.labels(self.model).observe(time.monotonic() - started)
        log.info("adapter %s loaded from %s on %s", a.name, where, self.base_url)

    async def _unload(self, name: str) -> None:
        await self._post(self.api.unload or "", {"lora_name": name})
        self.counts.unloads.labels(self.model).inc()
        self._unpin(name)

    async def start_weights(self, adapters: list[LoraAdapter]) -> list[str]:
        """The weights on this node of the adapters an engine that takes them at start is given, in
        their order, up to the first that cannot be had (those after it would take its id)."""
        paths, failed = await self._locate(adapters)
        for a in adapters:
            if a.name in failed:
                log.warning("adapter %s: %s; it and those after it are not given to %s", a.name,
                            failed[a.name].message, self.base_url)
                break
        given = [paths[a.name] for a in itertools.takewhile(lambda a: a.name in paths, adapters)]
        for a in adapters[len(given):]:
            self._unpin(a.name)
        return given

    async def _started_with(self, wanted: list[LoraAdapter]) -> list[ShardAdapter]:
        """What an engine that took its adapters at start holds of those placed here: an adapter is
        Loaded where the engine lists its weights at its id (its place in the start order)."""
        held = await self._slots()
        paths, failed = await self._locate(wanted)
        order = [a.name for a in self.book.start_order(self.model)]
        out: list[ShardAdapter] = []
        for a in wanted:
            if a.name in failed:
                out.append(failed[a.name])
                continue
            slot = order.index(a.name) if a.name in order else -1
            if slot >= 0 and held.get(slot) == paths[a.name]:
                out.append(ShardAdapter(name=a.name, digest=a.spec.digest, state="Loaded"))
            else:
                out.append(ShardAdapter(name=a.name, digest=a.spec.digest, state="Failed", message=(
                    f"this engine takes adapters only at start and did not start with this one at id "
                    f"{slot} (it holds {len(held)}): it is given it when it starts again")))
        return out

    async def _slots(self) -> dict[int, str]:
        """llama-server's GET /lora-adapters: each adapter's id -> its path."""
        body = await self._get(self.api.listed)
        return {int(e["id"]): str(e.get("path") or "") for e in body if isinstance(e, dict) and "id" in e} \
            if isinstance(body, list) else {}

    async def _locate(self, wanted: list[LoraAdapter]) -> tuple[dict[str, str], dict[str, ShardAdapter]]:
        """Each wanted adapter's weights on this node (its path), or why they are not."""
        paths: dict[str, str] = {}
        failed: dict[str, ShardAdapter] = {}

        async def locate(a: LoraAdapter) -> None:
            try:
                paths[a.name] = await self._weights(a)
            except (PullError, EngineError) as err:
                failed[a.name] = ShardAdapter(name=a.name, digest=a.spec.digest, state="Failed",
                                              message=f"pull {a.spec.source}: {err}")
        await asyncio.gather(*(locate(a) for a in wanted))
        return paths, failed

    async def _weights(self, a: LoraAdapter) -> str:
        """The adapter's weights on this node: its path, or its pulled source's cached copy (pinned).
        An adapter pinned by spec.digest whose digest the cache holds is read from the cache
        (touched), whatever source pulled it: its source is not asked again (the hub's listing),
        and a source that cannot be reached now does not fail it."""
        source = parse_source(a.spec.source)
        if source is None:
            return a.spec.source
        if self.puller is None:
            raise EngineError("this agent has no weights cache")
        digest = a.spec.digest
        path = self.puller.cache.take(digest) if digest is not None else None
        if digest is None or path is None:
            pulled = await self.puller.pull(source, digest).task
            digest, path = pulled.digest, pulled.path
        if self._pinned.get(a.name) != digest:
            self._unpin(a.name)
            self.puller.cache.pin(digest)
            self._pinned[a.name] = digest
        return str(path)

    def _unpin(self, name: str) -> None:
        digest = self._pinned.pop(name, None)
        if digest is not None and self.puller is not None:
            self.puller.cache.unpin(digest)

    def release(self) -> None:
        """The engine is gone: its adapters' weights are no longer read."""
        for name in list(self._pinned):
            self._unpin(name)

    async def _listed(self) -> dict[str, str]:
        """The adapters the engine lists (GET /v1/models: the cards with a parent) -> their path."""
        body = await self._get(self.api.listed)
        cards = body.get("data", []) if isinstance(body, dict) else []
        return {str(card["id"]): str(card.get("root") or "") for card in cards
                if isinstance(card, dict) and card.get("parent")}

    async def _get(self, path: str) -> Any:
        session = await self._session()
        try:
            async with session.get(f"{self.base_url}{path}") as resp:
                if resp.status != 200:
                    raise EngineError(f"GET {path}: {resp.status} {await resp.text()}")
                return await resp.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as err:
            raise EngineError(f"GET {path}: {err}") from None

    async def _post(self, path: str, body: dict[str, str]) -> None:
        session = await self._session()
        try:
            async with session.post(f"{self.base_url}{path}", json=body,
                                    timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT)) as resp:
                if resp.status != 200:
                    raise EngineError(_message(await resp.text()) or f"{path}: HTTP {resp.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise EngineError(f"{path}: {err}") from None


def _going(held: dict[str, str], paths: dict[str, str], failed: dict[str, ShardAdapter]) -> list[str]:
    """The held adapters not wanted here, or wanted from other weights now."""
    return [name for name, path in sorted(held.items()) if paths.get(name) != path and name not in failed]


def _message(text: str) -> str:
    """An engine's error body's message (vLLM's {"error": {"message": ...}} or its older flat one,
    SGLang's {"success": false, "error_message": ...})."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(body, dict) and isinstance(body.get("error_message"), str):
        return str(body["error_message"])
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return text.strip()
