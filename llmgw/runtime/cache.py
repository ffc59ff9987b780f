"""The informers' shared in-memory cache of every kind, with indexes.

Interface for controllers (read-only except ``assume``); a kind is named by its
class, as in ``llmgw.api.ObjectClient`` (its plural name, "replicas", is taken too)::

    cache.get(Replica, name) -> Replica | None
    cache.list(Replica) -> list[Replica]
    cache.index(Replica, "node", value) -> list[Replica]
        replicas filed under value by the index "node" of replicas: indexes are
        registered by whoever builds the cache (``Cache(indexes=...)``; the
        manager registers those its controllers declare in ``Controller.indexes``)
    cache.heartbeats() -> Set[str]       nodes with a live /llmgw/heartbeat/<node> key (read-only)
    cache.demand() -> list[DemandReport] the live gateways' demand reports (/llmgw/demand/<gateway>)
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

import builtins
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, cast

from llmgw.api import KINDS, AnyObject, EventType, ObjectT
from llmgw.api.demand import DemandReport

# A kind's plural name, from its class or its plural name.
_PLURAL: dict[type[AnyObject] | str, str] = {**{cls: plural for plural, cls in KINDS.items()},
                                             **{plural: plural for plural in KINDS}}


@dataclass(frozen=True)
class Index(Generic[ObjectT]):
    """A named index of one kind: ``values(obj)`` are the values ``obj`` is filed under."""

    kind: type[ObjectT]
    name: str
    values: Callable[[ObjectT], Iterable[str]]


@dataclass
class _Entry:
    obj: AnyObject
    rev: int
    assumed: bool = False


_NONE: dict[str, _Entry] = {}   # the entries of a kind the cache has none of; never written


class Cache:
    def __init__(self, on_assume: Callable[[str, EventType, AnyObject], None] | None = None,
                 indexes: Iterable[Index[Any]] = ()) -> None:
        self._on_assume = on_assume
        self._items: dict[str, dict[str, _Entry]] = {plural: {} for plural in KINDS}
        # The same entries by class or plural name: a read is one lookup, as it was by name alone.
        self._of: dict[type[AnyObject] | str, dict[str, _Entry]] = {
            kind: self._items[plural] for kind, plural in _PLURAL.items()}
        self._revision: dict[str, int] = {}          # highest revision applied per kind
        self._index: dict[tuple[str, str], dict[str, set[str]]] = {}   # (kind, index) -> value -> names
        self._indexes: dict[str, builtins.list[tuple[Index[Any], dict[str, set[str]]]]] = {}  # kind -> the above
        self._tombstones: dict[str, dict[str, str | None]] = {}   # kind -> name -> uid
        self._heartbeats: set[str] = set()
        self._demand: dict[str, DemandReport] = {}   # gateway -> its live report
        for index in indexes:
            self._add_index(index)

    def _add_index(self, index: Index[Any]) -> None:
        """Register an index (before any object arrives); one name per kind, one function per name."""
        kind = index.kind.kind_plural
        same = next((i for i, _ in self._indexes.get(kind, ()) if i.name == index.name), None)
        if same is not None:
            if same.values is not index.values:
                raise ValueError(f"two different indexes named {kind}/{index.name}")
            return
        values: dict[str, set[str]] = {}
        self._index[(kind, index.name)] = values
        self._indexes.setdefault(kind, []).append((index, values))

    # ------------------------------------------------------------ reading
    # The entries of a kind hold objects of that kind's class: the casts below say so.
    def get(self, kind: type[ObjectT], name: str) -> ObjectT | None:
        e = self._of.get(kind, _NONE).get(name)
        return cast(ObjectT, e.obj) if e else None

    def list(self, kind: type[ObjectT]) -> builtins.list[ObjectT]:
        return cast("builtins.list[ObjectT]", [e.obj for e in self._of.get(kind, _NONE).values()])

    def index(self, kind: type[ObjectT], index: str, value: str) -> builtins.list[ObjectT]:
        plural = _PLURAL.get(kind, "")
        try:
            names = self._index[(plural, index)].get(value, ())
        except KeyError:
            raise KeyError(f"no index {plural}/{index}: a controller that reads it names it in its "
                           "indexes") from None
        items = self._items.get(plural, {})
        return cast("builtins.list[ObjectT]", [items[n].obj for n in names if n in items])

    def count(self, kind: type[AnyObject], index: str, value: str) -> int:
        """How many objects `index` holds under `value` (what len(index(...)) says, without the list)."""
        return len(self._index[(_PLURAL.get(kind, ""), index)].get(value, ()))

    def heartbeats(self) -> AbstractSet[str]:
        """The live set itself, not a copy (a fleet has thousands: a reconcile asks about one)."""
        return self._heartbeats

    def demand(self) -> builtins.list[DemandReport]:
        return builtins.list(self._demand.values())

    def revision(self, kind: str) -> int:
        return self._revision.get(kind, 0)

    # ----------------------------------------------------------- assuming
    def assume(self, obj: AnyObject) -> None:
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

    def assume_deletion(self, obj: AnyObject) -> None:
        """What a delete returned: the object marked for deletion (finalizers hold it), or gone."""
        if obj.metadata.finalizers:
            self.assume(obj)
        else:
            self.assume_deleted(type(obj), obj.metadata.name)

    def assume_deleted(self, kind: type[AnyObject], name: str) -> None:
        plural = _PLURAL.get(kind, "")
        cur = self._items.get(plural, {}).get(name)
        if cur is None:
            return
        self._tombstones.setdefault(plural, {})[name] = cur.obj.metadata.uid
        self._remove(plural, name)

    # ------------------------------------------------------ informer side
    def apply(self, kind: str, type: str, obj: AnyObject, revision: int) -> tuple[bool, AnyObject | None]:
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

    def set_demand(self, report: DemandReport, alive: bool) -> bool:
        """A gateway's report written (alive) or gone; whether it changed what the cache holds."""
        if not alive:
            return self._demand.pop(report.gateway, None) is not None
        if self._demand.get(report.gateway) == report:
            return False
        self._demand[report.gateway] = report
        return True

    # ----------------------------------------------------------- internal
    def _put(self, kind: str, name: str, entry: _Entry) -> None:
        items = self._items.setdefault(kind, {})
        if name in items:
            self._unindex(kind, name, items[name].obj)
        items[name] = entry
        for index, values in self._indexes.get(kind, ()):
            for value in index.values(entry.obj):
                values.setdefault(value, set()).add(name)

    def _remove(self, kind: str, name: str) -> None:
        entry = self._items.get(kind, {}).pop(name, None)
        if entry is not None:
            self._unindex(kind, name, entry.obj)

    def _unindex(self, kind: str, name: str, obj: AnyObject) -> None:
        for index, values in self._indexes.get(kind, ()):
            for value in index.values(obj):
                names = values.get(value)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del values[value]
