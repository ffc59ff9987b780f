"""The informers' shared in-memory cache of every kind, with indexes.

Interface for controllers (read-only except ``assume``)::

    cache.get(kind, name) -> obj | None
    cache.list(kind) -> list[obj]
    cache.index(kind, index, value) -> list[obj]
        ("shards", "node")      shards whose spec.node == value
        ("shards", "replica")   shards whose spec.replica == value
        ("replicas", "model")   replicas whose spec.model == value
        ("replicas", "node")    replicas with any placement rank on node value
    cache.heartbeats() -> set[str]       nodes with a live /llmgw/heartbeat/<node> key
    cache.assume(obj)                    write-through after our own write
    cache.assume_deleted(kind, name)     after our own delete that removed the object

Ordering: every entry remembers the store revision it reflects (for an
object from the store, ``obj.revision``: its spec's or its status's last
write, whichever is later).  Watch events arrive in revision order and
replace entries.  ``assume(obj)`` stores the object we just wrote, unless the
entry already reflects that write or a later one (the watch got there
first: a status someone else wrote after our create, say); the assumed object
stays until a watch event (or a relist) at or after its revision replaces
it.  The event of the write itself replaces it too: an update returns the
status the writer had, the event the status the store has.
Objects returned by the cache are shared: copy (``model_copy(deep=True)``)
before changing them.

``Cache(on_assume=handler)``: every assume that changes an entry calls
``handler(kind, "ADDED" | "MODIFIED", obj)``, as a watch event would. The
manager passes its event handler, so the other controllers hear of a write
as soon as its writer has the answer, not when the watch gets round to it
(under load the watch lags by seconds, and every step of a replica's way
from created to Ready waits on the step before). The watch event of the write
is still reported when it comes: the other controllers' reconciles are
level-based, so hearing twice costs a look, never a wrong step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

Indexer = Callable[[Any], Iterable[str]]

INDEXERS: dict[tuple[str, str], Indexer] = {
    ("shards", "node"): lambda s: [s.spec.node],
    ("shards", "replica"): lambda s: [s.spec.replica],
    ("replicas", "model"): lambda r: [r.spec.model],
    ("replicas", "node"): lambda r: {p.node for p in r.spec.placement},
}


@dataclass
class _Entry:
    obj: Any
    rev: int
    assumed: bool = False


class Cache:
    def __init__(self, on_assume: Callable[[str, str, Any], None] | None = None) -> None:
        self._on_assume = on_assume
        self._items: dict[str, dict[str, _Entry]] = {}
        self._revision: dict[str, int] = {}          # highest revision applied per kind
        self._index: dict[tuple[str, str], dict[str, set[str]]] = {k: {} for k in INDEXERS}
        self._tombstones: dict[str, dict[str, str | None]] = {}   # kind -> name -> uid
        self._heartbeats: set[str] = set()

    # ------------------------------------------------------------ reading
    def get(self, kind: str, name: str) -> Any | None:
        e = self._items.get(kind, {}).get(name)
        return e.obj if e else None

    def list(self, kind: str) -> list[Any]:
        return [e.obj for e in self._items.get(kind, {}).values()]

    def index(self, kind: str, index: str, value: str) -> list[Any]:
        names = self._index[(kind, index)].get(value, ())
        items = self._items.get(kind, {})
        return [items[n].obj for n in names if n in items]

    def heartbeats(self) -> set[str]:
        return set(self._heartbeats)

    def revision(self, kind: str) -> int:
        return self._revision.get(kind, 0)

    # ----------------------------------------------------------- assuming
    def assume(self, obj: Any) -> None:
        kind = obj.kind_plural
        name = obj.metadata.name
        cur = self._items.get(kind, {}).get(name)
        rev = obj.revision
        if cur is not None and cur.rev >= rev:
            return
        self._tombstones.get(kind, {}).pop(name, None)
        self._put(kind, name, _Entry(obj, rev, assumed=True))
        if self._on_assume is not None:
            self._on_assume(kind, "ADDED" if cur is None else "MODIFIED", obj)

    def assume_deletion(self, obj: Any) -> None:
        """What a delete returned: the object marked for deletion (finalizers hold it), or gone."""
        if obj.metadata.finalizers:
            self.assume(obj)
        else:
            self.assume_deleted(obj.kind_plural, obj.metadata.name)

    def assume_deleted(self, kind: str, name: str) -> None:
        cur = self._items.get(kind, {}).get(name)
        if cur is None:
            return
        self._tombstones.setdefault(kind, {})[name] = cur.obj.metadata.uid
        self._remove(kind, name)

    # ------------------------------------------------------ informer side
    def apply(self, kind: str, type: str, obj: Any, revision: int) -> tuple[bool, Any | None]:
        """Apply a watch event; returns (whether handlers should hear of it, the old object).

        Events confirming our own assumed writes are reported too: without an
        ``on_assume`` handler the other controllers have not heard of them, and
        an update's event carries the status the store has, which may be newer
        than the one the writer assumed."""
        self._revision[kind] = max(self.revision(kind), revision)
        name = obj.metadata.name
        items = self._items.setdefault(kind, {})
        cur = items.get(name)
        tomb = self._tombstones.get(kind, {})
        if type == "DELETED":
            tombstoned = tomb.pop(name, "absent") != "absent"
            if cur is None:
                return tombstoned, None     # our own delete, assumed earlier: still news to others
            self._remove(kind, name)
            return True, cur.obj
        if name in tomb:
            if tomb[name] == obj.metadata.uid:
                return False, None          # an event older than our own delete
            tomb.pop(name)
        if cur is not None and cur.assumed and revision < cur.rev:
            return True, cur.obj            # keep what we wrote, but handlers still hear of it
        self._put(kind, name, _Entry(obj, revision))
        return True, cur.obj if cur else None

    def set_heartbeat(self, node: str, alive: bool) -> bool:
        if alive == (node in self._heartbeats):
            return False
        (self._heartbeats.add if alive else self._heartbeats.discard)(node)
        return True

    # ----------------------------------------------------------- internal
    def _put(self, kind: str, name: str, entry: _Entry) -> None:
        items = self._items.setdefault(kind, {})
        if name in items:
            self._unindex(kind, name, items[name].obj)
        items[name] = entry
        for (k, idx), fn in INDEXERS.items():
            if k == kind:
                for value in fn(entry.obj):
                    self._index[(k, idx)].setdefault(value, set()).add(name)

    def _remove(self, kind: str, name: str) -> None:
        entry = self._items.get(kind, {}).pop(name, None)
        if entry is not None:
            self._unindex(kind, name, entry.obj)

    def _unindex(self, kind: str, name: str, obj: Any) -> None:
        for (k, idx), fn in INDEXERS.items():
            if k == kind:
                for value in fn(obj):
                    names = self._index[(k, idx)].get(value)
                    if names is not None:
                        names.discard(name)
                        if not names:
                            del self._index[(k, idx)][value]
