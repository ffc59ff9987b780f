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

from llmgw.api.meta import now
from llmgw.store import keys as K
from llmgw.store.etcd import Etcd
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
        """End the lease now: the keys bound to it go."""
        await self._conn.call(lambda c: c.revoke_lease(lease_id))


class Heartbeats:
    """/llmgw/heartbeat/<node>, bound to a lease: its expiry is how a node's silence shows."""

    def __init__(self, kv: KV, leases: Leases, lease_ids: dict[str, int]):
        self._kv, self._leases = kv, leases
        self._lease_ids = lease_ids       # node -> its heartbeat's lease, shared with the fenced views

    async def beat(self, node: str, ttl: int = 15, info: dict[str, Any] | None = None) -> None:
        """Keep the node's heartbeat alive: refresh its lease, or write it anew on a new one."""
        lease_id = self._lease_ids.get(node)
        if lease_id is not None and await self._leases.refresh(lease_id):
            return
        lease_id = await self._leases.grant(ttl)
        self._lease_ids[node] = lease_id
        value = json.dumps({"node": node, "since": now().isoformat(), **(info or {})}).encode()
        await self._kv.put(K.heartbeat_key(node), value, lease=lease_id)

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
        is ADDED, an expired one DELETED (a refresh of its lease is no event)."""
        return KeyNames(self._kv, K.HEARTBEAT)
