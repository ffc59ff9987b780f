"""Served model names: /llmgw/names/<name> holds the Model that serves that name or alias.

A name or alias is served by one Model only. ``store.names`` is the write hook of Models
(``Objects.hooks``): a Model's create, an update that changes its names and its final delete
put and delete the keys of its names in the write's own transaction, on a compare that they
are as read just before. Of two writes claiming one name, the second fails its compare (the
batcher never puts two writes of one key in one request), reads again and gets NameTaken;
writes of different names never wait on each other.

``store.names.migrate()`` reserves the names of Models stored before reservations existed
(an older llmgw wrote the spec key alone); the API server runs it at start, so every stored
Model's names are keys before it serves a write, and a write reads only the keys of its names.
"""
from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmgw.api import AnyObject, Model
from llmgw.store import keys as K
from llmgw.store.errors import Conflict, NameTaken
from llmgw.store.etcd import MOD, VERSION, Etcd, KeyValue, as_bytes, compare, delete_op, get_op, put_op
from llmgw.store.objects import Ops

log = logging.getLogger("llmgw.store")

MIGRATE_ROUNDS = 5   # a round lost to a concurrent write reads everything again


def _stored_names(doc: Mapping[str, Any]) -> builtins.list[str]:
    """The names a stored Model spec document serves (Model.served_names, from its JSON)."""
    return [doc["metadata"]["name"], *doc["spec"].get("aliases", [])]


@dataclass
class Migration:
    """What ``migrate()`` did: names it reserved, and names two stored Models both served."""

    reserved: dict[str, str] = field(default_factory=dict)              # name -> Model
    conflicts: builtins.list[tuple[str, str, str]] = field(default_factory=list)   # (Model, name, holder)


class Names:
    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd

    async def guard(self, before: Mapping[str, Any] | None, after: AnyObject | None) -> tuple[Ops, Ops] | None:
        """The write hook: for a Model's write from the stored spec document `before` (None:
        a create) to `after` (None: a delete), the compares and writes that reserve the
        names it serves after and release those it no longer serves; None when its names
        do not change. NameTaken (naming the holder) when another Model holds one."""
        was = _stored_names(before) if before is not None else []
        if after is None:
            return await self._reserve(was[0], [], was) if was else None
        if not isinstance(after, Model):
            raise TypeError(f"served names are a Model's, not a {after.kind}'s")
        now = after.served_names
        if before is not None and was == now:
            return None
        return await self._reserve(after.name, now, [n for n in was if n not in now])

    async def _reserve(self, model: str, keep: builtins.list[str],
                       drop: builtins.list[str]) -> tuple[Ops, Ops]:
        names = [*keep, *drop]
        resp = await self._etcd.txn([], [get_op(K.served_name_key(n)) for n in names], writes=False)
        compares: Ops = []
        ops: Ops = []
        for n, r in zip(names, resp.responses, strict=True):
            key = as_bytes(K.served_name_key(n))
            kv: KeyValue | None = r.response_range.kvs[0] if r.response_range.kvs else None
            holder = kv.value.decode() if kv is not None else None
            if n in keep:
                if holder not in (None, model):
                    what = "its name" if n == model else "the alias"
                    theirs = "the name" if n == holder else "an alias"
                    raise NameTaken(f"Model {model!r}: {what} {n!r} is {theirs} of Model {holder!r}; "
                                    "a name or alias is served by one Model only")
                if kv is None:
                    compares.append(compare(key, VERSION, version=0))
                    ops.append(put_op(key, model.encode()))
                else:
                    compares.append(compare(key, MOD, mod_revision=kv.mod_revision))
            elif kv is not None and holder == model:
                compares.append(compare(key, MOD, mod_revision=kv.mod_revision))
                ops.append(delete_op(key))
        return compares, ops

    async def holders(self) -> dict[str, str]:
        """Every reserved name, with the Model that serves it."""
        resp = await self._etcd.range(K.NAMES, K.prefix_end(K.NAMES))
        return {kv.key.decode()[len(K.NAMES):]: kv.value.decode() for kv in resp.kvs}

    async def migrate(self) -> Migration:
        """Reserve the names of every stored Model that serves a name without its key.

        Two reads when there is nothing to do. Each Model's missing names are written in
        one transaction, on compares that its spec is as read and the names are still
        free; a lost compare (a write meanwhile) reads everything again. A name two stored
        Models both serve (possible only in data written before reservations) stays with
        the Model that holds it, or the first by name; the other is reported.
        """
        done = Migration()
        prefix = K.kind_prefix(K.SPEC, "models")
        for _ in range(MIGRATE_ROUNDS):
            resp = await self._etcd.txn([], [get_op(prefix, K.prefix_end(prefix)),
                                             get_op(K.NAMES, K.prefix_end(K.NAMES))], writes=False)
            held = {kv.key.decode()[len(K.NAMES):]: kv.value.decode() for kv in resp.responses[1].response_range.kvs}
            conflicts: builtins.list[tuple[str, str, str]] = []
            lost = False
            for kv in resp.responses[0].response_range.kvs:
                names = _stored_names(json.loads(kv.value))
                model = names[0]
                missing = [n for n in names if n not in held]
                conflicts += [(model, n, held[n]) for n in names if held.get(n, model) != model]
                if not missing:
                    continue
                keys = [as_bytes(K.served_name_key(n)) for n in missing]
                put = await self._etcd.txn(
                    [compare(kv.key, MOD, mod_revision=kv.mod_revision),
                     *(compare(k, VERSION, version=0) for k in keys)],
                    [put_op(k, model.encode()) for k in keys])
                if not put.succeeded:
                    lost = True
                    continue
                for n in missing:
                    held[n] = done.reserved[n] = model
            done.conflicts = conflicts
            if not lost:
                for model, name, holder in conflicts:
                    log.warning("Model %s serves %r, which Model %s holds: stored before names were "
                                "reserved; rename one", model, name, holder)
                return done
        raise Conflict("served names kept changing while being reserved; run again")
