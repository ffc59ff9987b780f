#!/usr/bin/env python3
"""The same N concurrent creates and updates through llmgw.store and through raw aetcd.

    .venv/bin/python hack/bench/store.py [--n 2000] [--concurrency 64]

Starts its own etcd on free loopback ports. The raw path does what the store
must do at minimum (a compare-and-swap transaction writing the same JSON), so
the ratio shows what llmgw.store's own work (pydantic validation, serialising,
the spec/status split) costs. Last line: `ratio=<store ops/s / raw ops/s>`.

Measured on the 2-core development machine (otherwise idle), 2026-12-02, n=2000, c=64:
    store: creates 3367/s, updates 2617/s (2945 ops/s)
    raw:   creates 4365/s, updates 5036/s (4676 ops/s)
    ratio=0.63   (0.59-0.73 in runs while other work shared the machine)
The target is 0.8. A store create writes two keys (spec and status) where the
raw path writes one, and an update serialises and validates the object; the
profile shows grpc.aio's per-call cost first and the store's own Python
second. An update at a revision the store has seen (its own writes, reads and
watches) needs no read first.

Issue 23 (the store split by concern), 2026-12-04, n=1000, c=64, runs interleaved
(main, split, split, main, twice) on the shared 2-core machine, load average 2-5:
    main:  creates 71-141/s, updates 2361-6021/s
    split: creates 113-129/s, updates 4195-6320/s (same as main: the spread is the load)
    split + the name scan's prefilter: creates 194-271/s, updates 2722-3487/s
Creates were far below the figure above on both: every Model create read every stored
Model's spec to find a holder of its names that predated /llmgw/names/.

Issue 29 (name reservation its own concern, llmgw/store/names.py; that scan replaced by a
one-off migration the server runs at start), 2026-12-05, runs interleaved (base, names,
twice per size) on the 2-core machine, load average 0.3-0.9:
    n=1000  base: creates 661-700/s,  updates 4455-6674/s;  names: creates 2053-2776/s, updates 5767-7522/s
    n=2000  base: creates 381-398/s,  updates 4886-5817/s;  names: creates 2398-3163/s, updates 4696-5300/s
A create reads only the keys of its own names now: its cost no longer grows with the Models stored.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aetcd
from aetcd import rpc

from llmgw.api import parse_object
from llmgw.dev.etcd import etcd_cluster
from llmgw.store import Conflict, Store


def doc(name: str, replicas: int) -> dict:
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name},
            "spec": {"replicas": replicas, "profiles": [{"engine": "sim"}]}}


async def bounded(n: int, concurrency: int, fn) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i):
        async with sem:
            await fn(i)
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start


async def bench_store(endpoint: str, n: int, c: int) -> tuple[float, float]:
    async with Store(endpoint) as store:
        objs = {}

        async def create(i):
            objs[i] = await store.create(parse_object(doc(f"s{i}", 1)))

        async def update(i):
            m = objs[i]
            m.spec.replicas = 2
            try:
                await store.update(m)
            except Conflict:
                raise SystemExit("unexpected conflict") from None
        return await bounded(n, c, create), await bounded(n, c, update)


async def bench_raw(endpoint: str, n: int, c: int) -> tuple[float, float]:
    host, port = endpoint.removeprefix("http://").split(":")
    client = aetcd.Client(host, int(port))
    await client.connect()
    revs = {}

    def txn(key, value, compare):
        return rpc.TxnRequest(compare=[compare], success=[
            rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))])

    async def create(i):
        key = f"/raw/spec/models/r{i}".encode()
        value = json.dumps(doc(f"r{i}", 1)).encode()
        resp = await client.kvstub.Txn(txn(key, value, rpc.Compare(key=key, target=rpc.Compare.VERSION, version=0)))
        revs[i] = resp.header.revision

    async def update(i):
        key = f"/raw/spec/models/r{i}".encode()
        value = json.dumps(doc(f"r{i}", 2)).encode()
        compare = rpc.Compare(key=key, target=rpc.Compare.MOD, mod_revision=revs[i])
        resp = await client.kvstub.Txn(txn(key, value, compare))
        assert resp.succeeded
    try:
        return await bounded(n, c, create), await bounded(n, c, update)
    finally:
        await client.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = etcd_cluster(Path(tmp), 1).start()
        try:
            raw_c, raw_u = await bench_raw(cluster.endpoint, args.n, args.concurrency)
            st_c, st_u = await bench_store(cluster.endpoint, args.n, args.concurrency)
        finally:
            cluster.stop()
    n = args.n
    raw_rate = 2 * n / (raw_c + raw_u)
    store_rate = 2 * n / (st_c + st_u)
    print(f"store: creates {n / st_c:.0f}/s, updates {n / st_u:.0f}/s ({store_rate:.0f} ops/s)")
    print(f"raw:   creates {n / raw_c:.0f}/s, updates {n / raw_u:.0f}/s ({raw_rate:.0f} ops/s)")
    print(f"ratio={store_rate / raw_rate:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
