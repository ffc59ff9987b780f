"""The store as reflectors' lister-watchers (llmgw.reflector): a kind's objects, or the
names under a key prefix, which the store's concerns hand out (store.heartbeats.lister_watcher(),
store.revocations.lister_watcher()). The informers and the API server's watch cache read them."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from llmgw.api.client import EventType
from llmgw.api.types import KINDS, AnyObject
from llmgw.reflector import AfterError, Event
from llmgw.store.errors import Compacted, StoreUnavailable
from llmgw.store.kv import KV

if TYPE_CHECKING:
    from llmgw.store.store import Store


def after_store_error(err: Exception) -> AfterError:
    """Compacted: relist. StoreUnavailable (etcd away, a dropped stream): retry. The rest: raise."""
    if isinstance(err, Compacted):
        return "relist"
    return "retry" if isinstance(err, StoreUnavailable) else "raise"


def after_store_error_never_raise(err: Exception) -> AfterError:
    """For what must never stop (the server's watch cache and revocations): relist after a
    compaction, retry after anything else."""
    return "relist" if isinstance(err, Compacted) else "retry"


class StoreObjects:
    """The store's objects of one kind."""

    def __init__(self, store: Store, kind: str) -> None:
        self.store, self.kind = store, kind

    async def list(self) -> tuple[Sequence[AnyObject], int]:
        return await self.store.list(KINDS[self.kind])

    def watch(self, from_revision: int) -> AsyncIterator[Event[AnyObject]]:
        return self.store.watch(KINDS[self.kind], from_revision)

    after_error = staticmethod(after_store_error)


class NameEvent(NamedTuple):
    type: EventType
    object: str      # the name
    revision: int


class KeyNames:
    """The names of the keys under ``prefix`` (each key less the prefix, through ``normal``):
    a key written is ADDED (again, at each write), a key deleted or expired is DELETED.
    ``after_error``: what a failure means (default: the informers' policy)."""

    def __init__(self, kv: KV, prefix: str, normal: Callable[[str], str] = str,
                 after_error: Callable[[Exception], AfterError] = after_store_error) -> None:
        self.kv, self.prefix, self.normal, self.after_error = kv, prefix, normal, after_error

    def _name(self, key: str) -> str:
        return self.normal(key[len(self.prefix):])

    async def list(self) -> tuple[Sequence[str], int]:
        kvs, rev = await self.kv.list(self.prefix)
        return [self._name(k) for k, _, _ in kvs], rev

    async def watch(self, from_revision: int) -> AsyncIterator[Event[str]]:
        async for ev in self.kv.watch(self.prefix, from_revision):
            yield NameEvent("DELETED" if ev.type == "DELETE" else "ADDED", self._name(ev.key), ev.revision)
