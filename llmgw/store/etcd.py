"""The one etcd connection every part of the store shares: transactions, reads, watch streams.

``Etcd`` wraps a ``Connection`` (endpoint failover) with the request shapes
the store uses: a transaction (writes batched by ``TxnBatcher``, and with a
fence, refused once the leader key changed), a range read (now or at a past
revision), the raw watch stream of a key range, and compaction. The objects,
raw keys, leases, events, revocations and compaction (the modules beside this
one) are built on one ``Etcd``; ``Etcd.fenced`` is a view on the same
connection and batcher whose writes carry the fence.

etcd answers a read or a compaction at a revision it no longer holds with gRPC
code OUT_OF_RANGE; it is recognised here by that code and raised as
``Compacted`` (aetcd's watch stream reports it as its own error type).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aetcd.exceptions
import grpc
from aetcd import rpc

from llmgw.store import keys as K
from llmgw.store.batcher import TxnBatcher
from llmgw.store.connection import Connection
from llmgw.store.errors import Compacted, FencedOut, Restored, StoreUnavailable

# aetcd has no type information: what the store reads from its messages, as protocols.


class KeyValue(Protocol):
    """A stored key (etcd's mvccpb.KeyValue)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


class KeyEvent(Protocol):
    """One change from a watch stream (aetcd's rtypes.Event): kind is "PUT" or "DELETE"."""

    kind: str
    kv: KeyValue
    prev_kv: KeyValue | None


# What a compare looks at (compare's `target`), and how (its `result`).
MOD, VERSION, CREATE = rpc.Compare.MOD, rpc.Compare.VERSION, rpc.Compare.CREATE
GREATER = rpc.Compare.GREATER


def as_bytes(s: str | bytes) -> bytes:
    return s.encode() if isinstance(s, str) else s


def compare(key: bytes, target: int, result: int = rpc.Compare.EQUAL, **value: int) -> Any:
    """An rpc.Compare of key's `target` field (rpc.Compare.MOD, VERSION, CREATE) with `value`."""
    return rpc.Compare(key=key, target=target, result=result, **value)


def put_op(key: str | bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=as_bytes(key), value=value, lease=lease))


def get_op(key: str | bytes, range_end: bytes | None = None) -> Any:
    req = rpc.RangeRequest(key=as_bytes(key))
    if range_end is not None:
        req.range_end = range_end
    return rpc.RequestOp(request_range=req)


def delete_op(key: str | bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=as_bytes(key)))


def txn_request(compares: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()) -> Any:
    return rpc.TxnRequest(compare=compares, success=success, failure=failure)


def _out_of_range(err: Exception) -> bool:
    """etcd's answer to a revision it does not hold: compacted, or not yet written."""
    return isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.OUT_OF_RANGE


def lease_not_found(err: Exception) -> bool:
    """etcd's answer to a write bound to a lease it does not hold (expired, revoked, or granted
    after the snapshot etcd was restored from)."""
    return (isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.NOT_FOUND
            and "lease not found" in (err.details() or ""))


@dataclass(frozen=True)
class Fence:
    """Every write of a fenced view requires the leader key's create_revision to be this one."""

    key: bytes
    create_revision: int
    compare: Any      # rpc.Compare on the key's create_revision, built once
    read: Any         # rpc.RequestOp reading the key, to say why a compare failed


class Lineage:
    """The etcd history a watcher's revisions come from: etcd's cluster id when its last watch
    opened (0 before the first). One per reflector, handed to each of its watches (``Etcd.events``)."""

    __slots__ = ("cluster_id",)

    def __init__(self) -> None:
        self.cluster_id = 0


class Etcd:
    def __init__(self, conn: Connection, batcher: TxnBatcher | None, fence: Fence | None = None):
        self.conn = conn
        self.batcher = batcher
        self.fence = fence

    @classmethod
    def open(cls, conn: Connection, *, batch_writes: bool = True) -> Etcd:
        """batch_writes: concurrent writing transactions go to etcd together (llmgw.store.batcher)."""
        etcd = cls(conn, None)
        if batch_writes:
            etcd.batcher = TxnBatcher(etcd.send_txn)
        return etcd

    def fenced(self, leader_key: str, create_revision: int) -> Etcd:
        """A view on the same connection and batcher whose writes require leader_key's create_revision."""
        key = as_bytes(leader_key)
        return Etcd(self.conn, self.batcher, Fence(
            key, create_revision, compare(key, CREATE, create_revision=create_revision), get_op(key)))

    async def txn(self, compares: Sequence[Any], success: Sequence[Any], *, writes: bool = True) -> Any:
        """One transaction (an rpc.TxnResponse); `writes=False` when success holds only reads."""
        compares = list(compares)
        failure = []
        fence = self.fence
        if fence is not None:
            compares.append(fence.compare)
            failure.append(fence.read)
        req = rpc.TxnRequest(compare=compares, success=success, failure=failure)
        batcher = self.batcher
        # Reads stay out of batches: etcd serves a read-only transaction without raft.
        resp = await (batcher.txn(req) if batcher is not None and writes else self.send_txn(req))
        if not resp.succeeded and fence is not None:
            kvs = resp.responses[-1].response_range.kvs
            if not kvs or kvs[0].create_revision != fence.create_revision:
                raise FencedOut(f"lost leadership ({fence.key.decode()} changed); write refused")
        return resp

    async def send_txn(self, req: Any) -> Any:
        """Send an rpc.TxnRequest as it is: no batch, no fence."""
        return await self.conn.call(lambda c: c.kvstub.Txn(req, timeout=c._timeout, metadata=c.metadata))

    async def range(self, key: str | bytes, range_end: bytes | None = None, revision: int = 0,
                    keys_only: bool = False) -> Any:
        """An rpc.RangeResponse: the key (or the range up to range_end), now or at `revision`.

        Compacted when etcd does not hold `revision`: the store reads only revisions it
        has seen, so that means compacted (revision() below tells the two cases apart).
        """
        req = rpc.RangeRequest(key=as_bytes(key), revision=revision, keys_only=keys_only)
        if range_end is not None:
            req.range_end = range_end
        try:
            return await self.conn.call(lambda c: c.kvstub.Range(req, timeout=c._timeout, metadata=c.metadata))
        except grpc.aio.AioRpcError as err:
            if _out_of_range(err):
                raise Compacted(0) from None
            raise

    async def revision(self, since: int | None = None) -> int:
        """etcd's current revision. With `since`, Compacted unless etcd still holds every
        change after it (a watch from since + 1 would start)."""
        probe = K.ROOT + "/~"
        if since is None:
            resp = await self.range(probe)
        else:
            # A read at a past revision fails exactly when a watch from it would.
            try:
                resp = await self.range(probe, revision=since + 1)
            except Compacted:
                # etcd answers a future revision with the same code: nothing is missed then.
                # Asked again once it is no longer in the future, a failure means compacted.
                current = await self.revision()
                if since + 1 > current:
                    return current
                resp = await self.range(probe, revision=since + 1)
        revision: int = resp.header.revision
        return revision

    async def compact(self, revision: int) -> None:
        """Drop history before `revision`; Compacted when it is gone already."""
        req = rpc.CompactionRequest(revision=revision)
        try:
            await self.conn.call(lambda c: c.kvstub.Compact(req, timeout=c._timeout, metadata=c.metadata))
        except grpc.aio.AioRpcError as err:
            if _out_of_range(err):
                raise Compacted(revision) from None
            raise

    async def nospace_alarms(self) -> list[int]:
        """The ids of the members whose NOSPACE alarm is raised (etcd refuses writes while any is)."""
        req = rpc.AlarmRequest(action=rpc.AlarmRequest.GET, memberID=0, alarm=rpc.NONE)
        resp = await self.conn.call(lambda c: c.maintenancestub.Alarm(req, timeout=c._timeout, metadata=c.metadata))
        return [a.memberID for a in resp.alarms if a.alarm == rpc.NOSPACE]

    async def defragment_members(self, timeout: float = 120.0) -> None:
        """Give each member's freed pages back (after a compaction), one member at a time: a
        member answers nothing else while it defragments."""
        for conn in self.conn.each():
            try:
                await conn.call(lambda c: c.maintenancestub.Defragment(
                    rpc.DefragmentRequest(), timeout=timeout, metadata=c.metadata))
            finally:
                await conn.close()

    async def disarm_nospace(self, member: int) -> None:
        req = rpc.AlarmRequest(action=rpc.AlarmRequest.DEACTIVATE, memberID=member, alarm=rpc.NOSPACE)
        await self.conn.call(lambda c: c.maintenancestub.Alarm(req, timeout=c._timeout, metadata=c.metadata))

    async def same_history(self, from_revision: int, lineage: Lineage) -> None:
        """Restored when a watch from `from_revision` would resume on another etcd history than
        the lineage's last watch: etcd's revision is below from_revision - 1 (etcd would wait
        for it, silently, and then deliver another history's changes), or its cluster id
        changed (a cluster restored with a new token, even once its revision has caught up)."""
        header = (await self.range(K.ROOT + "/~")).header
        known, lineage.cluster_id = lineage.cluster_id, header.cluster_id
        if from_revision - 1 > header.revision:
            raise Restored(f"revision {from_revision - 1} is newer than etcd's revision {header.revision} "
                           "(etcd restored from a snapshot?)")
        if known and known != header.cluster_id:
            raise Restored(f"etcd's cluster id changed from {known:x} to {header.cluster_id:x} "
                           "(etcd restored from a snapshot?)")

    async def events(self, start: bytes, end: bytes, from_revision: int, prev_kv: bool = False,
                     lineage: Lineage | None = None, rewrites: bool = True) -> AsyncIterator[KeyEvent]:
        """Every change to keys in [start, end) at or after from_revision, in revision order.

        ``rewrites=False``: a PUT that wrote a key again (its version past 1; a heartbeat re-bound
        to a new lease) is dropped here, as soon as aetcd has given it, unless it is the first
        event of its revision: one a revision tells the watcher how far the watch has come, so
        that a watch that is watched again (after a drop, or silent for its idle timeout) starts
        from there, not from the last key written anew, whence etcd would send all the writes
        since again (or report the revision compacted, and the reflector lists). etcd's own
        filters, NOPUT and NODELETE, cannot tell a key written anew from one written again, and
        a watch that hears nothing has no revision to resume from.

        Compacted when from_revision is no longer held; StoreUnavailable when the stream drops.
        With a lineage, Restored (a Compacted) when from_revision is of another etcd history
        (``same_history``): an etcd restored under a running reflector makes it relist.
        """
        if lineage is not None:
            await self.same_history(from_revision, lineage)
        client = await self.conn.client()
        # Compacting at revision R drops a deletion made at R, yet a watch from R is
        # still allowed and silently misses it. Starting one revision earlier makes
        # etcd report a compacted start whenever from_revision <= R.
        start_revision = max(from_revision - 1, 1)
        try:
            watch = await client.watch(start, range_end=end, start_revision=start_revision, prev_kv=prev_kv)
        except aetcd.exceptions.RevisionCompactedError as err:
            raise Compacted(err.compacted_revision) from None
        except aetcd.exceptions.ClientError as err:
            raise StoreUnavailable(f"watch on {self.conn.endpoint} failed: {err}") from None
        try:
            at = 0   # the revision of the last event given
            async for ev in watch:
                revision = ev.kv.mod_revision
                if revision >= from_revision and (rewrites or ev.kv.version <= 1 or revision != at):
                    at = revision
                    yield ev
        except aetcd.exceptions.RevisionCompactedError as err:
            raise Compacted(err.compacted_revision) from None
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 aetcd/grpc raise many kinds; all mean the stream is gone
            raise StoreUnavailable(f"watch stream from {self.conn.endpoint} dropped: {err}") from None
        finally:
            # aetcd's cancel can block on its request queue when the stream is
            # gone; never let closing a watch hang its caller.
            try:
                await asyncio.wait_for(watch.cancel(), 2.0)
            except (Exception, asyncio.TimeoutError):  # noqa: BLE001 the stream may already be gone
                pass
        raise StoreUnavailable(f"watch stream from {self.conn.endpoint} ended")
