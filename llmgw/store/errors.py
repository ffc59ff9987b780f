"""Errors raised by llmgw.store; callers never see aetcd's or gRPC's own."""
from __future__ import annotations


class StoreError(Exception):
    pass


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    pass


class Conflict(StoreError):
    """A compare-and-swap lost: the object changed since it was read. Re-read and retry."""


class NameTaken(StoreError):
    """A Model would serve a name or alias another Model serves; the message names that Model."""


class FencedOut(StoreError):
    """This writer no longer holds the leader key it was fenced on."""


class Compacted(StoreError):
    """The watch's start revision was compacted: relist, then watch from the list's revision."""

    def __init__(self, compact_revision: int):
        self.compact_revision = compact_revision
        super().__init__(f"revision compacted; oldest available is {compact_revision}")


class StoreUnavailable(StoreError):
    """etcd did not answer (every endpoint tried), or a watch stream dropped."""
