"""Group commit: transactions that write, sent while others are in flight, go to etcd as one.

Every write in llmgw is a small transaction with its own compares (a
compare-and-swap, a fence), and under load a process has dozens in flight
at once: the controller-manager's workers, the server's requests. Each one
sent alone costs a gRPC call here and a request, a raft entry and an apply
in etcd, which is most of the CPU either side spends on it. etcd (3.3 and
later) runs a transaction nested in another's success branch with its own
compares, branches and outcome, so a batch is one request whose outer
transaction has no compare and one nested transaction per caller: each
caller's transaction succeeds or fails on its own compares exactly as it
would alone, and they share one revision.

At most ``max_in_flight`` requests are outstanding. A transaction that finds
a free slot goes out at once, alone (no latency is added when idle); the ones
that arrive meanwhile wait for a slot and then go together. etcd refuses a
request that writes one key twice, so a transaction touching a key already
in the batch waits for the next one, and a batch stops at ``max_ops``
transactions (etcd's limit is 128 operations per transaction) or about
``max_bytes``.
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable

from aetcd import rpc

Send = Callable[[rpc.TxnRequest], Awaitable[rpc.TxnResponse]]


@dataclass
class _Pending:
    request: rpc.TxnRequest
    keys: frozenset[bytes] | None      # keys it writes; None: it must go alone
    size: int
    future: asyncio.Future[rpc.TxnResponse]


def _written_keys(request: rpc.TxnRequest) -> frozenset[bytes] | None:
    keys = set()
    for op in (*request.success, *request.failure):
        which = op.WhichOneof("request")
        if which == "request_put":
            keys.add(op.request_put.key)
        elif which == "request_delete_range":
            if op.request_delete_range.range_end:
                return None            # a range: overlaps are not worth working out
            keys.add(op.request_delete_range.key)
        elif which == "request_txn":
            return None
    return frozenset(keys)


class TxnBatcher:
    def __init__(self, send: Send, *, max_in_flight: int = 2, max_ops: int = 64, max_bytes: int = 512 * 1024):
        self._send = send
        self._max_in_flight = max_in_flight
        self._max_ops = max_ops
        self._max_bytes = max_bytes
        self._pending: deque[_Pending] = deque()
        self._in_flight: set[asyncio.Task[None]] = set()
        self.requests = 0               # requests sent to etcd
        self.transactions = 0           # transactions they carried

    async def txn(self, request: rpc.TxnRequest) -> rpc.TxnResponse:
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(request, _written_keys(request), request.ByteSize(), future))
        self._pump()
        return await future

    def _pump(self) -> None:
        while self._pending and len(self._in_flight) < self._max_in_flight:
            batch = self._take()
            if not batch:
                return
            task = asyncio.create_task(self._run(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._pump()

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        keys: set[bytes] = set()
        size = 0
        later: list[_Pending] = []
        while self._pending and len(batch) < self._max_ops:
            item = self._pending.popleft()
            if item.future.done():      # its caller was cancelled before it went out
                continue
            if batch and (item.keys is None or batch[0].keys is None or not item.keys.isdisjoint(keys)
                          or size + item.size > self._max_bytes):
                later.append(item)
                if item.keys is None or batch[0].keys is None:
                    break
                continue
            batch.append(item)
            if item.keys:
                keys |= item.keys
            size += item.size
        self._pending.extendleft(reversed(later))
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        self.requests += 1
        self.transactions += len(batch)
        try:
            if len(batch) == 1:
                responses = [await self._send(batch[0].request)]
            else:
                outer = await self._send(rpc.TxnRequest(
                    success=[rpc.RequestOp(request_txn=item.request) for item in batch]))
                responses = []
                for op in outer.responses:
                    inner = op.response_txn
                    inner.header.CopyFrom(outer.header)    # etcd sets the header on the outer one only
                    responses.append(inner)
        except asyncio.CancelledError:
            for item in batch:
                item.future.cancel()
            raise
        except Exception as err:  # noqa: BLE001 - every caller in the batch gets the error
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(err)
            return
        for item, response in zip(batch, responses, strict=False):
            if not item.future.done():
                item.future.set_result(response)
