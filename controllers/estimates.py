"""Each profile's GPU memory estimate of a Model (issue 48), for the model controller: read once per
spec, in a thread beside the reconciles, never in one.

Where it is computed, and why there: the controller-manager creates a Model's replicas, and a
replica must carry its estimate before the scheduler sees it (ReplicaSpec.memory), so the estimate
is made before any node is chosen. Of the components that run before placement (the API server,
the controller-manager) only the controller-manager may read files and origins beside its work
(the API server stores objects and nothing else). It reads the model's own files (llmgw/fit.py):
a local directory or GGUF file it sees (a shared filesystem, the machine `llmgw dev up` runs on),
or a pulled source's heads by HTTP Range reads before any pull (llmgw/fitremote.py: its
HF_ENDPOINT and HF_TOKEN). The agents see the files only once a replica is placed on their node,
which is too late.

Off the hot path: a model's reconcile (every burst of its replicas' events) reads the estimate
from memory; the files are read in a worker thread once for each (uid, template, minContext) of the
Model, and again every RETRY_SECONDS while its source is a path not there yet. While
the first read runs, for at most READ_WAIT, the reconcile creates no replica, so none is placed by
its GPU count alone; the read's end enqueues the model again.

A profile has no estimate when the Model has no source, a path the controller-manager does not
see, an origin it cannot reach, or files that do not say enough (llmgw/fit.py's ShapeError: no
safetensors header, an unknown architecture): its replicas are placed by GPU count, as before, and
the Model's condition MemoryEstimated says why (False, reason NotEstimated).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.api import MemoryEstimate, Model, template_hash
from llmgw.api.patches import ConditionPatch, MemoryEstimatePatch, ProfileFitPatch
from llmgw.api.sources import parse_source
from llmgw.fit import Estimate, ShapeError, profile_estimate
from llmgw.fitremote import read_source

log = logging.getLogger("llmgw.controllers.estimates")

RETRY_SECONDS = 60.0
READ_WAIT = 15.0      # how long replicas wait for a first read (a hub that does not answer)
CONDITION = "MemoryEstimated"


@dataclass(frozen=True)
class NoEstimate:
    """Why a profile has no estimate: its replicas are placed by GPU count."""

    message: str
    retry: bool = False     # read again every RETRY_SECONDS: a path not there yet


ProfileResult = Estimate | NoEstimate


def estimate_model(model: Model, source: str) -> list[ProfileResult]:
    """Each profile's estimate from the files of the Model's `source` (read once: a local directory or
    GGUF file, or a pulled source's heads by HTTP Range reads), with its context floor; or why none."""
    n = len(model.spec.profiles)
    if parse_source(source) is None and not os.path.exists(source):
        return [NoEstimate(f"{source} is not a directory or file the controller-manager sees", retry=True)] * n
    try:
        shape = read_source(source)
    except ShapeError as err:
        return [NoEstimate(str(err))] * n
    out: list[ProfileResult] = []
    for i in range(n):
        try:
            out.append(profile_estimate(shape, model.spec, i))
        except ShapeError as err:    # a --kv-cache-dtype it does not know
            out.append(NoEstimate(str(err)))
    return out


def estimate_patch(est: Estimate) -> MemoryEstimatePatch:
    """The API's estimate. kvBytesPerToken counts sliding-window layers as full ones (the scheduler's
    token budget is then a lower bound); neededBytes counts them up to their window."""
    return {"tp": est.tp, "pp": est.pp, "weightsBytes": est.weights,
            "kvBytesPerToken": est.kv_per_token + est.kv_window_per_token,
            "overheadBytes": est.overhead, "minContext": est.min_context, "neededBytes": est.needed,
            "maxContext": est.max_context}


def api_estimate(est: Estimate) -> MemoryEstimate:
    """What a replica carries in spec.memory."""
    return MemoryEstimate(**estimate_patch(est))


def _key(model: Model) -> tuple[object, ...]:
    return model.metadata.uid, template_hash(model.spec), model.spec.minContext


@dataclass
class _Entry:
    key: tuple[object, ...]
    results: list[ProfileResult] | None = None       # None while the thread reads
    at: float = 0.0                           # when results were made
    started: float = 0.0                      # when the read began
    task: asyncio.Task[None] | None = None


class Estimates:
    """The model controller's estimates, per Model name, for one leadership term."""

    def __init__(self, wake: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._wake, self._clock = wake, clock
        self._entries: dict[str, _Entry] = {}

    def get(self, model: Model) -> list[ProfileResult] | None:
        """The Model's estimates per profile; None while its files are first read (the model is
        enqueued again once they are)."""
        source = model.spec.source
        if source is None:   # nothing to read (the sim's models): no key to hash either
            return [NoEstimate("no spec.source to read")] * len(model.spec.profiles)
        name, key = model.metadata.name, _key(model)
        entry = self._entries.get(name)
        if entry is not None and entry.key == key and (entry.results is None or not self._due(entry)):
            return entry.results
        kept = entry.results if entry is not None and entry.key == key else None   # a retry keeps them
        if entry is not None and entry.task is not None:
            entry.task.cancel()
        entry = self._entries[name] = _Entry(key, kept, started=self._clock())
        entry.task = asyncio.get_running_loop().create_task(self._read(name, entry, model, source))
        return kept

    def wait_left(self, name: str) -> float:
        """Seconds its replicas still wait for the first read of the Model's files (0: create them
        without an estimate)."""
        entry = self._entries.get(name)
        return 0.0 if entry is None else max(0.0, READ_WAIT - (self._clock() - entry.started))

    def _due(self, entry: _Entry) -> bool:
        """A source not there yet is looked for again every RETRY_SECONDS (a directory mounted later);
        files that were read and said too little, or an origin that failed, wait for the next spec."""
        return (entry.results is not None and any(isinstance(r, NoEstimate) and r.retry for r in entry.results)
                and self._clock() - entry.at >= RETRY_SECONDS)

    async def _read(self, name: str, entry: _Entry, model: Model, source: str) -> None:
        try:
            results = await asyncio.to_thread(estimate_model, model, source)
        except Exception as err:  # a bug in the estimate must not stop the replicas
            log.exception("model %s: estimate failed", name)
            results = [NoEstimate(f"the estimate failed: {err}")] * len(model.spec.profiles)
        entry.results, entry.at, entry.task = results, self._clock(), None
        self._wake(name)

    def forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None and entry.task is not None:
            entry.task.cancel()

    def stop(self) -> None:
        for name in list(self._entries):
            self.forget(name)


def fit_status(results: list[ProfileResult], context: dict[int, int], generation: int
               ) -> tuple[list[ProfileFitPatch], ConditionPatch]:
    """status.fit and the MemoryEstimated condition; `context`: profile -> the fewest KV tokens a
    placed replica of it was given."""
    fits: list[ProfileFitPatch] = []
    for i, r in enumerate(results):
        if isinstance(r, Estimate):
            fits.append({"profile": i, "estimate": estimate_patch(r), "contextTokens": context.get(i),
                         "message": r.summary()})
        else:
            fits.append({"profile": i, "estimate": None, "contextTokens": None,
                         "message": f"no estimate, placed by GPU count: {r.message}"})
    missing = [f"profile {f['profile']}: {f['message']}" for f in fits if f["estimate"] is None]
    cond: ConditionPatch = {
        "type": CONDITION, "status": "False" if missing else "True",
        "reason": "NotEstimated" if missing else "Estimated",
        "message": "; ".join(missing) if missing else "; ".join(f"profile {f['profile']}: {f['message']}"
                                                                  for f in fits),
        "observedGeneration": generation,
    }
    return fits, cond
