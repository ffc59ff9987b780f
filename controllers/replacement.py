"""Make-before-break replacement of a replica, shared by drain and node lifecycle.

A replacement is a new Replica of the same model with the original's spec
(frozen profile, template hash) but no placement, its labels, owner
references and finalizers, and the annotation
`llmgw.io/draining-replacement-for: <original>` (llmgw/api/wellknown.py
describes how the model controller treats it). Its name derives from the
original's uid, so a controller that restarts, or works from a stale cache,
finds or re-creates the same one instead of making a second. A move called
off (drain withdrawn, lost node back) deletes a replacement that never served;
a Ready one drops the annotation and becomes an ordinary replica. The original,
once moved, goes by `delete_replica`, as drain and node loss delete a replica.
"""
from __future__ import annotations

import hashlib

from llmgw.api import AnyObject, ObjectMeta, Replica
from llmgw.api.errors import AlreadyExists, NotFound
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT
from llmgw.runtime.cache import Cache
from llmgw.runtime.controller import Context

# An event to record: its object, type, reason and message.
Record = tuple[AnyObject, str, str, str]


async def delete_replica(ctx: Context, rep: Replica, *events: Record, marked: Replica | None = None) -> None:
    """Delete `rep` (after writing `marked`, its copy that says why, where given), assume it deleted in
    the cache, and record `events`; one already gone is assumed deleted, with no event."""
    try:
        if marked is not None:
            await ctx.store.update(marked, current=rep)     # Conflict: the caller's key is retried
        gone = await ctx.store.delete(Replica, rep.metadata.name)
    except NotFound:
        ctx.cache.assume_deleted(Replica, rep.metadata.name)
        return
    ctx.cache.assume_deletion(gone)
    for event in events:
        ctx.events.record(*event)


def replacement_name(orig: Replica) -> str:
    digest = hashlib.sha1((orig.metadata.uid or orig.metadata.name).encode()).hexdigest()[:8]
    return f"{orig.spec.model[:50].rstrip('-')}-m{digest}"


def find_replacement(cache: Cache, orig: Replica) -> Replica | None:
    """The live replacement of `orig` in the cache, if any (reads the index REPLICAS_BY_MODEL)."""
    name = orig.metadata.name
    for r in cache.index(Replica, "model", orig.spec.model):
        if r.metadata.annotations.get(DRAINING_REPLACEMENT_FOR) == name and r.metadata.deletionTimestamp is None:
            return r
    return cache.get(Replica, replacement_name(orig))


async def ensure_replacement(ctx: Context, orig: Replica, why: str) -> Replica:
    """The replacement of `orig`: found, or created (and recorded as an event)."""
    found = find_replacement(ctx.cache, orig)
    if found is not None:
        return found
    md = orig.metadata
    annotations = {k: v for k, v in md.annotations.items() if k not in (DRAINING_REPLACEMENT_FOR, EVICT)}
    annotations[DRAINING_REPLACEMENT_FOR] = md.name
    new = Replica(
        metadata=ObjectMeta(
            name=replacement_name(orig), labels=dict(md.labels), annotations=annotations,
            finalizers=list(md.finalizers),
            ownerReferences=[o.model_copy() for o in md.ownerReferences],
        ),
        spec=orig.spec.model_copy(deep=True, update={"placement": []}),
    )
    try:
        created = await ctx.store.create(new)
        ctx.events.record(orig, "Normal", "ReplacementCreated",
                          f"{why}: created replacement {created.metadata.name}")
    except AlreadyExists:
        created = await ctx.store.get(Replica, new.metadata.name)
    ctx.cache.assume(created)
    return created


async def abandon_replacement(ctx: Context, repl: Replica) -> None:
    """The move is called off. A replacement that never served is deleted: kept, it would
    be one replica more than the model's maxSurge allows until the model controller
    scaled it down. A Ready one becomes an ordinary replica, and the model controller
    scales the surplus down (the replica that serves least goes first)."""
    try:
        if repl.status.phase != "Ready":
            gone = await ctx.store.delete(Replica, repl.metadata.name)
            ctx.events.record(repl, "Normal", "ReplacementCalledOff", "the move was called off before it served")
            ctx.cache.assume_deletion(gone)
            return
        plain = repl.model_copy(deep=True)
        plain.metadata.annotations.pop(DRAINING_REPLACEMENT_FOR, None)
        ctx.cache.assume(await ctx.store.update(plain, current=repl))   # Conflict: the caller's key is retried
    except NotFound:
        ctx.cache.assume_deleted(Replica, repl.metadata.name)
