"""Benchmark: the API server versus llmgw.store directly, and watch fan-out.

    .venv/bin/python hack/bench/api.py [--ops 300] [--concurrency 20] [--watchers 500] [--writes 5]

Starts a real etcd, a CA and `llmgw server` (subprocess) on free ports, then measures
creates/s and updates/s of Models directly through llmgw.store and through the server
(mutual TLS, admin certificate), and, for each of `--writes` creates made one at a time,
the time from the write until the last of N concurrent watchers has seen it (the first
write is the one the figure below used to measure). The last line is the ratio
server/direct (creates+updates).

Measured on the 2-core shared dev box (etcd, server and benchmark on the same cores; load
average 3-7 from other work, so single figures vary by 2x), before and after the shared
watch cache (llmgw/server/watchcache.py), same benchmark, runs interleaved:
    direct:  creates 1192/s  updates 747/s
    server:  creates 445/s  updates 249/s
    watch fan-out before, one etcd watch per HTTP watch:
        500 watchers, the last saw a write after: first 3.25-3.90 s, median 0.33-0.38 s
        (first version of this benchmark, first write only: 3.62 s, 3.93 s)
    watch fan-out after, one etcd watch per kind, shared and serialized once:
        500 watchers, the last saw a write after: first 0.06-0.15 s (one run 0.54 s), median 0.07-0.15 s
    ratio server/direct: 0.24-0.41 (creates/updates are not what the cache changes)
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from llmgw.api import Model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.api import parse_object
from llmgw.client import Client
from llmgw.dev.apiserver import start_api_server
from llmgw.dev.etcd import etcd_cluster
from llmgw.store import Store


def model(name: str, replicas: int = 1):
    return parse_object({"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name},
                         "spec": {"replicas": replicas, "profiles": [{"engine": "sim"}]}})


async def run_ops(n: int, concurrency: int, create, get, update, prefix: str) -> tuple[float, float]:
    sem = asyncio.Semaphore(concurrency)

    async def one(fn, *a):
        async with sem:
            return await fn(*a)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(create, model(f"{prefix}-{i}")) for i in range(n)))
    t1 = time.perf_counter()

    async def bump(i):
        obj = await get("models", f"{prefix}-{i}")
        obj.spec.replicas += 1
        return await update(obj)
    await asyncio.gather(*(one(bump, i) for i in range(n)))
    t2 = time.perf_counter()
    return n / (t1 - t0), n / (t2 - t1)


async def fanout(server, watchers: int, writes: int) -> list[float]:
    """Per write: seconds from the create until the last of `watchers` open watches has seen it."""
    async with Client(server.url, ca=server.ca, cert=server.admin[0], key=server.admin[1],
                      connections=watchers + 10) as c:
        _, rv = await c.list(Model)
        ready = asyncio.Semaphore(0)
        seen = [0] * writes           # watchers that have seen write k
        last = [0.0] * writes         # when the last of them saw it
        done = [asyncio.Event() for _ in range(writes)]

        async def watcher():
            # each watch is ready once its stream answered (the server has subscribed it by then)
            params = {"watch": "1", "resourceVersion": str(rv)}
            url = server.url + "/apis/llmgw.io/v1/models"
            async with c._open().get(url, params=params, timeout=c._watch_timeout) as resp:
                ready.release()
                k = 0
                async for line in resp.content:
                    if b'"ADDED"' in line:
                        seen[k] += 1
                        if seen[k] == watchers:
                            last[k] = time.perf_counter()
                            done[k].set()
                        k += 1
                        if k == writes:
                            return

        tasks = [asyncio.create_task(watcher()) for _ in range(watchers)]
        for _ in range(watchers):
            await ready.acquire()
        latencies = []
        for k in range(writes):
            t0 = time.perf_counter()
            await c.create(model(f"fanout-{k}"))
            await asyncio.wait_for(done[k].wait(), 120)
            latencies.append(last[k] - t0)
        for t in tasks:
            t.cancel()
        return latencies


async def main(args) -> None:
    base = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    etcd = etcd_cluster(base / "etcd", size=1).start()
    server = start_api_server(base / "ca", etcd.endpoint, base)
    try:
        async with Store(etcd.endpoint) as store:
            d_create, d_update = await run_ops(args.ops, args.concurrency, store.create, store.get, store.update,
                                               "direct")
        async with Client(server.url, ca=server.ca, cert=server.admin[0], key=server.admin[1],
                          connections=args.concurrency) as c:
            s_create, s_update = await run_ops(args.ops, args.concurrency, c.create, c.get, c.update, "server")
        print(f"direct:  creates {d_create:.0f}/s  updates {d_update:.0f}/s")
        print(f"server:  creates {s_create:.0f}/s  updates {s_update:.0f}/s")
        lat = await fanout(server, args.watchers, args.writes)
        print(f"watch fan-out: {args.watchers} watchers, the last saw a write after: first {lat[0]:.2f} s, "
              f"median {statistics.median(lat):.2f} s, worst {max(lat):.2f} s ({len(lat)} writes)")
        ratio = (s_create + s_update) / (d_create + d_update)
        print(f"ratio server/direct: {ratio:.2f}")
    finally:
        server.stop()
        etcd.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--watchers", type=int, default=500)
    p.add_argument("--writes", type=int, default=5, help="writes observed by the watchers, one at a time")
    asyncio.run(main(p.parse_args()))
