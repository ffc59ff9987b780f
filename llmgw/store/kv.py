"""Raw keys: what is not an object (heartbeats, revocations, served names) read and written as bytes."""
from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from llmgw.store import keys as K
from llmgw.store.etcd import Etcd, Lineage, as_bytes, delete_op, put_op


@dataclass
class RawEvent:
    type: Literal["PUT", "DELETE"]
    key: str
    value: bytes
    revision: int


class KV:
    def __init__(self, etcd: Etcd):
        self._etcd = etcd

    async def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, mod_revision), or None when the key is not there."""
        resp = await self._etcd.range(key)
        return (resp.kvs[0].value, resp.kvs[0].mod_revision) if resp.kvs else None

    async def lease(self, key: str) -> int:
        """The lease the key is bound to; 0 when it is bound to none or is not there."""
        resp = await self._etcd.range(key)
        lease_id: int = resp.kvs[0].lease if resp.kvs else 0
        return lease_id

    async def exists(self, key: str) -> bool:
        """Whether the key is there; its value is not read."""
        resp = await self._etcd.range(key, keys_only=True)
        return bool(resp.kvs)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write the key (bound to `lease` when given); the revision it was written at."""
        resp = await self._etcd.txn([], [put_op(key, value, lease)])
        revision: int = resp.header.revision
        return revision

    async def delete(self, key: str) -> int:
        resp = await self._etcd.txn([], [delete_op(key)])
        revision: int = resp.header.revision
        return revision

    async def list(self, prefix: str) -> tuple[builtins.list[tuple[str, bytes, int]], int]:
        """[(key, value, mod_revision)] of the keys under prefix, and the revision read at."""
        resp = await self._etcd.range(prefix, K.prefix_end(prefix))
        revision: int = resp.header.revision
        return [(kv.key.decode(), kv.value, kv.mod_revision) for kv in resp.kvs], revision

    async def watch(self, prefix: str, from_revision: int, lineage: Lineage | None = None,
                    rewrites: bool = True) -> AsyncIterator[RawEvent]:
        """Changes under prefix at or after from_revision; Compacted, StoreUnavailable as Objects.watch.
        ``rewrites=False``: a key written again, only as the first event of its revision (Etcd.events)."""
        async for ev in self._etcd.events(as_bytes(prefix), K.prefix_end(prefix), from_revision, lineage=lineage,
                                          rewrites=rewrites):
            yield RawEvent("DELETE" if ev.kind == "DELETE" else "PUT", ev.kv.key.decode(), ev.kv.value,
                           ev.kv.mod_revision)
