"""What a controller needs from wherever objects live: the ObjectClient protocol.

Two things implement it: ``llmgw.store.Store`` (etcd itself, for the server and
the controller manager) and ``llmgw.client.Client`` (the REST API, for the CLI,
the agent and anything outside the control plane). Code written against the
protocol runs against either (docs/architecture.md, "Objects").

A kind is named by its class (``Node``, ``Model``, ``Replica``, ``Shard``), so
``await client.get(Replica, "r1")`` is typed ``Replica``. Implementations also
take a kind's plural name ("replicas") for callers that hold only the name;
``kind_name`` turns either into the name.
"""
from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol

from llmgw.api.types import KINDS, AnyObject, ObjectT

EventType = Literal["ADDED", "MODIFIED", "DELETED"]

# A status patch: status fields to replace, by their wire names; "conditions" merge by type.
StatusPatch = Mapping[str, Any]


@dataclass
class WatchEvent(Generic[ObjectT]):
    """One change to one object; on DELETED, ``object`` is its last state."""

    type: EventType
    object: ObjectT
    revision: int


def kind_name(kind: type[AnyObject] | str) -> str:
    """The plural name of a kind given as its class or its plural name."""
    if isinstance(kind, str):
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
        return kind
    return kind.kind_plural


class ObjectClient(Protocol):
    """Read and write objects; every write is a compare-and-swap on resourceVersion.

    Errors are ``llmgw.store.errors``'s for the store and their HTTP twins for the
    REST client: NotFound, AlreadyExists, Conflict (a stale resourceVersion).
    ``node`` names the node a node-scoped object (a Shard) is filed under; it is
    found when not given.
    """

    async def get(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT: ...

    async def list(self, kind: type[ObjectT], selector: str | None = None,
                   node: str | None = None) -> tuple[builtins.list[ObjectT], int]:
        """The matching objects and the revision they were read at (to watch from)."""
        ...

    async def create(self, obj: ObjectT) -> ObjectT: ...

    async def update(self, obj: ObjectT) -> ObjectT:
        """Write metadata and spec; the status is left as it is."""
        ...

    async def update_status(self, obj: ObjectT) -> ObjectT:
        """Write the status; metadata and spec are left as they are."""
        ...

    async def patch_status(self, kind: type[ObjectT], name: str, patch: StatusPatch,
                           node: str | None = None) -> ObjectT: ...

    async def delete(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        """Delete, or mark for deletion while finalizers remain; returns the last state."""
        ...

    def watch(self, kind: type[ObjectT], from_revision: int,
              node: str | None = None) -> AsyncIterator[WatchEvent[ObjectT]]:
        """Every change at or after ``from_revision``, in order; Compacted/410 when that is gone."""
        ...
