"""Events: what happened to an object, for people (`llmgw describe`, `llmgw events`), under
/llmgw/events/<kind>/<name>/<id>, the id a nanosecond timestamp (so keys sort by time within an object)."""
from __future__ import annotations

import builtins
import json
import time
from collections.abc import Sequence
from typing import Any

import grpc

from llmgw.api.meta import now
from llmgw.store import keys as K
from llmgw.store.etcd import Etcd, lease_not_found, put_op
from llmgw.store.kv import KV
from llmgw.store.leases import Leases
from llmgw.store.listwatch import AfterErrorPolicy, KeyValues, after_store_error

# (kind, name, type, reason, message)
Event = tuple[str, str, str, str, str]

TTL = 3600            # an event expires after about an hour
LEASE_REUSE = 300     # seconds one lease carries new events (they expire within TTL + this)


class Stamps:
    """The lease events are written on and the last key's timestamp, shared by a Store and its views."""

    def __init__(self) -> None:
        self.lease: tuple[int, float] | None = None   # (lease id, monotonic time granted)
        self.last_ns = 0


class Events:
    def __init__(self, etcd: Etcd, kv: KV, leases: Leases, stamps: Stamps):
        self._etcd, self._kv, self._leases, self._stamps = etcd, kv, leases, stamps

    async def record(self, kind: str, name: str, type: str, reason: str, message: str) -> None:
        """An event of object kind/name, expiring after about an hour."""
        await self.record_many([(kind, name, type, reason, message)])

    async def record_many(self, events: Sequence[Event]) -> None:
        """Several events in one transaction.

        Keys end in a nanosecond timestamp, kept strictly increasing so that
        events written together keep their order and never share a key.
        """
        stamps = self._stamps
        for last_try in (False, True):
            lease = stamps.lease
            if lease is None or time.monotonic() - lease[1] > LEASE_REUSE:
                lease = stamps.lease = (await self._leases.grant(TTL), time.monotonic())
            stamp = now().isoformat()
            ops = []
            for kind, name, type, reason, message in events:
                ns = stamps.last_ns = max(time.time_ns(), stamps.last_ns + 1)
                value = {"type": type, "reason": reason, "message": message, "time": stamp}
                ops.append(put_op(f"{K.events_prefix(kind, name)}{ns:020d}", json.dumps(value).encode(), lease[0]))
            try:
                await self._etcd.txn([], ops)
                return
            except grpc.aio.AioRpcError as err:
                # The lease is gone: etcd was restored from a snapshot taken before it was granted.
                if last_try or not lease_not_found(err):
                    raise
                stamps.lease = None

    async def list(self, kind: str, name: str) -> builtins.list[dict[str, Any]]:
        """The object's events, oldest first: {"type", "reason", "message", "time"}."""
        items, _ = await self._kv.list(K.events_prefix(kind, name))
        return [json.loads(v) for _, v, _ in items]

    async def list_all(self, kind: str | None = None,
                       name: str | None = None) -> tuple[builtins.list[dict[str, Any]], int]:
        """Every object's events (or a kind's, or one object's), oldest first across objects, each
        with its "kind", "name" and "id"; and the revision they were read at (to watch from)."""
        items, revision = await self.lister_watcher(kind, name).list()
        return sorted(items, key=lambda e: str(e["id"])), revision

    def lister_watcher(self, kind: str | None = None, name: str | None = None,
                       after_error: AfterErrorPolicy = after_store_error) -> KeyValues[dict[str, Any]]:
        """The events under `events_prefix(kind, name)` as a reflector's lister-watcher: a recorded
        event is ADDED, an expired one DELETED (with its kind, name and id alone)."""
        prefix = K.events_prefix(kind, name)
        return KeyValues(self._kv, prefix, lambda rest, value: _event(prefix + rest, value), after_error)


def _event(key: str, value: bytes | None) -> dict[str, Any]:
    """An event as the API shows it: where it is filed (kind, name, id) and what it says."""
    kind, name, id_ = K.parse_event_key(key)
    said: dict[str, Any] = json.loads(value) if value is not None else {}
    return {"kind": kind, "name": name, "id": id_, **said}
