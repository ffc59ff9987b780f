#!/usr/bin/env python3
"""What a fleet's heartbeats cost the controller-manager that watches them.

    .venv/bin/python hack/bench/heartbeats.py --nodes 10000

Starts its own etcd and the real `llmgw controller-manager` on it, and beats --nodes nodes
every --interval s (5, the agent's) with a 15 s key, as the API servers write them
(store.heartbeats.beat: the beats of half a second bound to one new lease in one
transaction, each key that is there re-bound as it is, the others written anew). Nodes are
not registered: what is measured is the controller-manager's watch of the heartbeat keys
(HeartbeatInformer), which every re-binding reaches as a PUT unless it is filtered out.
Once the controller-manager leads and the beats have gone round once, it reads the
controller-manager's and etcd's CPU over --seconds s, and prints last
`heartbeat_watch: nodes=<n> beats_per_s=<> cm_cpu_ms_per_s=<> etcd_cpu_ms_per_s=<> lists=<the
controller-manager's informers' lists, all kinds: 1 each, more after a relist>`.

Issue 43, 2026-12-06 (branch takeover2), on the shared 2-core machine (load 7-16), each line one
run, hack/bench/interleave.py ABBA against the build before (base) at 10,000 nodes, ~2,000 beats/s:
  - the controller-manager idle, no beats (--nodes 0): cm_cpu_ms_per_s=1.5.
  - --informer-idle-timeout 10 (a watch re-opened when silent, as one after a drop is), two rounds:
      base cm_cpu_ms_per_s=20.4, 39.5, 35.4, 28.0   this build 13.0, 12.5, 11.5, 13.0
    The base's watch of the heartbeats heard nothing of the rebindings (dropped one by one above
    the store), so its revision stood at the last key written anew: each re-opened watch had etcd
    send every rebinding since again; after a compaction past it the informer listed again
    (tests/runtime/test_runtime_informer.py: 3 lists in 2 s of beats and compactions, now 1).
  - the default --informer-idle-timeout (120 s), one round:
      base cm_cpu_ms_per_s=15.5, 8.9 (the bench beating only 1,385/s)   this build 11.5, 11.0
    A rebinding now goes no further than Etcd.events (one a transaction reaches the informer):
    ~5 us of the ~9 us each cost is aetcd's (an Event and a KeyValue object, its queue), which
    an etcd filter alone would spare, and etcd has none that tells a key written anew from one
    written again. What is left: ~10 ms a second at 10,000 nodes, 1% of a core.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from controlplane import cpu_seconds, scrape

from llmgw import aio
from llmgw.dev.etcd import etcd_cluster
from llmgw.dev.process import free_port, terminate
from llmgw.store import Store


async def beat_forever(store: Store, names: list[str], interval: float, counts: list[int]) -> None:
    """Each node beats every `interval` s, the nodes spread evenly over it (as agents started at
    random moments are)."""
    async def one(name: str) -> None:
        await asyncio.sleep(random.uniform(0, interval))
        while True:
            t = time.monotonic()
            await store.heartbeats.beat(name, ttl=15)
            counts[0] += 1
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - t)))

    await asyncio.gather(*(one(n) for n in names))


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        etcd = etcd_cluster(Path(tmp), size=1).start()
        store = await Store(etcd.endpoint).connect()
        cm = None
        beats = None
        try:
            counts = [0]
            beats = asyncio.create_task(beat_forever(store, [f"node-{i:05d}" for i in range(args.nodes)],
                                                     args.interval, counts))
            port = free_port()
            cm = subprocess.Popen([sys.executable, "-m", "llmgw.cli.main", "controller-manager", "--etcd",
                                   etcd.endpoint, "--identity", "cm-0", "--metrics-listen", f"127.0.0.1:{port}",
                                   "--informer-idle-timeout", str(args.informer_idle_timeout),
                                   "--log-level", "warning"])
            while await store.election.leader("controller-manager") is None:
                await asyncio.sleep(0.1)
            await asyncio.sleep(args.interval + 2)   # every node has beaten once: its key is there
            pids = {"cm": cm.pid, "etcd": etcd.members[0].proc.pid}
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            n0, t0 = counts[0], time.perf_counter()
            await asyncio.sleep(args.seconds)
            spent = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
            wall = time.perf_counter() - t0
            async with aiohttp.ClientSession() as http:
                lists = (await scrape(http, f"http://127.0.0.1:{port}/metrics"))["lists"]
            print(f"heartbeat_watch: nodes={args.nodes} beats_per_s={(counts[0] - n0) / wall:.0f} "
                  f"cm_cpu_ms_per_s={spent['cm'] * 1000 / wall:.1f} "
                  f"etcd_cpu_ms_per_s={spent['etcd'] * 1000 / wall:.1f} lists={lists:.0f}", flush=True)
        finally:
            if beats is not None:
                beats.cancel()
            if cm is not None:
                terminate(cm, 30)
            await store.close()
            etcd.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between a node's beats")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the CPU is read")
    ap.add_argument("--informer-idle-timeout", type=float, default=120.0,
                    help="the controller-manager's: a watch silent this long is re-opened where it left off")
    aio.run(bench(ap.parse_args()))
