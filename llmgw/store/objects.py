"""Objects in etcd: spec and status in separate keys, compare-and-swap on every update.

``Objects`` implements ``llmgw.api.ObjectClient`` on an ``Etcd``.
resourceVersion is the spec key's mod_revision; generation moves on spec
changes only; status writes touch only the status key, and an object created with
the default status has no status key until its status is first written. On a
fenced ``Etcd`` (``Store.fenced``) every write also requires the leader key, so a
deposed controller-manager cannot write.

Nothing raw is kept beside the decoded objects (issue 34: a controller-manager holds
every object of a fleet): a decoded object carries the mod revisions of its two keys
(resourceVersion and its status revision), and a write that starts from the caller's
copy (``current``) is a compare-and-swap on them with no read first.
"""
from __future__ import annotations

import builtins
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol, cast

from pydantic import BaseModel, ValidationError

from llmgw.api import KINDS, AnyObject, ObjectT, node_of
from llmgw.api.client import StatusPatch, WatchEvent
from llmgw.api.compact import share_fields_set_of, share_fields_sets
from llmgw.api.manifests import parse_stored
from llmgw.api.meta import Condition, now, set_condition
from llmgw.api.selectors import Selector
from llmgw.api.storage import convert, stale
from llmgw.store import keys as K
from llmgw.store.errors import AlreadyExists, Conflict, NotFound
from llmgw.store.etcd import (
    GREATER,
    MOD,
    VERSION,
    Etcd,
    KeyValue,
    Lineage,
    as_bytes,
    compare,
    delete_op,
    get_op,
    put_op,
)

Ops = builtins.list[Any]   # rpc.Compare or rpc.RequestOp messages of one transaction
Held = Callable[[str], AnyObject | None]   # a watcher's own copy of an object, by name (Objects.watch)


def _status_class(kind: type[AnyObject]) -> type[BaseModel]:
    cls = kind.model_fields["status"].annotation
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise TypeError(f"{kind.__name__}.status is not a model")
    return cls


STATUS_CLASSES = {kind: _status_class(cls) for kind, cls in KINDS.items()}
# The default status of each kind as stored: a create with it writes no status key
DEFAULT_STATUS_DOCS = {kind: cls().model_dump_json().encode() for kind, cls in STATUS_CLASSES.items()}


def _spec_doc(obj: AnyObject) -> bytes:
    return obj.model_dump_json(exclude={"status": True, "metadata": {"resourceVersion"}}).encode()


def _status_doc(obj: AnyObject) -> bytes:
    status: BaseModel = obj.status
    return status.model_dump_json().encode()


def _decode(spec_kv: KeyValue, status_doc: bytes | None, status_revision: int, revision: int) -> AnyObject:
    """The object from its spec kv and status document (None: not stored), as of store revision
    `revision`, its status written at `status_revision` (0: no status key)."""
    obj = parse_stored(spec_kv.value, status_doc)
    share_fields_sets(obj)
    obj.metadata.resourceVersion = spec_kv.mod_revision
    return obj.at_revision(revision, status_revision)


def _assemble(spec_kv: KeyValue, status_kv: KeyValue | None, revision: int) -> AnyObject:
    """The object from its spec kv and status kv (None: no status key), as of store revision `revision`."""
    if status_kv is None:
        return _decode(spec_kv, None, 0, revision)
    return _decode(spec_kv, status_kv.value, status_kv.mod_revision, revision)


def _restatused(obj: AnyObject, status: BaseModel, revision: int, status_revision: int) -> AnyObject:
    """`obj` (shared, not changed) with `status`, written at `status_revision`, as of `revision`;
    the copy and the status share their fields sets (it may stay in a cache, and a watch's)."""
    share_fields_sets(status)
    return share_fields_set_of(obj.model_copy(update={"status": status}), obj).at_revision(revision, status_revision)


def _with_status(obj: AnyObject, status_cls: type[BaseModel], status_kv: KeyValue) -> AnyObject | None:
    """`obj` (shared, not changed) with another status, written at the status kv's revision.

    A third of the cost of decoding the whole object again. None when the status does
    not validate: decoding the whole object (parse_stored) says what is wrong.
    """
    try:
        status = status_cls.model_validate_json(status_kv.value)
    except ValidationError:
        return None
    return _restatused(obj, status, status_kv.mod_revision, status_kv.mod_revision)


def _with_spec(obj: AnyObject, spec_kv: KeyValue) -> AnyObject:
    """A new spec document for `obj`, whose status (shared, not changed) stays as it is."""
    new = _decode(spec_kv, None, obj._status_revision, spec_kv.mod_revision)
    new.status = obj.status
    return new


def _spec_dict(obj: AnyObject) -> dict[str, Any]:
    """The spec document of `obj` as JSON values."""
    return obj.model_dump(mode="json", exclude={"status": True, "metadata": {"resourceVersion"}})


def _patched(status: BaseModel, patch: StatusPatch) -> BaseModel:
    """`status` (not changed) with `patch` applied: top-level fields replaced, conditions merged by type.

    Only the patch is validated (every status field has a default and no status has a
    validator across its fields, so the patch alone says whether its values are well typed),
    not the whole status again; a field the status does not have is a ValidationError.
    """
    cls = type(status)
    merge = "conditions" in patch and "conditions" in cls.model_fields
    given = {k: v for k, v in patch.items() if not (merge and k == "conditions")}
    valid = cls.model_validate(given) if given else None
    update = {k: getattr(valid, k) for k in given}
    if merge:
        conds: list[Condition] = list(getattr(status, "conditions"))  # noqa: B009 - mypy sees a BaseModel
        for c in patch["conditions"]:
            c = Condition.model_validate(c)
            set_condition(conds, c.type, c.status, c.reason, c.message, c.observedGeneration)
        update["conditions"] = conds
    return status.model_copy(update=update)




def _keys(kind: str, name: str, node: str | None) -> tuple[str, str]:
    return K.object_key(K.SPEC, kind, name, node), K.object_key(K.STATUS, kind, name, node)


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

    def __init__(self, etcd: Etcd):
        self.etcd = etcd
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

    async def _read(self, kind: str, name: str, node: str | None) -> AnyObject:
        """The object, its spec and status read atomically."""
        node = await self._find_node(kind, name, node)
        spec_key, status_key = _keys(kind, name, node)
        resp = await self.etcd.txn([], [get_op(spec_key), get_op(status_key)], writes=False)
        spec_kvs = resp.responses[0].response_range.kvs
        if not spec_kvs:
            raise NotFound(f"{kind}/{name} not found")
        spec: KeyValue = spec_kvs[0]
        status_kvs = resp.responses[1].response_range.kvs
        status: KeyValue | None = status_kvs[0] if status_kvs else None
        return _assemble(spec, status, max(spec.mod_revision, status.mod_revision if status is not None else 0))


    async def get(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        # (cast: the key's prefix is the kind's; _assemble parsed the stored kind)
        return cast(ObjectT, await self._read(kind.kind_plural, name, node))


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
            obj = _assemble(kv, status, max(kv.mod_revision, status.mod_revision if status else 0))
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
        status_doc = _status_doc(obj)
        # A default status is not stored (one write less per object; reads and watches
        # give the default). Any other goes first: a watcher sees the status put, then
        # the spec put that completes the object.
        with_status = status_doc != DEFAULT_STATUS_DOCS[obj.kind_plural]
        puts = [put_op(status_key, status_doc)] if with_status else []
        resp = await self._write(obj, [compare(as_bytes(spec_key), VERSION, version=0)],
                                 [*puts, put_op(spec_key, _spec_doc(obj))], None, obj)
        if not resp.succeeded:
            return await self._own_create(obj)
        revision: int = resp.header.revision
        meta.resourceVersion = revision
        return obj.at_revision(revision, revision if with_status else 0)

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
                           revision: int, current: AnyObject | None) -> tuple[dict[str, Any], int]:
        """The stored spec document, in its kind's current version (llmgw.api.storage: a write
        that changes nothing else writes nothing), and its revision: `current`'s when it is the
        object at `revision` (the caller's unchanged copy), else read."""
        if current is not None and current.metadata.resourceVersion == revision:
            return _spec_dict(current), revision
        resp = await self.etcd.range(K.object_key(K.SPEC, kind, name, node))
        if not resp.kvs:
            raise NotFound(f"{kind}/{name} not found")
        kv: KeyValue = resp.kvs[0]
        return convert(json.loads(kv.value)), kv.mod_revision

    async def update(self, obj: ObjectT, *, current: ObjectT | None = None) -> ObjectT:
        """Write spec and metadata, if obj's resourceVersion is still current (else Conflict).

        `current` is the caller's copy of the object as stored at that resourceVersion (from
        a cache; `obj` is a changed copy of it, `current` itself never changed in place): the
        write is then one compare-and-swap with no read first.
        """
        kind, name, node = obj.kind_plural, obj.metadata.name, node_of(obj)
        rv = obj.metadata.resourceVersion
        if rv is None:
            raise Conflict(f"{kind}/{name}: update needs metadata.resourceVersion")
        stored, spec_rev = await self._current_doc(kind, name, node, rv, current)
        if spec_rev != rv:
            raise Conflict(f"{kind}/{name} changed since it was read (resourceVersion "
                           f"{rv}, now {spec_rev}): re-read and retry")
        cur_md = stored["metadata"]
        new_doc = _spec_dict(obj)
        md = new_doc["metadata"]
        # fields only the store sets
        for field in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
            md[field] = cur_md.get(field)
        if new_doc["spec"] != stored["spec"]:
            md["generation"] = (cur_md.get("generation") or 0) + 1
        if new_doc == stored:
            return obj  # nothing changed: no write, no new revision
        meta = obj.metadata.model_validate({**md, "resourceVersion": None})
        new = obj.model_copy(update={"metadata": meta})
        spec_key, status_key = _keys(kind, name, node)
        compares = [compare(as_bytes(spec_key), MOD, mod_revision=spec_rev)]
        if meta.deletionTimestamp is not None and not meta.finalizers:
            # the last finalizer went: the real delete
            resp = await self._write(new, compares, [delete_op(status_key), delete_op(spec_key)], stored, None)
            if not resp.succeeded:
                raise Conflict(f"{kind}/{name} changed while being updated: re-read and retry")
            meta.resourceVersion = resp.header.revision
            return new.at_revision(resp.header.revision)
        spec_doc = json.dumps(new_doc, separators=(",", ":")).encode()
        resp = await self._write(new, compares, [put_op(spec_key, spec_doc)], stored, new)
        if not resp.succeeded:
            raise Conflict(f"{kind}/{name} changed while being updated: re-read and retry")
        revision: int = resp.header.revision
        meta.resourceVersion = revision
        share_fields_sets(new)   # the result may stay in the caller's cache (and a watch's)
        return new.at_revision(revision)

    async def update_status(self, obj: ObjectT) -> ObjectT:
        """Replace the status; spec, generation and resourceVersion stay as they are."""
        kind, name = obj.kind_plural, obj.metadata.name
        spec_key, status_key = _keys(kind, name, node_of(obj))
        doc = _status_doc(obj)
        resp = await self.etcd.txn([compare(as_bytes(spec_key), VERSION, GREATER, version=0)],
                                   [put_op(status_key, doc), get_op(spec_key)])
        if not resp.succeeded:
            raise NotFound(f"{kind}/{name} not found")
        revision: int = resp.header.revision
        stored = _decode(resp.responses[1].response_range.kvs[0], doc, revision, revision)
        if not isinstance(stored, type(obj)):
            raise TypeError(f"{spec_key} holds a {stored.kind}, not a {obj.kind}")
        return stored


    async def patch_status(self, kind: type[ObjectT], name: str, patch: StatusPatch,
                           node: str | None = None, *, current: ObjectT | None = None) -> ObjectT:
        return cast(ObjectT, await self._patch_status(kind.kind_plural, name, patch, node, current))

    async def _patch_status(self, kind: str, name: str, patch: StatusPatch, node: str | None,
                            current: AnyObject | None) -> AnyObject:
        """Atomically merge `patch` into the status: fields replaced, conditions merged by type.

        `current` is the caller's copy of the object (from a cache, say, never changed in
        place). While it is the stored object (the mod revisions of its spec and status
        keys, which it carries, are still the keys'), the patch is one compare-and-swap
        with no read first, and the result is `current` with the new status. Otherwise, or
        when the compare fails, the object is read and the patch tried again.
        """
        if current is not None:
            node = node_of(current)
        node = await self._find_node(kind, name, node)
        spec_key, status_key = _keys(kind, name, node)
        read = current is None or current.metadata.resourceVersion is None or current._status_revision < 0
        for _ in range(20):
            if read or current is None:
                current = await self._read(kind, name, node)
            new_status = _patched(current.status, patch)
            if new_status == current.status:
                if read:
                    return current
                read = True  # nothing to write as far as the caller's copy says: read to be sure
                continue
            resp = await self.etcd.txn(
                [compare(as_bytes(spec_key), MOD, mod_revision=current.metadata.resourceVersion or 0),
                 compare(as_bytes(status_key), MOD, mod_revision=current._status_revision)],
                [put_op(status_key, new_status.model_dump_json().encode())])
            if resp.succeeded:
                revision: int = resp.header.revision
                return _restatused(current, new_status, revision, revision)
            read = True  # spec or status moved on, or the object is gone: read and retry
        raise Conflict(f"{kind}/{name}: status kept changing; patch not applied")


    async def delete(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        """Delete now, or set deletionTimestamp when finalizers remain (they go via update)."""
        return cast(ObjectT, await self._delete(kind.kind_plural, name, node))

    async def _delete(self, kind: str, name: str, node: str | None) -> AnyObject:
        node = await self._find_node(kind, name, node)
        for _ in range(20):
            obj = await self._read(kind, name, node)
            spec_key, status_key = _keys(kind, name, node)
            compares = [compare(as_bytes(spec_key), MOD, mod_revision=obj.metadata.resourceVersion or 0)]
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

    # ------------------------------------------------------------ storage versions

    async def migrate(self, kind: type[AnyObject]) -> tuple[int, int]:
        """Rewrite every object of `kind` stored in an older version (llmgw.api.storage) in the
        current one: how many were rewritten, and how many were current already. Each rewrite is
        a compare-and-swap on the object's keys as read, so a concurrent write is never lost: the
        object is read again (a newer server's write is current already)."""
        prefix = K.kind_prefix(K.SPEC, kind.kind_plural)
        resp = await self.etcd.range(prefix, K.prefix_end(prefix), keys_only=True)
        migrated = current = 0
        for kv in resp.kvs:
            parsed = K.parse_object_key(kv.key.decode())
            if parsed is not None and await self._migrate_one(kind.kind_plural, parsed[3], parsed[2]):
                migrated += 1
            else:
                current += 1
        return migrated, current

    async def _migrate_one(self, kind: str, name: str, node: str | None) -> bool:
        """Whether the object was stored in an older version and is now rewritten (False: current,
        or deleted meanwhile)."""
        spec_key, status_key = _keys(kind, name, node)
        for _ in range(20):
            resp = await self.etcd.txn([], [get_op(spec_key), get_op(status_key)], writes=False)
            spec_kvs, status_kvs = resp.responses[0].response_range.kvs, resp.responses[1].response_range.kvs
            if not spec_kvs or not stale(doc := json.loads(spec_kvs[0].value)):
                return False
            status_kv: KeyValue | None = status_kvs[0] if status_kvs else None
            obj = _assemble(spec_kvs[0], status_kv, resp.header.revision)   # converted on read
            compares = [compare(as_bytes(spec_key), MOD, mod_revision=spec_kvs[0].mod_revision),
                        compare(as_bytes(status_key), MOD, mod_revision=status_kv.mod_revision) if status_kv
                        else compare(as_bytes(status_key), VERSION, version=0)]
            puts = [put_op(status_key, _status_doc(obj))] if status_kv is not None else []
            if (await self._write(obj, compares, [*puts, put_op(spec_key, _spec_doc(obj))], convert(doc),
                                  obj)).succeeded:
                return True
        raise Conflict(f"{kind}/{name} kept changing; not migrated: re-run")

    # ------------------------------------------------------------ watch


    def watch(self, kind: type[ObjectT], from_revision: int, node: str | None = None, *,
              held: Held | None = None, lineage: Lineage | None = None) -> AsyncIterator[WatchEvent[ObjectT]]:
        return cast(AsyncIterator[WatchEvent[ObjectT]], self._watch(kind.kind_plural, from_revision, node, held,
                                                                    lineage))

    async def _watch(self, kind: str, from_revision: int, node: str | None,
                     held: Held | None, lineage: Lineage | None) -> AsyncIterator[WatchEvent[AnyObject]]:
        """Changes to objects of `kind` at or after from_revision, as whole objects.

        `held` gives the watcher's own copy of an object by name (its cache): when that copy
        is what a change wrote (the watcher's own update or status patch, returned to it and
        assumed), the event carries it instead of decoding the same object again. `lineage`: see
        ``Etcd.events``.

        Raises Compacted when from_revision is no longer available (relist), and
        StoreUnavailable when the stream drops (re-watch from the last revision + 1).
        """
        spec_prefix = K.kind_prefix(K.SPEC, kind, node)
        status_prefix = K.kind_prefix(K.STATUS, kind, node)
        # One stream covering both prefixes keeps spec and status events in revision order.
        start, end = as_bytes(spec_prefix), K.prefix_end(status_prefix)
        Rel = tuple[str | None, str]     # (node, name)
        # The object last yielded per key (the one the caller's cache holds too: no raw
        # documents are kept beside it), and a status created together with its spec until
        # that spec's event, which follows it in the same transaction.
        latest: dict[Rel, AnyObject] = {}
        born: dict[Rel, KeyValue] = {}
        status_cls = STATUS_CLASSES[kind]
        async for ev in self.etcd.events(start, end, from_revision, prev_kv=True, lineage=lineage):
            parsed = K.parse_object_key(ev.kv.key.decode())
            if parsed is None or parsed[1] != kind or (node is not None and parsed[2] != node):
                continue  # the range also spans other kinds' keys
            section, _, obj_node, name = parsed
            rel = (obj_node, name)
            spec_key, status_key = _keys(kind, name, obj_node)
            revision = ev.kv.mod_revision
            obj: AnyObject | None
            if section == K.SPEC:
                if ev.kind == "DELETE":
                    last = latest.pop(rel, None)
                    if last is not None:
                        meta = last.metadata.model_copy(update={"resourceVersion": revision})
                        obj = last.model_copy(update={"metadata": meta}).at_revision(revision)
                    elif ev.prev_kv is not None and ev.prev_kv.value:
                        obj = _assemble(ev.prev_kv, None, revision)
                        obj.metadata.resourceVersion = revision
                    else:
                        continue
                    yield WatchEvent("DELETED", obj, revision)
                    continue
                prev = latest.get(rel)
                if ev.kv.version == 1:   # created: with the status put just before it, if any
                    status = born.pop(rel, None)
                    obj = _assemble(ev.kv, status if status is not None and status.mod_revision == revision else None,
                                    revision)
                elif prev is not None:
                    mine = held(name) if held is not None else None
                    if mine is not None and mine._revision == revision and mine.metadata.resourceVersion == revision:
                        # an update's result: its spec and metadata as written, prev's status as stored
                        obj = mine if mine._status_revision == prev._status_revision else \
                            _restatused(mine, prev.status, revision, prev._status_revision)
                    else:
                        obj = _with_spec(prev, ev.kv)
                else:
                    obj = _assemble(ev.kv, await self._kv_at(as_bytes(status_key), revision), revision)
                latest[rel] = obj
                yield WatchEvent("ADDED" if ev.kv.version == 1 else "MODIFIED", obj, revision)
            else:
                if ev.kind == "DELETE":
                    continue  # deleted together with its spec; the spec event reports it
                prev = latest.get(rel)
                if prev is None:
                    obj = None
                elif held is not None and (mine := held(name)) is not None and mine._status_revision == revision \
                        and mine.metadata.resourceVersion == prev.metadata.resourceVersion:
                    obj = mine   # a status patch's result: prev's spec, the status as written
                else:
                    # the spec is the one prev was built from: only the new status needs decoding
                    obj = _with_status(prev, status_cls, ev.kv)
                if obj is None:   # not seen by this watch, or a status that does not validate: its spec says
                    spec = await self._kv_at(as_bytes(spec_key), revision)
                    if spec is None:
                        continue
                    if prev is None and ev.kv.version == 1 and spec.mod_revision == revision and spec.version == 1:
                        born[rel] = ev.kv   # a create that stores a status: its spec event follows
                        continue
                    obj = _assemble(spec, ev.kv, revision)
                latest[rel] = obj
                yield WatchEvent("MODIFIED", obj, revision)

    async def _kv_at(self, key: bytes, revision: int) -> KeyValue | None:
        resp = await self.etcd.range(key, revision=revision)
        return resp.kvs[0] if resp.kvs else None
