"""A shard's pull phase: a pulled source's weights into the node's cache before its engine starts.

The shard reports Pulling with its bytes done and total while the pull runs (shared with any other
shard of this node pulling the same source), then the engine is rendered on the cached copy (the
path the engines' renderers pass as the model path). A failed pull fails the shard with the
condition Pulled=False and the pull's reason (llmgw/weights/errors.py); its engine never starts.
A path source is the engine's as it is.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.api import PullStatus, Shard, ShardStatus, set_condition
from llmgw.api.sources import parse_source
from llmgw.weights.errors import PullError
from llmgw.weights.puller import Puller

REPORT_EVERY = 1.0       # seconds between progress reports while pulling
PULLED = "Pulled"        # the shard condition of its weights' pull


class Report(Protocol):
    def __call__(self, phase: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class Weights:
    shard: Shard              # as its engine sees it: a pulled source is the cached copy's path
    digest: str | None        # the cached digest it uses (pinned in the cache), None for a path


async def weights_for(shard: Shard, status: ShardStatus, puller: Puller | None, report: Report,
                      stop: asyncio.Event) -> Weights | None:
    """The shard with its weights on this node; None when the pull failed (reported) or the
    shard was deleted meanwhile."""
    source = parse_source(shard.spec.source) if shard.spec.source else None
    if source is None:
        return Weights(shard, None)
    if puller is None:
        report("Failed", message=f"{shard.spec.source}: this agent has no weights cache")
        return None
    while True:
        pull = puller.pull(source, shard.spec.digest)
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not pull.task.done():
                p = pull.progress
                report("Pulling", message=f"pulling {_named(source.text, p.resolved)}: {p.done} of "
                       f"{p.total or '?'} bytes",
                       pull=PullStatus(digest=p.digest, bytesDone=p.done, bytesTotal=p.total))
                await asyncio.wait({pull.task, stopped}, timeout=REPORT_EVERY, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    return None     # the pull goes on for others, or into the cache for next time
        finally:
            stopped.cancel()
        try:
            pulled = pull.task.result()
        except PullError as err:
            conditions = [c.model_copy() for c in status.conditions]
            set_condition(conditions, PULLED, "False", err.reason, err.message)
            report("Failed", message=f"pull {source.text}: {err}", conditions=conditions)
            return None
        if puller.cache.has(pulled.digest):  # else evicted before this shard woke: pull again
            break
    puller.cache.pin(pulled.digest)
    conditions = [c.model_copy() for c in status.conditions]
    set_condition(conditions, PULLED, "True", "Cached",
                  f"{_named(source.text, pulled.resolved)} is {pulled.digest} at {pulled.path}")
    total = pull.progress.total
    report("Pulling", message=f"{source.text} is in the cache", conditions=conditions,
           pull=PullStatus(digest=pulled.digest, bytesDone=total, bytesTotal=total))
    spec = shard.spec.model_copy(update={"source": str(pulled.path)})
    return Weights(shard.model_copy(update={"spec": spec}), pulled.digest)


def _named(source: str, resolved: str | None) -> str:
    """The source, and what it resolved to where that says more (a hub branch's commit)."""
    return f"{source} ({resolved})" if resolved and resolved.startswith("hf://") and resolved != source else source
