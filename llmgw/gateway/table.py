"""The routing table: which names route to which replica endpoints.

A pure structure, updated from `(type, obj)` events of Models, Replicas and Adapters
(type ADDED / MODIFIED / DELETED, obj an `llmgw.api` object or its dict).
It does no I/O, so the server's watch, a static file or a test can feed it.

An Adapter (a LoRA adapter of a Model) is routed as a model of its own name, to
the routable replicas of its base where its status says it is resident, the
request naming it as the base's engine reads it (its LoraApi: vLLM answers to the
adapter's name, SGLang to `BASE:ADAPTER`, llama-server to the adapter's id, its place
in the start order of the base's adapters); a Model's names win over an adapter of
the same name. Its wait queue, its demand and a key's scope are
the adapter's name's; its routing policy is its base's. An adapter this gateway had a
replica's agent load directly (llmgw/gateway/loads.py) is routed there too (`loaded`)
until its status says it is resident there, the engine answers that it does not hold it,
or the loader gives it up (`unloaded`).

A replica is routable iff its phase is Ready, its endpoint is set and it has
no deletionTimestamp: a replica marked for termination leaves the table on
that event, before its engine is stopped (make-before-break).

`on_leave(backend, dead)` is told when a replica leaves routing for a cause its
requests in flight should hear of: not Ready (dead False), or Failed or deleted
(dead True: its engine is known dead, stopped or being rebuilt; also for a
replica that had left as not Ready or draining before). A replica marked for
deletion (draining) is not told of as it leaves: its engine finishes what it has.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from llmgw.api import LoraAdapter, Model, ObjectT, Replica, RoutingSpec
from llmgw.engines import ENGINES
from llmgw.engines.engine import start_order


@dataclass(frozen=True)
class Backend:
    """One routable replica."""

    replica: str
    model: str
    endpoint: str  # "host:port" of rank 0
    served: tuple[str, ...] = ()  # names the engine answers to; () = unknown
    kv_events: str | None = None  # its engine's KV event publisher (tcp://host:port), if any
    kv_replay: str | None = None  # and its replay endpoint
    engine: str = ""  # its Profile's engine ("": unknown), which says the endpoints it serves
    adapters: bool = False  # its engine holds LoRA adapters (its Model's spec.adapters)
    # An adapter's backend (model is the adapter's name): the name its base's engine serves, and
    # the adapter's id there where that engine took its adapters at start (-1 otherwise).
    base: str | None = None
    slot: int = -1
    node: str = ""  # the node of its rank 0, whose agent loads its adapters
    slots: int = 0  # the adapters its engine holds at most (its Model's spec.adapters.maxLoaded)

    def upstream_fields(self, requested: str) -> dict[str, Any]:
        """The body fields to send this engine instead of the request's ({}: the body as it is)."""
        api = ENGINES[self.engine].lora if self.engine in ENGINES else None
        if self.base is not None:
            return api.request(self.model, self.base, self.slot) if api is not None else {}
        fields: dict[str, Any] = {}
        if self.served and requested not in self.served:
            fields["model"] = self.model if self.model in self.served else self.served[0]
        if self.adapters and api is not None:
            fields.update(api.base)     # llama-server: the base alone, no prefix cached under an adapter
        return fields


DEFAULT_ROUTING = RoutingSpec()


@dataclass
class _ModelEntry:
    name: str
    aliases: tuple[str, ...]
    created: int = 0
    routing: RoutingSpec = field(default_factory=lambda: DEFAULT_ROUTING)
    labels: dict[str, str] = field(default_factory=dict)   # an ApiKey's modelSelector reads them
    source: str | None = None  # the Model's spec.source: precise-prefix reads a tokenizer.json there


@dataclass(frozen=True)
class _AdapterEntry:
    name: str
    base: str
    resident: tuple[str, ...]   # replicas where it is loaded (its status.resident)
    created: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    digest: str | None = None
    min_replicas: int = 0       # spec.minReplicas: replicas it is kept on
    pinned: bool = False        # kept on every one


KINDS: dict[str, type[Model] | type[Replica] | type[LoraAdapter]] = {
    "models": Model, "replicas": Replica, "adapters": LoraAdapter}


@dataclass
class RoutingTable:
    models: dict[str, _ModelEntry] = field(default_factory=dict)
    adapters: dict[str, _AdapterEntry] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)  # replica name -> Backend
    on_change: Callable[[], None] | None = None  # after every routing change (the gateway wakes its queues)
    on_leave: Callable[[Backend, bool], None] | None = None  # a replica left routing; True: known dead
    _by_model: dict[str, list[Backend]] = field(default_factory=dict)
    _names: dict[str, str] = field(default_factory=dict)  # name or alias -> model
    _replica_names: set[str] = field(default_factory=set)  # every replica seen, routable or not
    _left: dict[str, Backend] = field(default_factory=dict)  # left routing, not yet known dead
    # adapter -> replicas this gateway had it loaded on directly, not yet resident there by its status
    _direct: dict[str, set[str]] = field(default_factory=dict)
    # adapter -> replica -> (until when (monotonic) it is not routed there, though its status may
    # still say so, or come to say so; whether it was routed there by a direct load alone): this
    # gateway had that replica's agent unload it
    _gone: dict[str, dict[str, tuple[float, bool]]] = field(default_factory=dict)
    held: dict[str, list[str]] = field(default_factory=dict)  # replica -> the adapters routed to it
    _slots: dict[str, int] = field(default_factory=dict)  # adapter -> its place in its base's start order
    _shadowed: set[str] = field(default_factory=set)  # adapters whose name a model's names take

    # ------------------------------------------------------------ updates

    def apply(self, kind: str, type_: str, obj: Any) -> bool:
        """Apply one watch event; returns True when routing changed."""
        if kind == "models":
            return self._apply_model(type_, _as(Model, obj))
        if kind == "replicas":
            return self._apply_replica(type_, _as(Replica, obj))
        if kind == "adapters":
            return self._apply_adapter(type_, _as(LoraAdapter, obj))
        raise ValueError(f"the routing table takes models, replicas and adapters, not {kind!r}")

    def replace(self, kind: str, objs: list[Any]) -> bool:
        """Make `kind` exactly `objs` (a full list): what a relist gives."""
        objs = [_as(KINDS[kind], o) for o in objs]
        present = {o.metadata.name for o in objs}
        known = set(self.models) if kind == "models" else set(self.adapters) if kind == "adapters" else \
            set(self._replica_names)
        changed = False
        for name in known - present:
            changed |= self._forget(kind, name)
        for o in objs:
            changed |= self.apply(kind, "MODIFIED", o)
        return changed

    def _apply_model(self, type_: str, m: Model) -> bool:
        name = m.metadata.name
        if type_ == "DELETED":
            return self._forget("models", name)
        created = int(m.metadata.creationTimestamp.timestamp()) if m.metadata.creationTimestamp else 0
        entry = _ModelEntry(name, tuple(m.spec.aliases), created, m.spec.routing, m.metadata.labels, m.spec.source)
        if self.models.get(name) == entry:
            return False
        self.models[name] = entry
        self._reindex()
        return True

    def _apply_replica(self, type_: str, r: Replica) -> bool:
        name = r.metadata.name
        if type_ == "DELETED":
            self._replica_names.discard(name)
            return self._drop_backend(name, dead=True)
        self._replica_names.add(name)
        if not routable(r):
            return self._drop_backend(name, dead=r.status.phase == "Failed",
                                      draining=r.metadata.deletionTimestamp is not None)
        assert r.status.endpoint  # routable: it has one
        self._left.pop(name, None)
        node = next((p.node for p in r.spec.placement if p.rank == 0), "")
        b = Backend(name, r.spec.model, r.status.endpoint, tuple(r.spec.servedModelNames),
                    r.status.kvEvents, r.status.kvReplay, r.spec.profile.engine, r.spec.adapters is not None,
                    node=node, slots=r.spec.adapters.maxLoaded if r.spec.adapters is not None else 0)
        if self.backends.get(name) == b:
            return False
        self.backends[name] = b
        self._reindex()
        return True

    def _apply_adapter(self, type_: str, a: LoraAdapter) -> bool:
        name = a.metadata.name
        if type_ == "DELETED" or a.metadata.deletionTimestamp is not None:
            return self._forget("adapters", name)
        created = int(a.metadata.creationTimestamp.timestamp()) if a.metadata.creationTimestamp else 0
        gone = self._gone.get(name, {})
        now = time.monotonic()
        for replica, (until, was_direct) in list(gone.items()):
            if until < now or replica not in a.status.resident and not was_direct:
                del gone[replica]    # its status no longer says so (or too long has passed)
            elif was_direct and replica in a.status.resident:
                # A direct load's status naming it there now: a report from before the unload,
                # adopted; gone until its status no longer names it there.
                gone[replica] = (until, False)
        if not gone:
            self._gone.pop(name, None)
        entry = _AdapterEntry(name, a.spec.baseModel, tuple(r for r in a.status.resident if r not in gone), created,
                              a.metadata.labels, a.spec.digest, a.spec.minReplicas, a.spec.pinned)
        direct = self._direct.get(name)
        if direct is not None:   # recorded now: routed by its status alone
            direct -= set(entry.resident)
            if not direct:
                del self._direct[name]
        before = self.adapters.get(name)
        if before == entry:
            return False
        self.adapters[name] = entry
        if before is not None and (before.base, before.created) == (entry.base, entry.created):
            self._route_adapter(name)   # its names and its place in the start order stay
        else:
            self._reindex()
        return True

    def loaded(self, adapter: str, replica: str) -> None:
        """The replica's agent loaded the adapter at this gateway's request: it is routed there too
        until its status says it is resident there (or `unloaded`)."""
        entry = self.adapters.get(adapter)
        self._gone.get(adapter, {}).pop(replica, None)
        if entry is not None and replica not in entry.resident:
            self._direct.setdefault(adapter, set()).add(replica)
            self._route_adapter(adapter)

    def evicted(self, adapter: str, replica: str, hold: float) -> None:
        """This gateway has the replica's agent unload the adapter: the replica leaves the adapter's
        routing until its status no longer names it there (or `hold` seconds pass); where it was
        routed there by a direct load alone, also while its status comes to name it there."""
        if adapter in self.adapters:
            gone = self._gone.setdefault(adapter, {})
            was_direct = replica in self.direct(adapter) or gone.get(replica, (0.0, False))[1]
            gone[replica] = (time.monotonic() + hold, was_direct)
        self.unloaded(adapter, replica)

    def kept(self, adapter: str, replica: str) -> None:
        """The replica's agent did not unload the adapter `evicted` there after all (its engine had
        room): routed there again as it was, by its status or a direct load."""
        entry = self.adapters.get(adapter)
        gone = self._gone.get(adapter, {}).pop(replica, None)
        if entry is None or gone is None:
            return
        if gone[1]:
            self._direct.setdefault(adapter, set()).add(replica)
        else:
            self.adapters[adapter] = replace(entry, resident=tuple(sorted({*entry.resident, replica})))
        self._route_adapter(adapter)

    def direct(self, adapter: str) -> set[str]:
        """The replicas the adapter is routed to by a direct load alone (`loaded`)."""
        return self._direct.get(adapter, set())

    def directly_loaded(self) -> set[str]:
        """The adapters routed somewhere by a direct load alone."""
        return set(self._direct)

    def unloaded(self, adapter: str, replica: str) -> None:
        """The replica no longer holds the adapter (its engine answered so, or this gateway has it
        unloaded there): the replica leaves the adapter's routing until the Adapter's status says
        otherwise again (its next change)."""
        entry = self.adapters.get(adapter)
        direct = self._direct.get(adapter, set())
        if entry is not None and (replica in entry.resident or replica in direct):
            self.adapters[adapter] = replace(entry, resident=tuple(r for r in entry.resident if r != replica))
            direct.discard(replica)
            if not direct:
                self._direct.pop(adapter, None)
            self._route_adapter(adapter)

    def _forget(self, kind: str, name: str) -> bool:
        if kind in ("models", "adapters"):
            entries: dict[str, Any] = self.models if kind == "models" else self.adapters
            if kind == "adapters":
                self._direct.pop(name, None)
                self._gone.pop(name, None)
            if entries.pop(name, None) is None:
                return False
            self._reindex()
            return True
        self._replica_names.discard(name)
        return self._drop_backend(name, dead=True)

    def _drop_backend(self, name: str, dead: bool, draining: bool = False) -> bool:
        b = self.backends.pop(name, None)
        if b is not None:
            self._reindex()
        left = b is not None
        if dead:
            b = b or self._left.pop(name, None)
        elif b is not None:
            self._left[name] = b
        if b is not None and self.on_leave is not None and (dead or not draining):
            self.on_leave(b, dead)
        return left

    def _reindex(self) -> None:
        by_model: dict[str, list[Backend]] = {}
        for b in sorted(self.backends.values(), key=lambda b: b.replica):
            by_model.setdefault(b.model, []).append(b)
        names: dict[str, str] = {}
        # A replica whose Model is gone (being removed) still answers to its own names.
        for b in self.backends.values():
            for n in (b.model, *b.served):
                names.setdefault(n, b.model)
        for m in self.models.values():
            for n in (m.name, *m.aliases):
                names[n] = m.name
        for m in self.models.values():  # a model's own name wins over another's alias
            names[m.name] = m.name
        of_base: dict[str, list[tuple[int, str]]] = {}
        for a in self.adapters.values():
            of_base.setdefault(a.base, []).append((a.created, a.name))
        self._slots = {name: i for adapters in of_base.values() for i, name in enumerate(start_order(adapters))}
        self._shadowed = {a for a in self.adapters if a in names}     # a model's names win over an adapter's
        held: dict[str, list[str]] = {}
        for a in self.adapters.values():
            if a.name in self._shadowed:
                continue
            names[a.name] = a.name
            here = self._adapter_backends(a)
            if here:
                by_model[a.name] = here
            for b in here:
                held.setdefault(b.replica, []).append(a.name)
        self._by_model, self._names, self.held = by_model, names, held
        self._changed()

    def _route_adapter(self, name: str) -> None:
        """Route one adapter anew after its residency changed (its status, or this gateway's own
        loads and evictions): its names and its place in its base's start order stay, so the rest of
        the table stays too. A change of a replica, a Model, or the adapters there are is `_reindex`'s."""
        if name not in self._shadowed:
            for b in self._by_model.pop(name, []):
                rest = [a for a in self.held[b.replica] if a != name]
                if rest:
                    self.held[b.replica] = rest
                else:
                    del self.held[b.replica]
            here = self._adapter_backends(self.adapters[name])
            if here:
                self._by_model[name] = here
            for b in here:
                self.held[b.replica] = [*self.held.get(b.replica, []), name]
        self._changed()

    def _adapter_backends(self, a: _AdapterEntry) -> list[Backend]:
        """The adapter's backends: the replicas of its base where it is resident or loaded directly."""
        return [Backend(r, a.name, base.endpoint, (a.name,), engine=base.engine, base=(base.served or (a.base,))[0],
                        slot=self._slots[a.name], node=base.node)
                for r in sorted({*a.resident, *self._direct.get(a.name, ())})
                if (base := self.backends.get(r)) is not None and base.model == a.base]

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # ------------------------------------------------------------ queries

    def resolve(self, name: str) -> str | None:
        """The model a name or alias belongs to, or None when nobody knows it."""
        return self._names.get(name)

    def base(self, model: str) -> str:
        """The model an adapter's requests run on (its base); a model's own name otherwise."""
        adapter = self.adapters.get(model)
        return adapter.base if adapter is not None and model not in self.models else model

    def routing(self, model: str) -> RoutingSpec:
        """The model's spec.routing, an adapter's base's (the default for a model the table does not know)."""
        entry = self.models.get(self.base(model))
        return entry.routing if entry is not None else DEFAULT_ROUTING

    def labels(self, model: str) -> dict[str, str]:
        """The Model's labels, or the Adapter's ({} for a name the table does not know)."""
        entry = self.models.get(model) or self.adapters.get(model)
        return entry.labels if entry is not None else {}

    def backends_for(self, model: str) -> list[Backend]:
        return self._by_model.get(model, [])

    def known_names(self) -> list[str]:
        return sorted(self._names)

    def routable_adapters(self) -> list[tuple[str, str, int]]:
        """(adapter, its base model, created) for every adapter resident on a routable replica."""
        return [(a.name, a.base, a.created) for name, a in sorted(self.adapters.items())
                if name in self._by_model and self._names.get(name) == name]

    def routable_models(self) -> list[tuple[str, tuple[str, ...], int]]:
        """(model, aliases, created) for every model with at least one routable replica."""
        out = []
        for model in sorted(m for m in self._by_model if m not in self.adapters or m in self.models):
            entry = self.models.get(model)
            if entry is not None:
                out.append((model, entry.aliases, entry.created))
            else:
                served = {n for b in self._by_model[model] for n in b.served} - {model}
                out.append((model, tuple(sorted(served)), 0))
        return out


def routable(r: Replica) -> bool:
    return (
        r.status.phase == "Ready"
        and bool(r.status.endpoint)
        and r.metadata.deletionTimestamp is None
    )


def _as(cls: type[ObjectT], obj: Any) -> ObjectT:
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, dict):
        return cls.model_validate(obj)
    raise TypeError(f"expected a {cls.__name__} or its dict, got {type(obj).__name__}")
