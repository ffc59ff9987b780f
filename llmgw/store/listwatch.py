"""The store as reflectors' lister-watchers (llmgw.reflector): a kind's objects
(``store.lister_watcher(Model)``), or the names under a key prefix (``store.heartbeats.lister_watcher()``,
``store.revocations.lister_watcher()``)."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from llmgw.api import ObjectT
from llmgw.api.client import EventType
from llmgw.reflector import AfterError, Event
from llmgw.store.errors import Compacted, StoreUnavailable
from llmgw.store.etcd import Lineage
from llmgw.store.kv import KV
from llmgw.store.objects import Held, Objects

AfterErrorPolicy = Callable[[Exception], AfterError]
ValueT = TypeVar("ValueT")


def after_store_error(err: Exception) -> AfterError:
    """Compacted (or Restored: etcd restored under the watch, ``Etcd.same_history``): relist.
    StoreUnavailable (etcd away, a dropped stream): retry. The rest: raise."""
    if isinstance(err, Compacted):
        return "relist"
    return "retry" if isinstance(err, StoreUnavailable) else "raise"


def after_store_error_never_raise(err: Exception) -> AfterError:
    """For what must never stop (the server's watch cache and revocations): relist after a
    compaction, retry after anything else."""
    return "relist" if isinstance(err, Compacted) else "retry"


class StoreObjects(Generic[ObjectT]):
    """The store's objects of one kind."""

    def __init__(self, objects: Objects, kind: type[ObjectT],
                 after_error: AfterErrorPolicy = after_store_error, held: Held | None = None) -> None:
        self.objects, self.kind, self._after_error, self._held = objects, kind, after_error, held
        self.lineage = Lineage()

    async def list(self) -> tuple[Sequence[ObjectT], int]:
        return await self.objects.list(self.kind)

    def watch(self, from_revision: int) -> AsyncIterator[Event[ObjectT]]:
        return self.objects.watch(self.kind, from_revision, held=self._held, lineage=self.lineage)

    def after_error(self, err: Exception) -> AfterError:
        return self._after_error(err)


class NameEvent(NamedTuple):
    type: EventType
    object: str      # the name
    revision: int


class KeyNames:
    """The names of the keys under ``prefix`` (each key less the prefix, through ``normal``):
    a key written is ADDED (again, at each write; with ``rewrites=False`` when written anew,
    and a key written again only as the first event of its revision, which moves the watch's
    revision on: KV.watch), a key deleted or expired is DELETED."""

    def __init__(self, kv: KV, prefix: str, normal: Callable[[str], str] = str,
                 after_error: AfterErrorPolicy = after_store_error, rewrites: bool = True) -> None:
        self.kv, self.prefix, self.normal, self._after_error = kv, prefix, normal, after_error
        self.rewrites = rewrites
        self.lineage = Lineage()

    def _name(self, key: str) -> str:
        return self.normal(key[len(self.prefix):])

    async def list(self) -> tuple[Sequence[str], int]:
        kvs, rev = await self.kv.list(self.prefix)
        return [self._name(k) for k, _, _ in kvs], rev

    async def watch(self, from_revision: int) -> AsyncIterator[Event[str]]:
        async for ev in self.kv.watch(self.prefix, from_revision, self.lineage, rewrites=self.rewrites):
            yield NameEvent("DELETED" if ev.type == "DELETE" else "ADDED", self._name(ev.key), ev.revision)

    def after_error(self, err: Exception) -> AfterError:
        return self._after_error(err)


class ValueEvent(NamedTuple, Generic[ValueT]):
    type: EventType
    object: ValueT
    revision: int


class KeyValues(Generic[ValueT]):
    """The values of the keys under ``prefix``, each read by ``parse(name, value)`` (``value`` None
    for a key deleted or expired): a key written is ADDED (again, at each write), a key gone DELETED."""

    def __init__(self, kv: KV, prefix: str, parse: Callable[[str, bytes | None], ValueT],
                 after_error: AfterErrorPolicy = after_store_error) -> None:
        self.kv, self.prefix, self.parse, self._after_error = kv, prefix, parse, after_error
        self.lineage = Lineage()

    async def list(self) -> tuple[Sequence[ValueT], int]:
        kvs, rev = await self.kv.list(self.prefix)
        return [self.parse(k[len(self.prefix):], v) for k, v, _ in kvs], rev

    async def watch(self, from_revision: int) -> AsyncIterator[Event[ValueT]]:
        async for ev in self.kv.watch(self.prefix, from_revision, self.lineage):
            name = ev.key[len(self.prefix):]
            if ev.type == "DELETE":
                yield ValueEvent("DELETED", self.parse(name, None), ev.revision)
            else:
                yield ValueEvent("ADDED", self.parse(name, ev.value), ev.revision)

    def after_error(self, err: Exception) -> AfterError:
        return self._after_error(err)
