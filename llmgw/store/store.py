"""Objects in etcd: spec and status in separate keys, compare-and-swap on every update.

resourceVersion is the spec key's mod_revision; generation moves on spec
changes only; status writes touch only the status key. A Store made with
`fenced()` adds a compare on the leader key's create_revision to every write,
so a deposed controller-manager cannot write.
"""
from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal

import aetcd.exceptions
from aetcd import rpc
from pydantic import ValidationError

from llmgw.api import KINDS, Object, kind_name, now, parse_stored, set_condition
from llmgw.api.meta import Condition
from llmgw.api.selectors import Selector
from llmgw.store import keys as K
from llmgw.store.batcher import TxnBatcher
from llmgw.store.connection import Connection
from llmgw.store.errors import AlreadyExists, Compacted, Conflict, FencedOut, NameTaken, NotFound, StoreUnavailable

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass
class WatchEvent:
    type: EventType
    object: Object
    revision: int


@dataclass
class RawEvent:
    type: Literal["PUT", "DELETE"]
    key: str
    value: bytes
    revision: int


def _b(s: str | bytes) -> bytes:
    return s.encode() if isinstance(s, str) else s


def _cmp(key: bytes, target: int, result: int = rpc.Compare.EQUAL, **value) -> rpc.Compare:
    return rpc.Compare(key=key, target=target, result=result, **value)


def _put(key: str | bytes, value: bytes, lease: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=_b(key), value=value, lease=lease))


def _get(key: str | bytes, range_end: bytes | None = None) -> rpc.RequestOp:
    req = rpc.RangeRequest(key=_b(key))
    if range_end is not None:
        req.range_end = range_end
    return rpc.RequestOp(request_range=req)


def _delete(key: str | bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=_b(key)))


def _spec_doc(obj: Object) -> bytes:
    return obj.model_dump_json(exclude={"status": True, "metadata": {"resourceVersion"}}).encode()


def _status_doc(obj: Object) -> bytes:
    return obj.status.model_dump_json().encode()


def _assemble(spec_kv, status_value: bytes | None, revision: int) -> Object:
    """The object from its spec kv and status document, as of store revision `revision`."""
    obj = parse_stored(spec_kv.value, status_value)
    obj.metadata.resourceVersion = spec_kv.mod_revision
    return obj.at_revision(revision)


def _with_status(obj: Object, status_cls: type, status_value: bytes, revision: int) -> Object | None:
    """`obj` (shared, not changed) with another status document, as of store revision `revision`.

    A third of the cost of decoding the whole object again. None when the status does
    not validate: decoding the whole object (parse_stored) says what is wrong.
    """
    try:
        status = status_cls.model_validate_json(status_value)
    except ValidationError:
        return None
    return obj.model_copy(update={"status": status}).at_revision(revision)


def _holders(model_kvs, names: list[str]) -> dict[str, str]:
    """Which stored Model serves each of `names`, from the Models' specs: a Model stored
    before served names were reserved holds its names without /llmgw/names/ keys."""
    wanted = set(names)
    return {n: m.name for m in (parse_stored(kv.value, None) for kv in model_kvs)
            for n in m.served_names if n in wanted}


def _served(obj: Object) -> list[str]:
    """The names a Model serves (its name and aliases); none for other kinds."""
    return obj.served_names if obj.kind_plural == "models" else []


def _merge_status(current: dict, patch: dict) -> dict:
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


def _bounded_put(cache: dict, key: str, revision: int, doc: bytes, limit: int = 100_000) -> None:
    old = cache.get(key)
    if old is not None and old[0] > revision:
        return  # never replace a newer document with an older one
    cache[key] = (revision, doc)
    if len(cache) > limit:
        cache.pop(next(iter(cache)))


class Leadership:
    """A held leader key, bound to a lease. `keepalive()` returns False once it is lost."""

    def __init__(self, store: "Store", key: str, lease_id: int, create_revision: int, ttl: int):
        self.store, self.key, self.lease_id = store, key, lease_id
        self.create_revision, self.ttl = create_revision, ttl

    async def keepalive(self) -> bool:
        try:
            return await self.store.refresh_lease(self.lease_id)
        except StoreUnavailable:
            return False

    async def resign(self) -> None:
        try:
            await self.store._conn.call(lambda c: c.revoke_lease(self.lease_id))
        except Exception:  # noqa: BLE001 the lease expires by itself anyway
            pass


class Store:
    def __init__(self, endpoints: str | list[str], *, ca: str | None = None, cert: str | None = None,
                 key: str | None = None, timeout: float = 5.0, batch_writes: bool = True):
        """batch_writes: concurrent writing transactions go to etcd together (llmgw.store.batcher)."""
        self._conn = Connection(endpoints, ca=ca, cert=cert, key=key, timeout=timeout)
        self._fence: tuple[bytes, int, rpc.Compare, rpc.RequestOp] | None = None
        self._shared = {"heartbeat_leases": {}, "event_lease": None, "event_ns": 0, "docs": {}, "statuses": {},
                        "batcher": TxnBatcher(self._send_txn) if batch_writes else None}

    # ------------------------------------------------------------ lifecycle

    async def connect(self) -> "Store":
        await self._conn.client()
        await self.revision()  # fail now, with the endpoint named, if etcd is not there
        return self

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> "Store":
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def fenced(self, leader_key: str, create_revision: int) -> "Store":
        """A view on the same connection whose writes require leader_key's create_revision."""
        view = copy.copy(self)
        key = _b(leader_key)
        # built once: every write of this view carries the same compare and read
        view._fence = (key, create_revision, _cmp(key, rpc.Compare.CREATE, create_revision=create_revision),
                       _get(key))
        return view

    # ------------------------------------------------------------ low level

    async def _txn(self, compare: list, success: list, *, writes: bool = True):
        """One transaction; `writes=False` when success holds only reads."""
        compare = list(compare)
        failure = []
        if self._fence:
            compare.append(self._fence[2])
            failure.append(self._fence[3])
        req = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        batcher = self._shared["batcher"]
        # Reads stay out of batches: etcd serves a read-only transaction without raft.
        resp = await (batcher.txn(req) if batcher is not None and writes else self._send_txn(req))
        if not resp.succeeded and self._fence:
            kvs = resp.responses[-1].response_range.kvs
            if not kvs or kvs[0].create_revision != self._fence[1]:
                raise FencedOut(f"lost leadership ({self._fence[0].decode()} changed); write refused")
        return resp

    async def _send_txn(self, req: rpc.TxnRequest) -> rpc.TxnResponse:
        return await self._conn.call(lambda c: c.kvstub.Txn(req, timeout=c._timeout, metadata=c.metadata))

    async def _range(self, key: str | bytes, range_end: bytes | None = None, revision: int = 0):
        req = rpc.RangeRequest(key=_b(key), revision=revision)
        if range_end is not None:
            req.range_end = range_end
        try:
            return await self._conn.call(lambda c: c.kvstub.Range(req, timeout=c._timeout, metadata=c.metadata))
        except Exception as err:
            if "compacted" in str(err):
                raise Compacted(0) from None
            raise

    async def revision(self) -> int:
        resp = await self._range(K.ROOT + "/~")
        return resp.header.revision

    # ------------------------------------------------------------ objects

    @staticmethod
    def _node_of(obj: Object) -> str | None:
        return obj.spec.node if obj.kind_plural in K.NODE_SCOPED else None

    async def _find_node(self, kind: str, name: str, node: str | None) -> str | None:
        """For node-scoped kinds, the node an object is keyed under (a scan when not given)."""
        if kind not in K.NODE_SCOPED or node:
            return node
        prefix = K.kind_prefix(K.SPEC, kind)
        req = rpc.RangeRequest(key=_b(prefix), range_end=K.prefix_end(prefix), keys_only=True)
        resp = await self._conn.call(lambda c: c.kvstub.Range(req, timeout=c._timeout, metadata=c.metadata))
        for kv in resp.kvs:
            parsed = K.parse_object_key(kv.key.decode())
            if parsed and parsed[3] == name:
                return parsed[2]
        raise NotFound(f"{kind}/{name} not found")

    def _keys(self, kind: str, name: str, node: str | None) -> tuple[str, str]:
        return K.object_key(K.SPEC, kind, name, node), K.object_key(K.STATUS, kind, name, node)

    async def _read(self, kind: str, name: str, node: str | None) -> tuple[Object, int, int]:
        """(object, spec mod_revision, status mod_revision or 0), read atomically."""
        node = await self._find_node(kind, name, node)
        spec_key, status_key = self._keys(kind, name, node)
        resp = await self._txn([], [_get(spec_key), _get(status_key)], writes=False)
        spec_kvs = resp.responses[0].response_range.kvs
        if not spec_kvs:
            raise NotFound(f"{kind}/{name} not found")
        status_kvs = resp.responses[1].response_range.kvs
        status_value = status_kvs[0].value if status_kvs else None
        obj = _assemble(spec_kvs[0], status_value,
                        max(spec_kvs[0].mod_revision, status_kvs[0].mod_revision if status_kvs else 0))
        self._remember(spec_key, spec_kvs[0].mod_revision, spec_kvs[0].value)
        if status_kvs:
            self._remember_status(status_key, status_kvs[0].mod_revision, status_value)
        return obj, spec_kvs[0].mod_revision, (status_kvs[0].mod_revision if status_kvs else 0)

    async def _served_names(self, model: Object, keep: list[str], drop: list[str]) -> tuple[list, list]:
        """Compares and writes that reserve `keep` for `model` and release `drop`; NameTaken
        (naming the holder) when another Model holds one of `keep`.

        A served name (a Model's name or alias) is a key, /llmgw/names/<name>, holding the
        Model that serves it. The write that changes a Model's names puts and deletes those
        keys in its own transaction, on a compare that they are as read here: of two writes
        claiming one name, the second fails its compare (the batcher never puts two writes
        of one key in one request), reads again and gets NameTaken. Writes of different
        names never wait on each other.
        """
        names = [*keep, *drop]
        models = K.kind_prefix(K.SPEC, "models")
        reads = [_get(K.served_name_key(n)) for n in names]
        resp = await self._txn([], reads + ([_get(models, K.prefix_end(models))] if keep else []), writes=False)
        unreserved = [n for n, r in zip(keep, resp.responses, strict=False) if not r.response_range.kvs]
        legacy = _holders(resp.responses[len(names)].response_range.kvs, unreserved) if unreserved else {}
        compare, ops = [], []
        for n, r in zip(names, resp.responses, strict=False):
            key = _b(K.served_name_key(n))
            kv = r.response_range.kvs[0] if r.response_range.kvs else None
            holder = kv.value.decode() if kv else None
            if n in keep:
                holder = holder or legacy.get(n)
                if holder not in (None, model.name):
                    what = "its name" if n == model.name else "the alias"
                    theirs = "the name" if n == holder else "an alias"
                    raise NameTaken(f"Model {model.name!r}: {what} {n!r} is {theirs} of Model {holder!r}; "
                                    "a name or alias is served by one Model only")
                if kv is None:
                    compare.append(_cmp(key, rpc.Compare.VERSION, version=0))
                    ops.append(_put(key, model.name.encode()))
                else:
                    compare.append(_cmp(key, rpc.Compare.MOD, mod_revision=kv.mod_revision))
            elif holder == model.name:
                compare.append(_cmp(key, rpc.Compare.MOD, mod_revision=kv.mod_revision))
                ops.append(_delete(key))
        return compare, ops

    async def _write(self, obj: Object, compare: list, success: list, keep: list[str] | None = None,
                     drop: list[str] = ()):
        """One transaction of obj's write; for a Model with `keep` or `drop`, with its served
        names reserved and released (_served_names). Lost only on those compares (another
        write took or freed a name meanwhile), it reads the names again."""
        if obj.kind_plural != "models" or (keep is None and not drop):
            return await self._txn(compare, success)
        for _ in range(20):
            guard, names = await self._served_names(obj, keep or [], list(drop))
            resp = await self._txn([*compare, *guard], [*success, *names])
            if resp.succeeded or not guard or not (await self._txn(compare, [], writes=False)).succeeded:
                return resp  # done, or the object's own compare failed: the caller says why
        raise Conflict(f"{obj.kind_plural}/{obj.name}: its served names kept changing; re-run")

    async def create(self, obj: Object) -> Object:
        meta = obj.metadata.model_copy(update={
            "uid": obj.metadata.uid or str(uuid.uuid4()), "creationTimestamp": now(), "generation": 1,
            "resourceVersion": None, "deletionTimestamp": None})
        obj = obj.model_copy(update={"metadata": meta})
        spec_key, status_key = self._keys(obj.kind_plural, meta.name, self._node_of(obj))
        spec_doc = _spec_doc(obj)
        # status first: a watcher sees the status put, then the spec put that completes the object
        resp = await self._write(
            obj, [_cmp(_b(spec_key), rpc.Compare.VERSION, version=0)],
            [_put(status_key, _status_doc(obj)), _put(spec_key, spec_doc)], keep=_served(obj),
        )
        if not resp.succeeded:
            return await self._own_create(obj)
        meta.resourceVersion = resp.header.revision
        self._remember(spec_key, resp.header.revision, spec_doc)
        self._remember_status(status_key, resp.header.revision, _status_doc(obj))
        return obj.at_revision(resp.header.revision)

    async def _own_create(self, obj: Object) -> Object:
        """The stored object when it is `obj` itself (the same uid), else AlreadyExists.

        A create that etcd committed just as its member died is sent again to the next
        member (Connection.call) and loses its compare to its own first attempt; the
        caller must see its create done, not a conflict it would answer with another create.
        """
        try:
            stored = await self.get(obj.kind_plural, obj.name, self._node_of(obj))
        except NotFound:
            stored = None
        if stored is None or stored.metadata.uid != obj.metadata.uid:
            raise AlreadyExists(f"{obj.kind_plural}/{obj.name} already exists")
        return stored

    async def get(self, kind: str, name: str, node: str | None = None) -> Object:
        return (await self._read(kind_name(kind), name, node))[0]

    async def list(self, kind: str, selector: str | dict | None = None,
                   node: str | None = None) -> tuple[list[Object], int]:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        sel = Selector.parse(selector)
        spec_prefix = K.kind_prefix(K.SPEC, kind, node)
        status_prefix = K.kind_prefix(K.STATUS, kind, node)
        resp = await self._txn([], [_get(spec_prefix, K.prefix_end(spec_prefix)),
                                    _get(status_prefix, K.prefix_end(status_prefix))], writes=False)
        statuses = {kv.key[len(status_prefix):]: kv for kv in resp.responses[1].response_range.kvs}
        items = []
        for kv in resp.responses[0].response_range.kvs:
            status = statuses.get(kv.key[len(spec_prefix):])
            obj = _assemble(kv, status.value if status else None,
                            max(kv.mod_revision, status.mod_revision if status else 0))
            if sel.matches(obj.metadata.labels):
                items.append(obj)
        return items, resp.header.revision

    def _remember(self, spec_key: str, revision: int, spec_doc: bytes) -> None:
        """Keep the latest spec document per key: an update at that revision needs no read."""
        _bounded_put(self._shared["docs"], spec_key, revision, spec_doc)

    def _remember_status(self, status_key: str, revision: int, status_doc: bytes) -> None:
        """Keep the latest status document per key: a patch at that revision needs no read."""
        _bounded_put(self._shared["statuses"], status_key, revision, status_doc)

    async def _current_doc(self, kind: str, name: str, node: str | None, revision: int) -> tuple[dict, int]:
        spec_key = K.object_key(K.SPEC, kind, name, node)
        cached = self._shared["docs"].get(spec_key)
        if cached and cached[0] == revision:
            return json.loads(cached[1]), revision
        resp = await self._range(spec_key)
        if not resp.kvs:
            raise NotFound(f"{kind}/{name} not found")
        self._remember(spec_key, resp.kvs[0].mod_revision, resp.kvs[0].value)
        return json.loads(resp.kvs[0].value), resp.kvs[0].mod_revision

    async def update(self, obj: Object) -> Object:
        """Write spec and metadata, if obj's resourceVersion is still current (else Conflict)."""
        kind, name, node = obj.kind_plural, obj.metadata.name, self._node_of(obj)
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
        spec_key, status_key = self._keys(kind, name, node)
        compare = [_cmp(_b(spec_key), rpc.Compare.MOD, mod_revision=spec_rev)]
        if meta.deletionTimestamp is not None and not meta.finalizers:
            # the last finalizer went: the real delete
            resp = await self._write(new, compare, [_delete(status_key), _delete(spec_key)], drop=_served(new))
            if not resp.succeeded:
                raise Conflict(f"{kind}/{name} changed while being updated: re-read and retry")
            meta.resourceVersion = resp.header.revision
            return new.at_revision(resp.header.revision)
        spec_doc = json.dumps(new_doc, separators=(",", ":")).encode()
        before = [name, *current["spec"].get("aliases", [])] if kind == "models" else []
        keep = _served(new) if before != _served(new) else None
        resp = await self._write(new, compare, [_put(spec_key, spec_doc)], keep=keep,
                                 drop=[n for n in before if keep is not None and n not in keep])
        if not resp.succeeded:
            raise Conflict(f"{kind}/{name} changed while being updated: re-read and retry")
        meta.resourceVersion = resp.header.revision
        self._remember(spec_key, resp.header.revision, spec_doc)
        return new.at_revision(resp.header.revision)

    async def update_status(self, obj: Object) -> Object:
        """Replace the status; spec, generation and resourceVersion stay as they are."""
        kind, name = obj.kind_plural, obj.metadata.name
        spec_key, status_key = self._keys(kind, name, self._node_of(obj))
        resp = await self._txn([_cmp(_b(spec_key), rpc.Compare.VERSION, rpc.Compare.GREATER, version=0)],
                               [_put(status_key, _status_doc(obj)), _get(spec_key)])
        if not resp.succeeded:
            raise NotFound(f"{kind}/{name} not found")
        doc = _status_doc(obj)
        self._remember_status(status_key, resp.header.revision, doc)
        return _assemble(resp.responses[1].response_range.kvs[0], doc, resp.header.revision)

    async def patch_status(self, kind: str, name: str, patch: dict[str, Any],
                           node: str | None = None, *, current: Object | None = None) -> Object:
        """Atomically merge `patch` into the status: fields replaced, conditions merged by type.

        `current` is the caller's copy of the object (from a cache, say). While its spec
        is still the stored one and this Store has seen the stored status (its own
        writes, reads and watches remember it), the patch is one compare-and-swap with
        no read first, and the result is `current` with the new status. Otherwise, or
        when the compare fails, the object is read and the patch tried again.
        """
        kind = kind_name(kind)
        if current is not None:
            node = self._node_of(current)
        node = await self._find_node(kind, name, node)
        spec_key, status_key = self._keys(kind, name, node)
        status_cls = KINDS[kind].model_fields["status"].annotation
        known = (self._shared["statuses"].get(status_key)
                 if current is not None and current.metadata.resourceVersion else None)
        for _ in range(20):
            if known is None:
                current, _, status_rev = await self._read(kind, name, node)
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
            resp = await self._txn(
                [_cmp(_b(spec_key), rpc.Compare.MOD, mod_revision=current.metadata.resourceVersion),
                 _cmp(_b(status_key), rpc.Compare.MOD, mod_revision=status_rev)],
                [_put(status_key, doc)])
            if resp.succeeded:
                self._remember_status(status_key, resp.header.revision, doc)
                return current.model_copy(update={"status": new_status}).at_revision(resp.header.revision)
            known = None  # spec or status moved on, or the object is gone: read and retry
        raise Conflict(f"{kind}/{name}: status kept changing; patch not applied")

    async def delete(self, kind: str, name: str, node: str | None = None) -> Object:
        """Delete now, or set deletionTimestamp when finalizers remain (they go via update)."""
        kind = kind_name(kind)
        node = await self._find_node(kind, name, node)
        for _ in range(20):
            obj, spec_rev, _ = await self._read(kind, name, node)
            spec_key, status_key = self._keys(kind, name, node)
            compare = [_cmp(_b(spec_key), rpc.Compare.MOD, mod_revision=spec_rev)]
            if obj.metadata.finalizers:
                if obj.metadata.deletionTimestamp is not None:
                    return obj
                obj.metadata.deletionTimestamp = now()
                resp = await self._txn(compare, [_put(spec_key, _spec_doc(obj))])
            else:
                resp = await self._write(obj, compare, [_delete(status_key), _delete(spec_key)],
                                         drop=_served(obj))
            if resp.succeeded:
                obj.metadata.resourceVersion = resp.header.revision
                return obj.at_revision(resp.header.revision)
        raise Conflict(f"{kind}/{name} kept changing; delete not applied")

    # ------------------------------------------------------------ watch

    async def watch(self, kind: str, from_revision: int, node: str | None = None) -> AsyncIterator[WatchEvent]:
        """Changes to objects of `kind` at or after from_revision, as whole objects.

        Raises Compacted when from_revision is no longer available (relist), and
        StoreUnavailable when the stream drops (re-watch from the last revision + 1).
        """
        spec_prefix = K.kind_prefix(K.SPEC, kind, node)
        status_prefix = K.kind_prefix(K.STATUS, kind, node)
        # One stream covering both prefixes keeps spec and status events in revision order.
        start, end = _b(spec_prefix), K.prefix_end(status_prefix)
        specs: dict[tuple, Any] = {}      # (node, name) -> latest spec kv
        statuses: dict[tuple, bytes | None] = {}  # (node, name) -> latest status value
        latest: dict[tuple, Object] = {}  # (node, name) -> the object last yielded
        status_cls = KINDS[kind].model_fields["status"].annotation
        async for ev in self._raw_events(start, end, from_revision, prev_kv=True):
            parsed = K.parse_object_key(ev.kv.key.decode())
            if parsed is None or parsed[1] != kind or (node is not None and parsed[2] != node):
                continue  # the range also spans other kinds' keys
            section, _, obj_node, name = parsed
            rel = (obj_node, name)
            spec_key, status_key = self._keys(kind, name, obj_node)
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
                self._remember(spec_key, ev.kv.mod_revision, ev.kv.value)
                if rel not in statuses and ev.kv.version > 1:
                    statuses[rel] = await self._value_at(_b(status_key), ev.kv.mod_revision)
                obj = latest[rel] = _assemble(ev.kv, statuses.get(rel), ev.kv.mod_revision)
                yield WatchEvent("ADDED" if ev.kv.version == 1 else "MODIFIED", obj, ev.kv.mod_revision)
            else:
                if ev.kind == "DELETE":
                    continue  # deleted together with its spec; the spec event reports it
                statuses[rel] = ev.kv.value
                self._remember_status(status_key, ev.kv.mod_revision, ev.kv.value)
                if ev.kv.version == 1:
                    continue  # created with its spec, which follows in the same transaction
                prev = latest.get(rel)
                # the spec is the one prev was built from: only the new status needs decoding
                obj = _with_status(prev, status_cls, ev.kv.value, ev.kv.mod_revision) if prev else None
                if obj is None:
                    spec = specs.get(rel)
                    if spec is None:
                        spec = await self._kv_at(_b(spec_key), ev.kv.mod_revision)
                        if spec is None:
                            continue
                        specs[rel] = spec
                    obj = _assemble(spec, ev.kv.value, ev.kv.mod_revision)
                latest[rel] = obj
                yield WatchEvent("MODIFIED", obj, ev.kv.mod_revision)

    async def _kv_at(self, key: bytes, revision: int):
        resp = await self._range(key, revision=revision)
        return resp.kvs[0] if resp.kvs else None

    async def _value_at(self, key: bytes, revision: int) -> bytes | None:
        kv = await self._kv_at(key, revision)
        return kv.value if kv else None

    async def _raw_events(self, start: bytes, end: bytes, from_revision: int, prev_kv: bool = False):
        client = await self._conn.client()
        # Compacting at revision R drops a deletion made at R, yet a watch from R is
        # still allowed and silently misses it. Starting one revision earlier makes
        # etcd report a compacted start whenever from_revision <= R.
        start_revision = max(from_revision - 1, 1)
        try:
            watch = await client.watch(start, range_end=end, start_revision=start_revision, prev_kv=prev_kv)
        except aetcd.exceptions.RevisionCompactedError as err:
            raise Compacted(err.compacted_revision) from None
        except aetcd.exceptions.ClientError as err:
            raise StoreUnavailable(f"watch on {self._conn.endpoint} failed: {err}") from None
        try:
            async for ev in watch:
                if ev.kv.mod_revision >= from_revision:
                    yield ev
        except aetcd.exceptions.RevisionCompactedError as err:
            raise Compacted(err.compacted_revision) from None
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 aetcd/grpc raise many kinds; all mean the stream is gone
            raise StoreUnavailable(f"watch stream from {self._conn.endpoint} dropped: {err}") from None
        finally:
            # aetcd's cancel can block on its request queue when the stream is
            # gone; never let closing a watch hang its caller.
            try:
                await asyncio.wait_for(watch.cancel(), 2.0)
            except (Exception, asyncio.TimeoutError):  # noqa: BLE001 the stream may already be gone
                pass
        raise StoreUnavailable(f"watch stream from {self._conn.endpoint} ended")

    # ------------------------------------------------------------ raw keys

    async def get_raw(self, key: str) -> tuple[bytes, int] | None:
        resp = await self._range(key)
        return (resp.kvs[0].value, resp.kvs[0].mod_revision) if resp.kvs else None

    async def put_raw(self, key: str, value: bytes, lease: int = 0) -> int:
        resp = await self._txn([], [_put(key, value, lease)])
        return resp.header.revision

    async def delete_raw(self, key: str) -> int:
        resp = await self._txn([], [_delete(key)])
        return resp.header.revision

    async def list_raw(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        resp = await self._range(prefix, K.prefix_end(prefix))
        return [(kv.key.decode(), kv.value, kv.mod_revision) for kv in resp.kvs], resp.header.revision

    async def watch_raw(self, prefix: str, from_revision: int) -> AsyncIterator[RawEvent]:
        async for ev in self._raw_events(_b(prefix), K.prefix_end(prefix), from_revision):
            yield RawEvent(ev.kind, ev.kv.key.decode(), ev.kv.value, ev.kv.mod_revision)

    # ------------------------------------------------------------ leases

    async def grant_lease(self, ttl: int) -> int:
        lease = await self._conn.call(lambda c: c.lease(ttl))
        return lease.id

    async def refresh_lease(self, lease_id: int) -> bool:
        """True while the lease lives; False once it expired."""
        reply = await self._conn.call(lambda c: c.refresh_lease(lease_id))
        return reply is not None and reply.TTL > 0

    async def heartbeat(self, node: str, ttl: int = 15, info: dict | None = None) -> None:
        """Keep /llmgw/heartbeat/<node> alive; its lease expiring is how silence shows."""
        leases: dict = self._shared["heartbeat_leases"]
        lease_id = leases.get(node)
        if lease_id is not None and await self.refresh_lease(lease_id):
            return
        lease_id = await self.grant_lease(ttl)
        leases[node] = lease_id
        value = json.dumps({"node": node, "since": now().isoformat(), **(info or {})}).encode()
        await self.put_raw(K.heartbeat_key(node), value, lease=lease_id)

    async def heartbeats(self) -> dict[str, dict]:
        items, _ = await self.list_raw(K.HEARTBEAT)
        return {k[len(K.HEARTBEAT):]: json.loads(v) for k, v, _ in items}

    # ------------------------------------------------------------ leadership

    async def campaign(self, component: str, identity: str, ttl: int = 15) -> Leadership | None:
        """Try once to take the leader key; None when someone else holds it."""
        key = K.leader_key(component)
        lease_id = await self.grant_lease(ttl)
        req = rpc.TxnRequest(
            compare=[_cmp(_b(key), rpc.Compare.CREATE, create_revision=0)],
            success=[_put(key, json.dumps({"holder": identity}).encode(), lease_id)],
        )
        resp = await self._conn.call(lambda c: c.kvstub.Txn(req, timeout=c._timeout, metadata=c.metadata))
        if not resp.succeeded:
            await self._conn.call(lambda c: c.revoke_lease(lease_id))
            return None
        return Leadership(self, key, lease_id, resp.header.revision, ttl)

    async def leader(self, component: str) -> dict | None:
        got = await self.get_raw(K.leader_key(component))
        return json.loads(got[0]) if got else None

    # ------------------------------------------------------------ events, revocations, compaction

    async def record_event(self, kind: str, name: str, type: str, reason: str, message: str) -> None:
        """An event under /llmgw/events/<kind>/<name>/, expiring after about an hour."""
        await self.record_events([(kind, name, type, reason, message)])

    async def record_events(self, events: list[tuple[str, str, str, str, str]]) -> None:
        """Several (kind, name, type, reason, message) events in one transaction.

        Keys end in a nanosecond timestamp, kept strictly increasing so that
        events written together keep their order and never share a key.
        """
        lease = self._shared["event_lease"]
        if lease is None or time.monotonic() - lease[1] > 300:
            lease = (await self.grant_lease(3600), time.monotonic())
            self._shared["event_lease"] = lease
        stamp = now().isoformat()
        ops = []
        for kind, name, type, reason, message in events:
            ns = self._shared["event_ns"] = max(time.time_ns(), self._shared["event_ns"] + 1)
            value = {"type": type, "reason": reason, "message": message, "time": stamp}
            ops.append(_put(f"{K.events_prefix(kind, name)}{ns:020d}", json.dumps(value).encode(), lease[0]))
        await self._txn([], ops)

    async def list_events(self, kind: str, name: str) -> list[dict]:
        items, _ = await self.list_raw(K.events_prefix(kind, name))
        return [json.loads(v) for _, v, _ in items]

    async def revoke(self, serial: str | int, info: dict | None = None) -> None:
        await self.put_raw(K.revoked_key(str(serial)), json.dumps(info or {}).encode())

    async def revoked(self) -> dict[str, dict]:
        items, _ = await self.list_raw(K.REVOKED)
        return {k[len(K.REVOKED):]: json.loads(v) for k, v, _ in items}

    async def compact(self, keep: int = 10000) -> int | None:
        """Compact history older than the last `keep` revisions; returns the revision compacted to."""
        target = await self.revision() - keep
        if target <= 0:
            return None
        try:
            await self._conn.call(lambda c: c.compact(target))
        except aetcd.exceptions.ClientError as err:
            if "compacted" in str(err):
                return None
            raise
        return target
