"""Leases, and the heartbeats bound to them: a key that vanishes when its writer goes silent."""
from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc

from llmgw.api.limits import heartbeat_window
from llmgw.api.meta import now
from llmgw.store import keys as K
from llmgw.store.etcd import GREATER, VERSION, Etcd, as_bytes, compare, lease_not_found, put_op, txn_request
from llmgw.store.kv import KV
from llmgw.store.listwatch import AfterErrorPolicy, KeyNames, after_store_error


class _KeepAliveStream:
    """One LeaseKeepAlive stream on one aetcd client. etcd answers a stream's requests in order,
    so each reply goes to the oldest refresh waiting; once the stream fails, every refresh
    waiting on it fails with the error, and the stream is not used again."""

    def __init__(self, client: aetcd.Client):
        self.client = client
        self.broken = False
        self._call = client.leasestub.LeaseKeepAlive(metadata=client.metadata)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._writing = asyncio.Lock()    # one write at a time on a gRPC stream
        self._reader = asyncio.ensure_future(self._read())

    async def refresh(self, lease_id: int) -> Any:
        """The LeaseKeepAliveResponse of `lease_id`; what failed the stream, or a ConnectionTimeoutError
        after the client's timeout (the stream is then given up: a later refresh opens another)."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(answer)
        try:
            async with self._writing:
                await self._call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
            return await asyncio.wait_for(answer, self.client._timeout)
        except asyncio.TimeoutError:
            self.close()
            raise aetcd.exceptions.ConnectionTimeoutError("etcd did not answer a lease keep-alive in time") from None
        except grpc.aio.AioRpcError:   # the write, on a stream that ended
            self.close()
            raise
        finally:
            answer.cancel()   # a refresh that gave up leaves its place in the line (done: no effect)

    async def _read(self) -> None:
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    raise aetcd.exceptions.ConnectionFailedError("etcd ended the lease keep-alive stream")
                answer = self._waiting.popleft()
                if not answer.done():   # a refresh that timed out left its place
                    answer.set_result(reply)
        except (Exception, asyncio.CancelledError) as err:   # handed to every waiting refresh
            self.broken = True
            closed = isinstance(err, asyncio.CancelledError) or (
                isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.CANCELLED)
            failure = aetcd.exceptions.ConnectionFailedError("the lease keep-alive stream was closed") \
                if closed else err
            while self._waiting:
                answer = self._waiting.popleft()
                if not answer.done():
                    answer.set_exception(failure)
            if not isinstance(err, Exception):
                raise

    def close(self) -> None:
        self.broken = True
        self._call.cancel()


class Leases:
    """Leases; every refresh goes over one LeaseKeepAlive stream (aetcd's refresh_lease opens a
    stream per refresh: a stream set up and torn down per heartbeat), opened again on the client
    in use after it fails."""

    def __init__(self, etcd: Etcd):
        self._conn = etcd.conn
        self._stream: _KeepAliveStream | None = None

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        lease = await self._conn.call(lambda c: c.lease(ttl))
        lease_id: int = lease.id
        return lease_id

    async def refresh(self, lease_id: int) -> bool:
        """True while the lease lives; False once it expired."""
        reply = await self._conn.call(lambda c: self._stream_on(c).refresh(lease_id))
        return reply is not None and reply.TTL > 0

    def _stream_on(self, client: aetcd.Client) -> _KeepAliveStream:
        if self._stream is None or self._stream.broken or self._stream.client is not client:
            if self._stream is not None:
                self._stream.close()
            self._stream = _KeepAliveStream(client)
        return self._stream

    async def revoke(self, lease_id: int) -> None:
        """End the lease now: the keys bound to it go. One already gone (expired, revoked) is no error."""
        try:
            await self._conn.call(lambda c: c.revoke_lease(lease_id))
        except aetcd.exceptions.ClientError as err:   # aetcd's for etcd's NOT_FOUND, the gRPC error its cause
            if not (isinstance(err.__cause__, Exception) and lease_not_found(err.__cause__)):
                raise


class _Beat:
    """A node's beat waiting for the next write: what its key holds when written anew, and the
    callers' answer."""

    __slots__ = ("info", "done")

    def __init__(self, info: dict[str, Any] | None, done: asyncio.Future[None]):
        self.info, self.done = info, done


class Heartbeats:
    """/llmgw/heartbeat/<node>, bound to a lease: its expiry is how a node's silence shows.

    A beat is not a keep-alive of a lease of the node's own: the beats that come within one
    window are written together, on one lease granted for them once the last of them came. The
    window is a tenth of the beats' ttl, at least 0.5 s (the period at which etcd looks for
    leases run out) and at most 2 s: 1.5 s for the default 15 s. So a node's key expires `ttl` s
    after its last beat at the earliest and a window later at the latest (a lease of its own
    refreshed at that beat: `ttl` s), and the process sends etcd one lease grant and one
    transaction per window and ttl, whatever the number of nodes, instead of a keep-alive a
    beat: a grant and a transaction cost a server about 2 ms of CPU, which at 0.5 s was a tenth
    of a beat's cost once a fleet spread over three servers (hack/bench/failover.py). The
    transaction holds a nested one per node: if its key is there, bind it to the new
    lease as it is (a put with `ignore_value`), else write it anew (the node, `since` and
    `info`). The old lease runs out, taking the keys of the nodes that did not beat again.
    Each rebinding is a write (a PUT event, history until compaction); the watch of the live
    heartbeats (`lister_watcher`) hears a key written anew and a key gone, and of each
    transaction of rebindings its first key alone (dropped as soon as they come: KeyNames). The first beat
    after a quiet window is written at once; each caller waits for its beat's write."""

    def __init__(self, etcd: Etcd, kv: KV, leases: Leases):
        self._etcd, self._kv, self._leases = etcd, kv, leases
        self._waiting: dict[int, dict[str, _Beat]] = {}     # ttl -> node -> its beat, for the next write
        self._writer: asyncio.Task[None] | None = None
        self._last = float("-inf")                          # when the last write began (loop time)

    async def beat(self, node: str, ttl: int = 15, info: dict[str, Any] | None = None) -> None:
        """Keep the node's heartbeat alive `ttl` s from now: returns once that is written (the
        key bound to a new lease, or written anew with `info` beside the node and `since`)."""
        beats = self._waiting.setdefault(ttl, {})
        waiting = beats.get(node)
        if waiting is None:
            waiting = beats[node] = _Beat(info, asyncio.get_running_loop().create_future())
        elif info is not None:
            waiting.info = info
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all())
        await asyncio.shield(waiting.done)   # one caller cancelled leaves the others' beat

    async def _write_all(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                window = heartbeat_window(min(self._waiting))   # the shortest-lived beats' window
                await asyncio.sleep(max(0.0, self._last + window - loop.time()))
                waiting, self._waiting = self._waiting, {}
                self._last = loop.time()
                await asyncio.gather(*(self._write(ttl, beats) for ttl, beats in waiting.items()))
        finally:
            self._writer = None
            for beats in self._waiting.values():   # cancelled (the process ends): no write comes
                for beat in beats.values():
                    beat.done.cancel()

    async def _write(self, ttl: int, beats: dict[str, _Beat]) -> None:
        try:
            lease_id = await self._leases.grant(ttl)
            since = now().isoformat()
            nested = [rpc.RequestOp(request_txn=txn_request(
                [compare(key, VERSION, GREATER, version=0)],
                [rpc.RequestOp(request_put=rpc.PutRequest(key=key, lease=lease_id, ignore_value=True))],
                [put_op(key, json.dumps({"node": node, "since": since, **(beat.info or {})}).encode(), lease_id)]))
                for node, beat in beats.items() for key in [as_bytes(K.heartbeat_key(node))]]
            await asyncio.gather(*(self._etcd.send_txn(op.request_txn) for op in _nested(_nested(nested))))
        except asyncio.CancelledError:
            for beat in beats.values():
                beat.done.cancel()
            raise
        except Exception as err:  # noqa: BLE001 every beat of the write gets its error
            for beat in beats.values():
                beat.done.set_exception(err)
            return
        for beat in beats.values():
            beat.done.set_result(None)

    async def node_registered(self, node: str) -> bool:
        """Whether the Node exists (its key, not the object: nothing read or decoded but the key)."""
        return await self._kv.exists(K.object_key(K.SPEC, "nodes", node))

    def nodes_lister_watcher(self, after_error: AfterErrorPolicy = after_store_error) -> KeyNames:
        """The registered Nodes' names (their keys' names, no object decoded), as a reflector's
        lister-watcher: what answers whether a heartbeat is of a registered Node."""
        return KeyNames(self._kv, K.kind_prefix(K.SPEC, "nodes"), after_error=after_error)

    async def list(self) -> dict[str, dict[str, Any]]:
        """The nodes with a live heartbeat, and what each wrote in it."""
        items, _ = await self._kv.list(K.HEARTBEAT)
        return {k[len(K.HEARTBEAT):]: json.loads(v) for k, v, _ in items}

    def lister_watcher(self) -> KeyNames:
        """The nodes with a live heartbeat, as a reflector's lister-watcher: a beat written anew
        is ADDED, an expired one DELETED; the beats that bind their keys to a new lease are
        dropped as soon as they come, but for one ADDED (of a node whose key is there) per
        transaction, which moves the watch's revision on (KeyNames)."""
        return KeyNames(self._kv, K.HEARTBEAT, rewrites=False)


# etcd takes at most 128 operations in a transaction (--max-txn-ops), counting those of the
# transactions around a nested one: 63 a level leaves room for two levels and the node's own.
_NESTED = 63


def _nested(ops: list[Any]) -> list[Any]:
    """`ops` (operations of transactions without compares) as such transactions, `_NESTED` each."""
    return [rpc.RequestOp(request_txn=txn_request([], ops[i:i + _NESTED])) for i in range(0, len(ops), _NESTED)]
