"""Objects in etcd: spec and status in separate keys, compare-and-swap on every update.

``Objects`` implements ``llmgw.api.ObjectClient`` on an ``Etcd``.
resourceVersion is the spec key's mod_revision; generation moves on spec
changes only; status writes touch only the status key. On a fenced ``Etcd``
(``Store.fenced``) every write also requires the leader key, so a deposed
controller-manager cannot write.
"""
from __future__ import annotations

import builtins
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, cast

from pydantic import BaseModel, ValidationError

from llmgw.api.client import StatusPatch, WatchEvent
from llmgw.api.compact import share_fields_set_of, share_fields_sets
from llmgw.api.manifests import parse_stored
from llmgw.api.meta import Condition, now, set_condition
from llmgw.api.selectors import Selector
from llmgw.api.types import KINDS, AnyObject, ObjectT, node_of
from llmgw.store import keys as K
from llmgw.store.errors import AlreadyExists, Conflict, NotFound
from llmgw.store.etcd import GREATER, MOD, VERSION, Etcd, KeyValue, as_bytes, compare, delete_op, get_op, put_op

Ops = builtins.list[Any]   # rpc.Compare or rpc.RequestOp messages of one transaction


def _status_class(kind: type[AnyObject]) -> type[BaseModel]:
    cls = kind.model_fields["status"].annotation
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise TypeError(f"{kind.__name__}.status is not a model")
    return cls


STATUS_CLASSES = {kind: _status_class(cls) for kind, cls in KINDS.items()}


def _spec_doc(obj: AnyObject) -> bytes:
    return obj.model_dump_json(exclude={"status": True, "metadata": {"resourceVersion"}}).encode()


def _status_doc(obj: AnyObject) -> bytes:
    status: BaseModel = obj.status
    return status.model_dump_json().encode()


def _assemble(spec_kv: KeyValue, status_value: bytes | None, revision: int) -> AnyObject:
    """The object from its spec kv and status document, as of store revision `revision`."""
    obj = parse_stored(spec_kv.value, status_value)
    share_fields_sets(obj)
    obj.metadata.resourceVersion = spec_kv.mod_revision
    return obj.at_revision(revision)


def _with_status(obj: AnyObject, status_cls: type[BaseModel], status_value: bytes,
                 revision: int) -> AnyObject | None:
    """`obj` (shared, not changed) with another status document, as of store revision `revision`.

    A third of the cost of decoding the whole object again. None when the status does
    not validate: decoding the whole object (parse_stored) says what is wrong.
    """
    try:
        status = status_cls.model_validate_json(status_value)
    except ValidationError:
        return None
    share_fields_sets(status)
    return share_fields_set_of(obj.model_copy(update={"status": status}), obj).at_revision(revision)


def _merge_status(current: dict[str, Any], patch: StatusPatch) -> dict[str, Any]:
    """Top-level fields replaced; conditions merged by type."""
    merged = dict(current)
    for field, value in patch.items():
        if field == "conditions":
            conds = [Condition.model_validate(c) for c in current.get("conditions", [])]
            for c in value:
                c = Condition.model_validate(c)
                set_condition(conds, c.type, c.status, c.reason, c.message, c.observedGeneration)
            merged["conditions"] = [c.model_dump(mode="json") for c in conds]
        else:
            merged[field] = value
    return merged




def _keys(kind: str, name: str, node: str | None) -> tuple[str, str]:
    return K.object_key(K.SPEC, kind, name, node), K.object_key(K.STATUS, kind, name, node)


class Documents:
    """The latest stored document per key, by the revision it was written at: a write
    at that revision needs no read first. Bounded; never goes back to an older one."""

    def __init__(self, limit: int = 100_000):
        self._docs: dict[str, tuple[int, bytes]] = {}
        self._limit = limit

    def get(self, key: str) -> tuple[int, bytes] | None:
        return self._docs.get(key)

    def put(self, key: str, revision: int, doc: bytes) -> None:
        docs = self._docs
        old = docs.get(key)
        if old is not None and old[0] > revision:
            return  # never replace a newer document with an older one
        docs[key] = (revision, doc)
        if len(docs) > self._limit:
            docs.pop(next(iter(docs)))


class Memory:
    """What a Store and its fenced views remember of the documents they saw."""

    def __init__(self) -> None:
        self.specs = Documents()
        self.statuses = Documents()


class WriteHook(Protocol):
    """What a kind's writes keep in step with them, in their own transaction: the served
    names of Models (llmgw.store.names) are the one today."""

    async def guard(self, before: Mapping[str, Any] | None, after: AnyObject | None) -> tuple[Ops, Ops] | None:
        """For a write from the stored spec document `before` (None: a create) to `after`
        (None: a delete): the compares and operations its transaction adds, or None when it
        needs none. Raises to refuse the write. Called again when only its compares failed."""
        ...


class Objects:
    """The ObjectClient on etcd. Kinds are classes (or, for callers holding only the name, plural names)."""

    def __init__(self, etcd: Etcd, memory: Memory):
        self.etcd = etcd
        self._memory = memory
        self.hooks: dict[type[AnyObject], WriteHook] = {}   # by kind; set by the Store

    async def revision(self, since: int | None = None) -> int:
        """etcd's current revision; with `since`, Compacted unless every change after it is still held."""
        return await self.etcd.revision(since)

    # ------------------------------------------------------------ reads

    async def _find_node(self, kind: str, name: str, node: str | None) -> str | None:
        """For node-scoped kinds, the node an object is keyed under (a scan when not given)."""
        if kind not in K.NODE_SCOPED or node:
            return node
        prefix = K.kind_prefix(K.SPEC, kind)
        resp = await self.etcd.range(prefix, K.prefix_end(prefix), keys_only=True)
        for kv in resp.kvs:
            parsed = K.parse_object_key(kv.key.decode())
            if parsed and parsed[3] == name:
                return parsed[2]
        raise NotFound(f"{kind}/{name} not found")

    async def _read(self, kind: str, name: str, node: str | None) -> tuple[AnyObject, int, int]:
        """(object, spec mod_revision, status mod_revision or 0), read atomically."""
        node = await self._find_node(kind, name, node)
        spec_key, status_key = _keys(kind, name, node)
        resp = await self.etcd.txn([], [get_op(spec_key), get_op(status_key)], writes=False)
        spec_kvs = resp.responses[0].response_range.kvs
        if not spec_kvs:
            raise NotFound(f"{kind}/{name} not found")
        spec: KeyValue = spec_kvs[0]
        status_kvs = resp.responses[1].response_range.kvs
        status: KeyValue | None = status_kvs[0] if status_kvs else None
        status_rev = status.mod_revision if status is not None else 0
        obj = _assemble(spec, status.value if status is not None else None, max(spec.mod_revision, status_rev))
        self._memory.specs.put(spec_key, spec.mod_revision, spec.value)
        if status is not None:
            self._memory.statuses.put(status_key, status.mod_revision, status.value)
        return obj, spec.mod_revision, status_rev


    async def get(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        # (cast: the key's prefix is the kind's; _assemble parsed the stored kind)
        return cast(ObjectT, (await self._read(kind.kind_plural, name, node))[0])


    async def list(self, kind: type[ObjectT], selector: str | dict[str, str] | None = None,
                   node: str | None = None) -> tuple[builtins.list[ObjectT], int]:
        """The matching objects and the revision they were read at (to watch from)."""
        sel = Selector.parse(selector)
        spec_prefix = K.kind_prefix(K.SPEC, kind.kind_plural, node)
        status_prefix = K.kind_prefix(K.STATUS, kind.kind_plural, node)
        resp = await self.etcd.txn([], [get_op(spec_prefix, K.prefix_end(spec_prefix)),
                                        get_op(status_prefix, K.prefix_end(status_prefix))], writes=False)
        statuses = {kv.key[len(status_prefix):]: kv for kv in resp.responses[1].response_range.kvs}
        items = []
        for kv in resp.responses[0].response_range.kvs:
            status = statuses.get(kv.key[len(spec_prefix):])
            obj = _assemble(kv, status.value if status else None,
                            max(kv.mod_revision, status.mod_revision if status else 0))
            if sel.matches(obj.metadata.labels):
                items.append(obj)
        revision: int = resp.header.revision
        return cast(builtins.list[ObjectT], items), revision

    # ------------------------------------------------------------ writes

    async def _write(self, obj: AnyObject, compares: Ops, success: Ops,
                     before: Mapping[str, Any] | None, after: AnyObject | None) -> Any:
        """One transaction of obj's write, with what its kind's hook adds (WriteHook). Lost
        only on the hook's compares (another write changed what it guards), it asks again."""
        hook = self.hooks.get(type(obj))
        for _ in range(20):
            guard = await hook.guard(before, after) if hook is not None else None
            if guard is None:
                return await self.etcd.txn(compares, success)
            checks, ops = guard
            resp = await self.etcd.txn([*compares, *checks], [*success, *ops])
            if resp.succeeded or not checks or not (await self.etcd.txn(compares, [], writes=False)).succeeded:
                return resp  # done, or the object's own compare failed: the caller says why
        raise Conflict(f"{obj.kind_plural}/{obj.name}: the keys its write keeps in step kept changing; re-run")

    async def create(self, obj: ObjectT) -> ObjectT:
        meta = obj.metadata.model_copy(update={
            "uid": obj.metadata.uid or str(uuid.uuid4()), "creationTimestamp": now(), "generation": 1,
            "resourceVersion": None, "deletionTimestamp": None})
        obj = obj.model_copy(update={"metadata": meta})
        spec_key, status_key = _keys(obj.kind_plural, meta.name, node_of(obj))
        spec_doc = _spec_doc(obj)
        # status first: a watcher sees the status put, then the spec put that completes the object
        resp = await self._write(
            obj, [compare(as_bytes(spec_key), VERSION, version=0)],
            [put_op(status_key, _status_doc(obj)), put_op(spec_key, spec_doc)], None, obj,
        )
        if not resp.succeeded:
            return await self._own_create(obj)
        revision: int = resp.header.revision
        meta.resourceVersion = revision
        self._memory.specs.put(spec_key, revision, spec_doc)
        self._memory.statuses.put(status_key, revision, _status_doc(obj))
        return obj.at_revision(revision)

    async def _own_create(self, obj: ObjectT) -> ObjectT:
        """The stored object when it is `obj` itself (the same uid), else AlreadyExists.

        A create that etcd committed just as its member died is sent again to the next
        member (Connection.call) and loses its compare to its own first attempt; the
        caller must see its create done, not a conflict it would answer with another create.
        """
        try:
            stored = await self.get(type(obj), obj.name, node_of(obj))
        except NotFound:
            stored = None
        if stored is None or stored.metadata.uid != obj.metadata.uid:
            raise AlreadyExists(f"{obj.kind_plural}/{obj.name} already exists")
        return stored

    async def _current_doc(self, kind: str, name: str, node: str | None,
                           revision: int) -> tuple[dict[str, Any], int]:
        spec_key = K.object_key(K.SPEC, kind, name, node)
        cached = self._memory.specs.get(spec_key)
        if cached and cached[0] == revision:
            return json.loads(cached[1]), revision
        resp = await self.etcd.range(spec_key)
        if not resp.kvs:
            raise NotFound(f"{kind}/{name} not found")
        kv: KeyValue = resp.kvs[0]
        self._memory.specs.put(spec_key, kv.mod_revision, kv.value)
        return json.loads(kv.value), kv.mod_revision

    async def update(self, obj: ObjectT) -> ObjectT:
        """Write spec and metadata, if obj's resourceVersion is still current (else Conflict)."""
        kind, name, node = obj.kind_plural, obj.metadata.name, node_of(obj)
        rv = obj.metadata.resourceVersion
        if rv is None:
            raise Conflict(f"{kind}/{name}: update needs metadata.resourceVersion")
        current, spec_rev = await self._current_doc(kind, name, node, rv)
        if spec_rev != rv:
            raise Conflict(f"{kind}/{name} changed since it was read (resourceVersion "
                           f"{rv}, now {spec_rev}): re-read and retry")
        cur_md = current["metadata"]
        new_doc = json.loads(_spec_doc(obj))
        md = new_doc["metadata"]
        # fields only the store sets
        for field in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
            md[field] = cur_md.get(field)
        if new_doc["spec"] != current["spec"]:
            md["generation"] = (cur_md.get("generation") or 0) + 1
        if new_doc == current:
            return obj  # nothing changed: no write, no new revision
        meta = obj.metadata.model_validate({**md, "resourceVersion": None})
        new = obj.model_copy(update={"metadata": meta})
        spec_key, status_key = _keys(kind, name, node)
        compares = [compare(as_bytes(spec_key), MOD, mod_revision=spec_rev)]
        if meta.deletionTimestamp is not None and not meta.finalizers:
            # the last finalizer went: the real delete
            resp = await self._write(new, compares, [delete_op(status_key), delete_op(spec_key)], current, None)
            if not resp.succeeded:
                raise Conflict(f"{kind}/{name} changed while being updated: re-read and retry")
            meta.resourceVersion = resp.header.revision
            return new.at_revision(resp.header.revision)
        spec_doc = json.dumps(new_doc, separators=(",", ":")).encode()
        resp = await self._write(new, compares, [put_op(spec_key, spec_doc)], current, new)
        if not resp.succeeded:
            raise Conflict(f"{kind}/{name} changed while being updated: re-read and retry")
        revision: int = resp.header.revision
        meta.resourceVersion = revision
        self._memory.specs.put(spec_key, revision, spec_doc)
        return new.at_revision(revision)

    async def update_status(self, obj: ObjectT) -> ObjectT:
        """Replace the status; spec, generation and resourceVersion stay as they are."""
        kind, name = obj.kind_plural, obj.metadata.name
        spec_key, status_key = _keys(kind, name, node_of(obj))
        resp = await self.etcd.txn([compare(as_bytes(spec_key), VERSION, GREATER, version=0)],
                                   [put_op(status_key, _status_doc(obj)), get_op(spec_key)])
        if not resp.succeeded:
            raise NotFound(f"{kind}/{name} not found")
        doc = _status_doc(obj)
        revision: int = resp.header.revision
        self._memory.statuses.put(status_key, revision, doc)
        stored = _assemble(resp.responses[1].response_range.kvs[0], doc, revision)
        if not isinstance(stored, type(obj)):
            raise TypeError(f"{spec_key} holds a {stored.kind}, not a {obj.kind}")
        return stored


    async def patch_status(self, kind: type[ObjectT], name: str, patch: StatusPatch,
                           node: str | None = None, *, current: ObjectT | None = None) -> ObjectT:
        return cast(ObjectT, await self._patch_status(kind.kind_plural, name, patch, node, current))

    async def _patch_status(self, kind: str, name: str, patch: StatusPatch, node: str | None,
                            current: AnyObject | None) -> AnyObject:
        """Atomically merge `patch` into the status: fields replaced, conditions merged by type.

        `current` is the caller's copy of the object (from a cache, say). While its spec
        is still the stored one and this Store has seen the stored status (its own
        writes, reads and watches remember it), the patch is one compare-and-swap with
        no read first, and the result is `current` with the new status. Otherwise, or
        when the compare fails, the object is read and the patch tried again.
        """
        if current is not None:
            node = node_of(current)
        node = await self._find_node(kind, name, node)
        spec_key, status_key = _keys(kind, name, node)
        status_cls = STATUS_CLASSES[kind]
        spec_rev = current.metadata.resourceVersion if current is not None else None
        known = self._memory.statuses.get(status_key) if spec_rev else None
        for _ in range(20):
            if known is None or current is None or spec_rev is None:
                current, spec_rev, status_rev = await self._read(kind, name, node)
                new_status = status_cls.model_validate(
                    _merge_status(current.status.model_dump(mode="json"), patch))
                if new_status == current.status:
                    return current
                doc = new_status.model_dump_json().encode()
            else:
                status_rev, raw = known
                new_status = status_cls.model_validate(_merge_status(json.loads(raw), patch))
                doc = new_status.model_dump_json().encode()
                if doc == raw:
                    known = None  # nothing to write as far as this Store knows: read to be sure
                    continue
            resp = await self.etcd.txn(
                [compare(as_bytes(spec_key), MOD, mod_revision=spec_rev),
                 compare(as_bytes(status_key), MOD, mod_revision=status_rev)],
                [put_op(status_key, doc)])
            if resp.succeeded:
                revision: int = resp.header.revision
                self._memory.statuses.put(status_key, revision, doc)
                return current.model_copy(update={"status": new_status}).at_revision(revision)
            known = None  # spec or status moved on, or the object is gone: read and retry
        raise Conflict(f"{kind}/{name}: status kept changing; patch not applied")


    async def delete(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        """Delete now, or set deletionTimestamp when finalizers remain (they go via update)."""
        return cast(ObjectT, await self._delete(kind.kind_plural, name, node))

    async def _delete(self, kind: str, name: str, node: str | None) -> AnyObject:
        node = await self._find_node(kind, name, node)
        for _ in range(20):
            obj, spec_rev, _ = await self._read(kind, name, node)
            spec_key, status_key = _keys(kind, name, node)
            compares = [compare(as_bytes(spec_key), MOD, mod_revision=spec_rev)]
            if obj.metadata.finalizers:
                if obj.metadata.deletionTimestamp is not None:
                    return obj
                obj.metadata.deletionTimestamp = now()
                resp = await self.etcd.txn(compares, [put_op(spec_key, _spec_doc(obj))])
            else:
                before = json.loads(_spec_doc(obj)) if type(obj) in self.hooks else None
                resp = await self._write(obj, compares, [delete_op(status_key), delete_op(spec_key)], before, None)
            if resp.succeeded:
                obj.metadata.resourceVersion = resp.header.revision
                return obj.at_revision(resp.header.revision)
        raise Conflict(f"{kind}/{name} kept changing; delete not applied")

    # ------------------------------------------------------------ watch


    def watch(self, kind: type[ObjectT], from_revision: int,
              node: str | None = None) -> AsyncIterator[WatchEvent[ObjectT]]:
        return cast(AsyncIterator[WatchEvent[ObjectT]], self._watch(kind.kind_plural, from_revision, node))

    async def _watch(self, kind: str, from_revision: int, node: str | None) -> AsyncIterator[WatchEvent[AnyObject]]:
        """Changes to objects of `kind` at or after from_revision, as whole objects.

        Raises Compacted when from_revision is no longer available (relist), and
        StoreUnavailable when the stream drops (re-watch from the last revision + 1).
        """
        spec_prefix = K.kind_prefix(K.SPEC, kind, node)
        status_prefix = K.kind_prefix(K.STATUS, kind, node)
        # One stream covering both prefixes keeps spec and status events in revision order.
        start, end = as_bytes(spec_prefix), K.prefix_end(status_prefix)
        Rel = tuple[str | None, str]     # (node, name)
        specs: dict[Rel, KeyValue] = {}            # the latest spec kv
        statuses: dict[Rel, bytes | None] = {}     # the latest status value
        latest: dict[Rel, AnyObject] = {}          # the object last yielded
        status_cls = STATUS_CLASSES[kind]
        remember_spec, remember_status = self._memory.specs.put, self._memory.statuses.put
        async for ev in self.etcd.events(start, end, from_revision, prev_kv=True):
            parsed = K.parse_object_key(ev.kv.key.decode())
            if parsed is None or parsed[1] != kind or (node is not None and parsed[2] != node):
                continue  # the range also spans other kinds' keys
            section, _, obj_node, name = parsed
            rel = (obj_node, name)
            spec_key, status_key = _keys(kind, name, obj_node)
            if section == K.SPEC:
                if ev.kind == "DELETE":
                    last = specs.pop(rel, None) or ev.prev_kv
                    status = statuses.pop(rel, None)
                    latest.pop(rel, None)
                    if last is None or not last.value:
                        continue
                    obj = _assemble(last, status, ev.kv.mod_revision)
                    obj.metadata.resourceVersion = ev.kv.mod_revision
                    yield WatchEvent("DELETED", obj, ev.kv.mod_revision)
                    continue
                specs[rel] = ev.kv
                remember_spec(spec_key, ev.kv.mod_revision, ev.kv.value)
                if rel not in statuses and ev.kv.version > 1:
                    statuses[rel] = await self._value_at(as_bytes(status_key), ev.kv.mod_revision)
                obj = latest[rel] = _assemble(ev.kv, statuses.get(rel), ev.kv.mod_revision)
                yield WatchEvent("ADDED" if ev.kv.version == 1 else "MODIFIED", obj, ev.kv.mod_revision)
            else:
                if ev.kind == "DELETE":
                    continue  # deleted together with its spec; the spec event reports it
                statuses[rel] = ev.kv.value
                remember_status(status_key, ev.kv.mod_revision, ev.kv.value)
                if ev.kv.version == 1:
                    continue  # created with its spec, which follows in the same transaction
                prev = latest.get(rel)
                # the spec is the one prev was built from: only the new status needs decoding
                changed = _with_status(prev, status_cls, ev.kv.value, ev.kv.mod_revision) if prev else None
                if changed is None:
                    spec = specs.get(rel)
                    if spec is None:
                        spec = await self._kv_at(as_bytes(spec_key), ev.kv.mod_revision)
                        if spec is None:
                            continue
                        specs[rel] = spec
                    changed = _assemble(spec, ev.kv.value, ev.kv.mod_revision)
                latest[rel] = changed
                yield WatchEvent("MODIFIED", changed, ev.kv.mod_revision)

    async def _kv_at(self, key: bytes, revision: int) -> KeyValue | None:
        resp = await self.etcd.range(key, revision=revision)
        return resp.kvs[0] if resp.kvs else None

    async def _value_at(self, key: bytes, revision: int) -> bytes | None:
        kv = await self._kv_at(key, revision)
        return kv.value if kv else None
