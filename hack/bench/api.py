"""Benchmark: the API server versus llmgw.store directly, and watch fan-out.

    .venv/bin/python hack/bench/api.py [--ops 300] [--concurrency 20] [--watchers 500]

Starts a real etcd, a CA and `llmgw server` (subprocess) on free ports, then measures
creates/s and updates/s of Models directly through llmgw.store and through the server
(mutual TLS, admin certificate), and the time from one write until the last of N
concurrent watchers has seen it. The last line is the ratio server/direct (creates+updates).

Measured on the 2-core shared dev box (etcd, server and benchmark on the same cores):
    direct:  creates 2111/s  updates 1021/s
    server:  creates 485/s  updates 252/s
    watch fan-out: 500 watchers, last saw the write after 3.62 s
    ratio server/direct: 0.24
(each server-side watch is its own etcd watch; a shared per-kind watch cache would cut the fan-out time)
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.api import parse_object  # noqa: E402
from llmgw.dev.etcd import etcd_cluster  # noqa: E402
from llmgw.store import Store  # noqa: E402
from tests.helpers.cluster import make_pki, start_api_server  # noqa: E402


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


async def fanout(server, watchers: int) -> float:
    async with server.client(connections=watchers + 10) as c:
        _, rv = await c.list("models")
        ready, seen = asyncio.Semaphore(0), []
        done = asyncio.Event()

        async def watcher():
            # each watch is ready once its stream answered (a BOOKMARK comes within a second)
            params = {"watch": "1", "resourceVersion": str(rv)}
            url = server.url + "/apis/llmgw.io/v1/models"
            async with c._open().get(url, params=params, timeout=c._watch_timeout) as resp:
                ready.release()
                async for line in resp.content:
                    if b'"ADDED"' in line:
                        seen.append(time.perf_counter())
                        if len(seen) == watchers:
                            done.set()
                        return

        tasks = [asyncio.create_task(watcher()) for _ in range(watchers)]
        for _ in range(watchers):
            await ready.acquire()
        t0 = time.perf_counter()
        await c.create(model("fanout"))
        await asyncio.wait_for(done.wait(), 120)
        for t in tasks:
            t.cancel()
        return max(seen) - t0


async def main(args) -> None:
    base = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    etcd = etcd_cluster(base / "etcd", size=1).start()
    server = start_api_server(make_pki(base / "ca"), etcd.endpoint, base)
    try:
        async with Store(etcd.endpoint) as store:
            d_create, d_update = await run_ops(args.ops, args.concurrency, store.create, store.get, store.update, "direct")
        async with server.client(connections=args.concurrency) as c:
            s_create, s_update = await run_ops(args.ops, args.concurrency, c.create, c.get, c.update, "server")
        print(f"direct:  creates {d_create:.0f}/s  updates {d_update:.0f}/s")
        print(f"server:  creates {s_create:.0f}/s  updates {s_update:.0f}/s")
        latency = await fanout(server, args.watchers)
        print(f"watch fan-out: {args.watchers} watchers, last saw the write after {latency:.2f} s")
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
    asyncio.run(main(p.parse_args()))
