"""What a controller needs from wherever objects live: the ObjectClient protocol.

Two things implement it: ``llmgw.store.Store`` (etcd itself, for the server and
the controller manager) and ``llmgw.client.Client`` (the REST API, for the CLI,
the agent and anything outside the control plane). Code written against the
protocol runs against either (docs/architecture.md, "Objects").

A kind is named by its class (``Node``, ``Model``, ``Replica``, ``Shard``), so
``await client.get(Replica, "r1")`` is typed ``Replica``; a caller that holds
only a name (a URL, a word typed at the CLI) looks the class up first
(``llmgw.api.KINDS``, ``resolve_kind``).
"""
from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol

from llmgw.api.types import ObjectT

EventType = Literal["ADDED", "MODIFIED", "DELETED"]

# A status patch: status fields to replace, by their wire names; "conditions" merge by type.
StatusPatch = Mapping[str, Any]


@dataclass
class WatchEvent(Generic[ObjectT]):
    """One change to one object; on DELETED, ``object`` is its last state."""

    type: EventType
    object: ObjectT
    revision: int


class ObjectClient(Protocol):
    """Read and write objects; every write is a compare-and-swap on resourceVersion.

    Errors are ``llmgw.api.errors``' (each implementation raises subclasses of
    them): NotFound, AlreadyExists, Conflict (a stale resourceVersion, a lost
    leadership), Expired (a compacted revision), Unavailable.
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
