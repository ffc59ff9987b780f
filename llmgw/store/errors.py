"""Errors raised by llmgw.store; callers never see aetcd's or gRPC's own.

Each is a subclass of the API's error contract (llmgw.api.errors), which is
what callers catch: a controller's ``except NotFound`` holds for the store and
the REST client alike.
"""
from __future__ import annotations

from llmgw.api import errors as api


class StoreError(api.StatusError):
    pass


class NotFound(StoreError, api.NotFound):
    pass


class AlreadyExists(StoreError, api.AlreadyExists):
    pass


class Conflict(StoreError, api.Conflict):
    """A compare-and-swap lost: the object changed since it was read. Re-read and retry."""


class NameTaken(StoreError, api.Conflict):
    """A Model would serve a name or alias another Model serves; the message names that Model."""

    reason = "NameTaken"


class FencedOut(StoreError, api.Conflict):
    """This writer no longer holds the leader key it was fenced on."""


class Compacted(StoreError, api.Expired):
    """The watch's start revision was compacted: relist, then watch from the list's revision."""

    def __init__(self, compact_revision: int):
        self.compact_revision = compact_revision
        super().__init__(f"revision compacted; oldest available is {compact_revision}")


class Restored(Compacted):
    """The watch would resume from a revision of another etcd history: etcd's revision is below
    it, or etcd's cluster id changed (etcd restored from a snapshot). Relist, as after a compaction."""

    def __init__(self, why: str):
        self.compact_revision = 0
        api.Expired.__init__(self, why)


class StoreFull(StoreError, api.Unavailable):
    """etcd refuses writes: its space quota is exhausted and its NOSPACE alarm raised. Reads
    still work; writes do again once history is compacted, the members defragmented and the
    alarm disarmed (the controller-manager's compactor does all three; docs/contracts.md)."""

    reason = "StorageFull"


class StoreUnavailable(StoreError, api.Unavailable):
    """etcd did not answer (every endpoint tried), or a watch stream dropped. `misconfigured`:
    etcd answered, but refused this client's TLS (waiting will not help)."""

    misconfigured = False


class StoreMisconfigured(StoreUnavailable):
    misconfigured = True
